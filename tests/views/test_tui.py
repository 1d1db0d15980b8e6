"""The textual app, driven headless with textual's own pilot, over real recorded GPU telemetry."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from rich.style import Style
from textual.widgets import DataTable

from phasescope.live.loop import feed
from phasescope.live.state import LiveState
from phasescope.schema import TickBatch, Trace
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.views import table
from phasescope.views.display import MISSING
from phasescope.views.table import COLUMNS
from phasescope.views.tui import HelpScreen, TopApp, render_table
from tests.live_helpers import TRAINING_RUN, ticks, training_traces

# GPU 1 runs a GEMM benchmark while GPU 0 idles: sorting by utilisation must reorder the rows.
GEMM_ON_GPU1 = "sensorguard-rtx3090/20260825_hpc_gemm_verifier-gpu1_s3_r03/nvml.csv"
SIZE = (220, 20)


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


def _cells(app: TopApp, key: str) -> dict[str, str]:
    table = app.query_one("#table", DataTable)
    values = table.get_row(key)
    return {str(col.key.value): str(v) for col, v in zip(table.ordered_columns, values, strict=True)}


def _keys(app: TopApp) -> list[str]:
    return [str(r.key.value) for r in app.query_one("#table", DataTable).ordered_rows]


async def _until(pilot: object, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def gemm(shared_data: Path) -> list[Trace]:
    return read(shared_data / GEMM_ON_GPU1)


def _busy_state(traces: list[Trace]) -> LiveState:
    """State after the GEMM on GPU 1 has run for a minute."""
    t1 = traces[1]
    upto = int(t1.time.searchsorted(t1.meta["t_from"] + 60))
    state = LiveState("replay")
    for batch in ticks(traces, 0, upto):
        state.ingest(batch)
    return state


def test_replayed_training_run_through_the_real_sampler(shared_data: Path) -> None:
    """Source -> Sampler worker thread -> LiveState -> DataTable, all real; only the speed is raised."""
    traces = training_traces(shared_data)
    source = ReplaySource(traces, speed=50.0, loop=True, path=str(shared_data / TRAINING_RUN))
    state = LiveState(source.name)
    app = TopApp(state, lambda stop: feed(state, source, 0.1, stop), refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: state.ticks >= 5 and len(_keys(app)) == 2)
            assert _keys(app) == [t.device.uuid for t in traces]
            cells = _cells(app, traces[0].device.uuid)
            uuid = traces[0].device.uuid  # this log names no model: the uuid stands in, cut to fit
            assert cells["name"] == f"#0 {traces[0].device.name or uuid[:14] + '…'}"
            # This log has no memory total and no power limit: shown as missing, not as zero.
            assert cells["mem"].endswith(f"/ {MISSING}") and cells["power"].endswith(f"/ {MISSING}")
            assert cells["util"] != MISSING and cells["util"].endswith("%")
            assert "replay" in str(app.query_one("#status").render())
            await pilot.press("q")
            await pilot.pause()
        assert not app.is_running

    _run(go)
    assert app.stop_event.is_set() and source.exhausted  # quitting stopped the sampler and closed the source


def test_sort_filter_help_quit_keys(gemm: list[Trace]) -> None:
    state = _busy_state(gemm)
    idle, busy = (t.device.uuid for t in gemm)
    app = TopApp(state, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            assert _keys(app) == [idle, busy]  # the source's own order
            await pilot.press("s", "s")  # order -> phase -> util
            assert app.sort == "util" and _keys(app) == [busy, idle]
            for _ in range(5):  # util -> mem -> power -> temp -> name -> back to order
                await pilot.press("s")
            assert app.sort == "order" and _keys(app) == [idle, busy]

            await pilot.press("slash", *busy[-6:], "enter")
            assert app.filter_text == busy[-6:] and _keys(app) == [busy]
            await pilot.press("q")  # typed while the filter box is closed again: quits, below
            await pilot.pause()
        assert not app.is_running

    _run(go)


def test_dashboard_url_stays_in_the_header_after_later_notices(gemm: list[Trace]) -> None:
    """The demo's dashboard URL is a header line of its own: notices that follow replace the status line's
    text, never the URL; the sort still shows beside it. The plain table names it in its title."""
    from textual.widgets._header import HeaderTitle

    url = "http://127.0.0.1:9464/"
    state = _busy_state(gemm)
    state.note(f"dashboard: {url}")
    app = TopApp(state, None, refresh_s=0.05, web_url=url)
    plain = TopApp(_busy_state(gemm), None, refresh_s=0.05)

    def header(a: TopApp) -> str:
        return str(a.query_one(HeaderTitle).render())

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            status = app.query_one("#status")
            assert url in header(app) and url in str(status.render())
            state.note("phase/KPI updates stopped: a later notice")
            await _until(pilot, lambda: "a later notice" in str(status.render()))
            assert url not in str(status.render())  # the status line moved on ...
            assert url in header(app) and "sort: order" in header(app)  # ... the header keeps it
            await pilot.press("s")
            await pilot.pause(0.1)
            assert url in header(app) and "sort: phase" in header(app)
        async with plain.run_test(size=SIZE):
            assert "dashboard" not in header(plain) and "sort: order" in header(plain)

    _run(go)
    console = Console(width=300, record=True)
    console.print(render_table(state, web_url=url))  # --plain: every table's title names it
    assert console.export_text().splitlines()[0].strip() == f"phasescope · dashboard {url}"


def test_filter_escape_clears_and_q_in_filter_box_is_text(gemm: list[Trace]) -> None:
    app = TopApp(_busy_state(gemm), None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("slash", "q")
            assert app.is_running and app.filter_text == "q" and _keys(app) == []
            await pilot.press("escape")
            assert app.filter_text == "" and len(_keys(app)) == 2

            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("q")  # any key closes the help, and does nothing else
            assert not isinstance(app.screen, HelpScreen) and app.is_running
            await pilot.press("ctrl+c")
            await pilot.pause()
        assert not app.is_running

    _run(go)


def test_missing_signals_render_as_dash(gemm: list[Trace]) -> None:
    """A log with only some signals (drop the clocks and PCIe from the real trace): those cells say '–'."""
    state = LiveState("replay")
    thin = [t.without("sm_clock", "mem_clock", "pcie_tx", "pcie_rx", "temperature") for t in gemm]
    for batch in ticks(thin, 0, 30):
        state.ingest(batch)
    app = TopApp(state, None)

    async def go() -> None:
        async with app.run_test(size=SIZE):
            cells = _cells(app, gemm[1].device.uuid)
            assert cells["clocks"] == MISSING and cells["pcie"] == MISSING and cells["temp"] == MISSING
            assert cells["util"] != MISSING and "0%" not in (cells["clocks"], cells["pcie"])

    _run(go)


class _FailingSource(ReplaySource):
    """A real replay whose driver starts failing: read() raises, as a broken binding might."""

    def __init__(self, traces: list[Trace], fail_after: int) -> None:
        super().__init__(traces, speed=50.0, loop=True)
        self.calls = 0
        self.fail_after = fail_after

    def read(self) -> TickBatch:
        self.calls += 1
        if self.calls > self.fail_after:
            raise RuntimeError("NVML: Unknown Error")
        return super().read()


def test_a_failing_source_is_a_status_line_not_a_crash(gemm: list[Trace]) -> None:
    source = _FailingSource(gemm, fail_after=3)
    state = LiveState(source.name)
    app = TopApp(state, lambda stop: feed(state, source, 0.1, stop), refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: "sampling stopped" in table.status_line(state))
            await pilot.pause(0.1)
            assert app.is_running and len(_keys(app)) == 2
            assert "NVML: Unknown Error" in str(app.query_one("#status").render())

    _run(go)


def test_plain_table_matches_the_app_rows(gemm: list[Trace]) -> None:
    state = _busy_state(gemm)
    console = Console(width=220, record=True)
    console.print(render_table(state, sort="util"))
    text = console.export_text()
    lines = [ln for ln in text.splitlines() if "#0 " in ln or "#1 " in ln]
    assert len(lines) == 2 and "#1 " in lines[0]  # util-sorted: the GEMM GPU first
    assert f"/ {MISSING}" in lines[0] and "tick" in text


def test_stop_event_is_honoured_by_the_worker(gemm: list[Trace]) -> None:
    source = ReplaySource(gemm, speed=50.0, loop=True)
    state = LiveState(source.name)
    stop = threading.Event()
    worker = threading.Thread(target=feed, args=(state, source, 0.1, stop))
    worker.start()
    deadline = time.monotonic() + 10
    while state.ticks < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    worker.join(5)
    assert not worker.is_alive() and state.ticks >= 3 and source.exhausted


def test_gpu_mode_nvml_errors_and_a_lost_gpu(fake_nvml: Callable[..., object], shared_data: Path) -> None:
    """The real NVML source over the scripted fake NVML (replaying the real training run): a failing PCIe call
    and a GPU that falls off the bus show as '–', NO DATA and a status line; the other GPU keeps updating."""
    from phasescope.sources.nvml import NvmlSource

    traces = training_traces(shared_data)
    fake = fake_nvml(traces, mem_total_bytes=24 * 2**30, power_limit_w=350.0)
    fake.fail("nvmlDeviceGetPcieThroughput", device=0, from_tick=3)  # type: ignore[attr-defined]
    fake.lose(1, from_tick=6)  # type: ignore[attr-defined]
    source = NvmlSource()
    state = LiveState(source.name)
    for _ in range(10):
        state.ingest(source.read(), source.error_counts())
        fake.advance()  # type: ignore[attr-defined]
    source.close()
    gpu0, gpu1 = (d.uuid for d in source.devices())
    app = TopApp(state, None)

    async def go() -> None:
        async with app.run_test(size=SIZE):
            c0, c1 = _cells(app, gpu0), _cells(app, gpu1)
            assert c0["pcie"] == MISSING and c0["util"] != MISSING
            assert c0["mem"].endswith("/ 24.0 GiB") and c0["power"].endswith("/ 350 W")
            assert "NO DATA" in c1["info"] and c1["util"] == MISSING and c1["power"] == MISSING
            status = str(app.query_one("#status").render())
            assert "NO DATA: #1 " in status and "GPU lost: #1 " in status
            assert "failed reads" in status
            assert app.is_running

    _run(go)


# ---- phase, KPIs, idle-but-held, energy: the live classifier and the hooks on real recordings ----

IDLE_HELD_POD = "alibaba-gentd26:673d"  # a Stable Diffusion pod: 17 GiB of weights loaded, no requests
BUSY_POD = "alibaba-gentd26:6dcc"  # serving bursts in the same 45 minutes


def _pods(shared_data: Path) -> list[Trace]:
    traces = read(shared_data / "alibaba-gentd26" / "pod_gpu_duty_cycle_anon.csv")
    return [next(t for t in traces if t.device.uuid.startswith(p)) for p in (IDLE_HELD_POD, BUSY_POD)]


def test_phase_badges_from_the_live_classifier_on_a_real_training_run(shared_data: Path) -> None:
    """GPU 0 trains GPT-2, GPU 1 idles (labels.csv): after two minutes of ticks the badges say so."""
    from phasescope.live.annotate import Annotator
    from phasescope.live.classify import LiveClassifier
    from phasescope.views.palette import PALETTE
    from phasescope.views.tui import styled_cells

    traces = training_traces(shared_data)
    t0 = traces[0]
    upto = int(t0.time.searchsorted(t0.meta["t_from"] + 120))
    state = LiveState("replay")
    annotate = Annotator(LiveClassifier())
    for batch in ticks(traces, 0, upto):
        state.ingest(batch)
        annotate(state)
    train, idle = (t.device.uuid for t in traces)
    app = TopApp(state, None)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            assert _cells(app, train)["phase"].strip().startswith("training ")  # a badge: padded
            assert _cells(app, idle)["phase"].strip().startswith("idle ")
            conf = float(_cells(app, train)["phase"].split()[1].rstrip("%"))
            assert 50 <= conf <= 100
            row = next(r for r in app.shown_rows if r.key == train)
            badge = styled_cells(row)[[c.key for c in COLUMNS].index("phase")]
            assert str(badge.style) == PALETTE["training"].terminal
            # the colours the terminal gets are the palette's, the ones every other view draws
            style = Style.parse(str(badge.style))
            assert style.bgcolor is not None and style.bgcolor.triplet is not None
            assert style.bgcolor.triplet.hex == PALETTE["training"].fill
            idle_row = next(r for r in app.shown_rows if r.key == idle)
            idle_badge = styled_cells(idle_row)[[c.key for c in COLUMNS].index("phase")]
            assert str(idle_badge.style) == PALETTE["idle"].terminal
            await pilot.press("s")  # sort by phase: training before idle
            assert app.sort == "phase" and _keys(app) == [train, idle]
            await pilot.press("slash", *"idle", "enter")  # filter by phase name
            assert _keys(app) == [idle]

    _run(go)
    view = state.phase(train)
    assert view is not None and math.isfinite(view.since) and view.since <= t0.time[upto - 1]


def test_idle_but_held_pod_stands_out(shared_data: Path) -> None:
    """Real production pods at 1/min: the classifier declines (too coarse), so the utilisation rule decides;
    the pod holding 17 GiB at 0% for 45 minutes is flagged, the one serving bursts is not."""
    from phasescope.live.annotate import Annotator
    from phasescope.live.classify import LiveClassifier
    from phasescope.views.palette import HELD_IDLE, PALETTE
    from phasescope.views.table import IDLE_HELD
    from phasescope.views.tui import IDLE_HELD_STYLE, styled_cells

    pods = _pods(shared_data)
    state = LiveState("replay")
    annotate = Annotator(LiveClassifier())
    for batch in ticks(pods, 0, 45):
        state.ingest(batch)
        annotate(state)
    held, busy = (t.device.uuid for t in pods)
    assert state.idle_held() == [held]
    assert state.phase(held) is not None and state.phase(held).phase == "unknown"  # type: ignore[union-attr]
    app = TopApp(state, None)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            assert IDLE_HELD in _cells(app, held)["info"] and IDLE_HELD not in _cells(app, busy)["info"]
            row = next(r for r in app.shown_rows if r.key == held)
            assert str(styled_cells(row)[0].style) == IDLE_HELD_STYLE == PALETTE[HELD_IDLE].terminal
            assert f"{IDLE_HELD}: " in str(app.query_one("#status").render())
            await pilot.press("slash", *"idle-held", "enter")
            assert _keys(app) == [held]

    _run(go)


def test_idle_held_follows_the_classifier_when_it_has_a_phase(shared_data: Path) -> None:
    """On the training run's idle bystander: idle with a process on it is held; training never is."""
    import os

    import psutil

    from phasescope.schema import ProcessSample

    traces = training_traces(shared_data)
    state = LiveState("replay")
    batches = list(ticks(traces, 0, 5))
    me = psutil.Process(os.getpid())
    train, idle = (t.device.uuid for t in traces)
    for b in batches:
        b.processes = [ProcessSample(b.time, me.pid, idle, me.name(), rss=float(me.memory_info().rss))]
        state.ingest(b)
    assert state.idle_held() == []  # no phase yet and under IDLE_TICKS of history: not judged
    state.set_phase(idle, "idle", 0.97, batches[0].time)
    state.set_phase(train, "training", 0.9, batches[0].time)
    assert state.idle_held() == [idle]
    state.set_phase(idle, "inference", 0.8, batches[-1].time)
    assert state.idle_held() == []


