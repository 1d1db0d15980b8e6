"""The textual app, driven headless with textual's own pilot, over real recorded GPU telemetry."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import DataTable

from phasescope.display import MISSING
from phasescope.live_state import LiveState, feed
from phasescope.schema import Trace
from phasescope.sources.base import TickBatch
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.tui import HelpScreen, TopApp, render_table
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
            assert cells["name"] == f"#0 {traces[0].device.name or traces[0].device.uuid}"
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
            await pilot.press("s")
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
            await _until(pilot, lambda: "sampling stopped" in state.status_line())
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