@pytest.fixture(scope="module")
def hook_events() -> tuple[Path, dict[str, int]]:
    from tests.hook_events import shared_hook_events

    return shared_hook_events()


def test_hook_kpis_show_per_phase(hook_events: tuple[Path, dict[str, int]],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Real PyTorch runs with the hooks injected: the device row shows step time, samples/s and MFU while
    training, requests/s and p50/p99 while serving; each process's own KPIs go on its sub-row."""
    from phasescope.instrument.events import load_events
    from phasescope.kpi.run_summary import summarize
    from phasescope.live.annotate import HookKpiReader
    from phasescope.schema import ProcessSample
    from phasescope.sources.host import HostSource
    from phasescope.views.table import kpi_text

    events_dir, pids = hook_events
    monkeypatch.setenv("XDG_CACHE_HOME", str(events_dir.parent / "cache"))
    host = HostSource(find_torch=False)
    try:
        batch = host.read()
    finally:
        host.close()
    uuid = batch.devices[0].uuid
    # The hooked runs as the host's processes: the host's KPI side follows their hooks' phases.
    batch.processes = [ProcessSample(batch.time, pid, uuid, cpu_util=0.5) for pid in pids.values()]
    state = LiveState("host")
    state.ingest(batch)
    reader = HookKpiReader(events_dir, window_s=3600)
    assert reader.update(state) and not reader.update(state)  # not due again at once
    doc = summarize(load_events(events_dir))
    by_pid = {p["pid"]: p for p in doc["processes"]}
    training = by_pid[pids["training"]]["training"]
    inference = by_pid[pids["inference"]]["inference"]
    assert reader.process[pids["training"]]["samples_per_s"] == pytest.approx(training["samples_per_s"])
    assert reader.process[pids["inference"]]["latency_p99_s"] == pytest.approx(inference["latency_p99_s"])

    state.set_process_phases({pids["training"]: "training"})
    app = TopApp(state, None)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            cell = _cells(app, uuid)["kpi"]
            assert cell == kpi_text(reader.device[uuid], "training")
            assert cell.startswith("step ") and "samp/s" in cell and "MFU " in cell
            state.set_process_phases({pids["inference"]: "inference"})
            app.redraw()
            await pilot.pause()
            cell = _cells(app, uuid)["kpi"]
            assert "req/s" in cell and "p50 " in cell and "p99 " in cell and "MFU" not in cell

    _run(go)


def test_energy_and_cost_so_far(shared_data: Path) -> None:
    """The live meter integrates power tick by tick; with a price the cell and the status line show cost."""
    from phasescope.kpi.cost import Prices
    from phasescope.kpi.energy import device_energy
    from phasescope.views.display import fmt_usd

    traces = training_traces(shared_data)
    n = 200
    from phasescope.live.loop import TickLoop
    from phasescope.sources.replay_live import ReplaySource

    state = LiveState("replay", prices=Prices(usd_per_gpu_hour=3.6, usd_per_kwh=None))
    loop = TickLoop(ReplaySource(traces), 1.0, state)
    for batch in ticks(traces, 0, n):
        loop.on_tick(batch)
    batch_j = device_energy(traces[0].take(slice(0, n))).joules  # the offline method on the same samples
    live_j = loop.energy.meters[traces[0].device.uuid].joules
    assert live_j == pytest.approx(batch_j, rel=1e-6) and live_j > 0
    span = traces[0].time[n - 1] - traces[0].time[0]
    row = table.rows(state)[0]
    assert row.cells["energy"] == f"{live_j / 3.6e6:.3f} kWh · {fmt_usd(span / 3600 * 3.6)}"
    assert "energy " in table.status_line(state) and "$" in table.status_line(state)


def test_screenshot_is_an_svg_of_the_live_table(shared_data: Path, tmp_path: Path) -> None:
    from benchmarks.screenshot_tui import screenshot

    out = tmp_path / "tui.svg"
    screenshot(shared_data, out, ticks_n=90)
    text = out.read_text()
    assert text.lstrip().startswith("<svg") and "phasescope" in text and "training" in text


def test_prices_per_device_model_from_the_config_file(shared_data: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`top` prices each device by its model name (config file), with a flag over the file."""
    from phasescope.cli import main

    spar = (shared_data / "spar-a100"
            / "gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet")
    cfg = tmp_path / "config.toml"
    cfg.write_text('[prices]\nusd_per_gpu_hour = 1.0\n[prices.gpu."A100"]\nusd_per_gpu_hour = 3600.0\n')
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--config", str(cfg),
                 "--source", f"replay:{spar}?speed=10"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "A100" in ln)
    # $3600/h is $1 per second held: two ticks 10 recorded seconds apart at least cost dollars, not cents.
    cost = float(line.split(" kWh · $")[1].split()[0].replace(",", ""))
    assert cost >= 1.0
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--config", str(cfg),
                 "--price-gpu-hour", "0", "--source", f"replay:{spar}?speed=10"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "A100" in ln)
    assert " kWh · $0.00" in line  # the flag wins over the file's per-model price


# ---- history from the live store on start (`top --store`) ----

HISTORY_ROWS = 300


def write_store(path: Path, traces: list[Trace], lo: int, hi: int, newest: float) -> None:
    """Rows lo..hi-1 of a real recording into a live store through the Store API, as an agent would
    have written them: the recorded spacing kept, the last sample stamped `newest` (Unix s)."""
    from phasescope.store.live import Store

    shift = newest - float(traces[0].time[hi - 1])
    batches = [TickBatch(b.time + shift, b.devices, b.values) for b in ticks(traces, lo, hi)]
    with Store(path) as store:
        store.ingest_many(batches)


def _training_rows(traces: list[Trace]) -> tuple[int, int]:
    """Five minutes ending four minutes into the GPT-2 training on GPU 0 (labels.csv: t_from)."""
    t0 = traces[0]
    hi = int(t0.time.searchsorted(t0.meta["t_from"] + 240))
    return hi - HISTORY_ROWS, hi


def _preloaded(shared_data: Path, tmp_path: Path) -> tuple[list[Trace], LiveState, int, int]:
    from phasescope.live.history import open_history

    traces = training_traces(shared_data)
    lo, hi = _training_rows(traces)
    now = time.time()
    path = tmp_path / "live.sqlite"
    write_store(path, traces, lo, hi, now - 5.0)
    said: list[str] = []
    devices = [t.device for t in traces]
    history = open_history(path, devices, 600.0, False, said.append, now=now)
    assert history is not None and history.writer is None
    assert len(said) == 1
    assert said[0].startswith(f"history: {path}: {HISTORY_ROWS * 2} samples of 2 device(s) ")
    state = LiveState("replay", history.capacity(600.0, 1.0))
    assert state.preload(history.traces, devices) == HISTORY_ROWS * 2
    return traces, state, lo, hi


def test_history_from_the_live_store_is_on_the_first_frame(shared_data: Path, tmp_path: Path) -> None:
    """Before any live sample: sparklines, current values and the row order come from the store."""
    from phasescope.views.display import fmt_ratio, sparkline
    from phasescope.views.table import SPARK_WIDTH

    traces, state, lo, hi = _preloaded(shared_data, tmp_path)
    app = TopApp(state, None)

    async def go() -> None:
        async with app.run_test(size=SIZE):
            assert state.ticks == 0
            assert _keys(app) == [t.device.uuid for t in traces]
            for t in traces:
                cells = _cells(app, t.device.uuid)
                util = t["gpu_util"][lo:hi]
                assert cells["spark_util"] == sparkline(util, SPARK_WIDTH, 0.0, 1.0)
                assert cells["spark_util"].strip()  # drawn, not blank padding
                assert cells["util"] == fmt_ratio(float(util[-1]))
            busy = _cells(app, traces[0].device.uuid)["spark_util"]
            assert busy != _cells(app, traces[1].device.uuid)["spark_util"]  # training vs idle
            assert "waiting for the first sample" in str(app.query_one("#status").render())

    _run(go)


def test_history_gives_the_phase_before_the_first_sample_then_live_ticks_follow(
    shared_data: Path, tmp_path: Path
) -> None:
    """The classifier replays the loaded history (the real model), so the badges say training / idle at
    once; live ticks then join the history after a blank column that marks the restart."""
    from phasescope.live.classify import LiveClassifier
    from phasescope.live.history import backfill_phases

    traces, state, _, _ = _preloaded(shared_data, tmp_path)
    classifier = LiveClassifier()
    backfill_phases(state, classifier)
    train, idle = (t.device.uuid for t in traces)
    view = state.phase(train)
    assert state.ticks == 0 and view is not None and view.phase == "training"
    assert (p := state.phase(idle)) is not None and p.phase == "idle"
    first = float(state.history_times(train)[0])
    assert first < view.since < float(state.history_times(train)[-1])  # began inside the history
    app = TopApp(state, None)

    async def go() -> None:
        async with app.run_test(size=SIZE):
            assert _cells(app, train)["phase"].strip().startswith("training ")
            assert _cells(app, idle)["phase"].strip().startswith("idle ")

    _run(go)
    gap_from = float(state.history_times(train)[-1])
    source = ReplaySource(traces, speed=50.0, loop=True)
    stop = threading.Event()
    feed(state, source, 0.1, stop, duration=0.5)
    times = state.history_times(train)
    util = state.history(train, "gpu_util")
    assert state.ticks >= 2 and len(times) == HISTORY_ROWS + 1 + state.ticks
    assert np.isnan(util[HISTORY_ROWS]) and gap_from < times[HISTORY_ROWS] < times[HISTORY_ROWS + 1]
    assert np.all(np.diff(times) > 0)


def test_a_new_sample_keeps_where_the_user_scrolled(gemm: list[Trace]) -> None:
    """Each redraw cleared the table, and clearing scrolls home: on a narrow terminal → showed the power,
    energy and notes columns for at most one tick, and PgDn through many devices jumped back. A new sample
    now keeps the view where the user put it."""
    from dataclasses import replace

    many = [Trace(replace(gemm[1].device, uuid=f"GPU-copy-{i}", index=i), gemm[1].time, gemm[1].columns,
                  gemm[1].meta) for i in range(30)]
    batches = list(ticks(many, 0, 40))
    state = LiveState("replay")
    for batch in batches[:30]:
        state.ingest(batch)
    app = TopApp(state, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=(60, 14)) as pilot:
            table = app.query_one("#table", DataTable)
            for _ in range(30):
                await pilot.press("right")
            await pilot.press("pagedown", "pagedown")
            await pilot.pause(0.2)
            where = (table.scroll_x, table.scroll_y)
            assert where[0] > 0 and where[1] > 0
            for batch in batches[30:33]:
                state.ingest(batch)
                await pilot.pause(0.2)
            assert app.shown_rows and app._drawn is not None and app._drawn[0] == state.version  # redrawn
            assert (table.scroll_x, table.scroll_y) == where

    _run(go)


def test_plain_table_shows_brackets_in_paths_and_names_as_text(gemm: list[Trace]) -> None:
    """`top --once` over "replay:/logs/run[/]x.csv" died with rich's MarkupError: the status line (the
    table's caption) was read as markup. It is plain text now, as in the app."""
    state = _busy_state(gemm)
    state.note("replaying /logs/odd[/]dir/run[red].csv at 1x")
    console = Console(width=400, record=True)
    console.print(render_table(state, web_url="http://[::1]:9464/"))
    text = console.export_text()
    assert "odd[/]dir/run[red].csv" in text and "http://[::1]:9464/" in text
