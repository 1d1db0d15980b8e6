"""Hook KPIs followed live from a real events directory, and the annotate hook in the sampler thread."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np
import pytest

from phasescope.instrument.events import load_events
from phasescope.live.annotate import Annotator, HookKpiReader, ScrapeKpiReader
from phasescope.live.loop import feed
from phasescope.live.state import LiveState
from phasescope.sources.replay_live import ReplaySource
from phasescope.views import table
from tests.hook_events import shared_hook_events
from tests.http_helpers import serving
from tests.live.test_classify import T0, _Confident
from tests.live_helpers import training_traces


@pytest.fixture(scope="module")
def events() -> tuple[Path, dict[str, int]]:
    return shared_hook_events()


def _last_wall(events_dir: Path) -> float:
    return max(float(pe.rows[:, 1].max()) + pe.wall_offset for pe in load_events(events_dir))


def test_window_keeps_only_recent_events(events: tuple[Path, dict[str, int]], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    events_dir, pids = events
    monkeypatch.setenv("XDG_CACHE_HOME", str(events_dir.parent / "cache"))
    end = _last_wall(events_dir)
    recent = HookKpiReader(events_dir, window_s=3600, clock=lambda: end + 10)
    recent.update()
    assert set(recent.process) == set(pids.values())
    stale = HookKpiReader(events_dir, window_s=5, clock=lambda: end + 10)  # everything is 10 s old
    stale.update()
    assert stale.process == {} and stale.device == {}


def test_each_process_gets_the_phase_its_hooks_saw(events: tuple[Path, dict[str, int]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from phasescope.live.annotate import HOOK_PHASE_RECENT_S

    events_dir, pids = events
    monkeypatch.setenv("XDG_CACHE_HOME", str(events_dir.parent / "cache"))
    ends = {pe.pid: float(pe.rows[:, 1].max()) + pe.wall_offset for pe in load_events(events_dir)}
    # Just after each run's last event: the phase it was in (an MLP training, batches served).
    for role, pid in pids.items():
        reader = HookKpiReader(events_dir, window_s=3600, clock=lambda pid=pid: ends[pid] + 1)
        state = LiveState("test")
        reader.update(state)
        assert reader.phases[pid] == role
        assert state.process_phases()[pid] == role
    # Long after: the hooks saw no work lately, so the process is idle, not still training.
    late = max(ends.values()) + HOOK_PHASE_RECENT_S + 5
    later = HookKpiReader(events_dir, window_s=3600, clock=lambda: late)
    later.update()
    assert later.phases == {pid: "idle" for pid in pids.values()}


def test_a_process_stays_idle_after_its_events_leave_the_window(events: tuple[Path, dict[str, int]],
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default-like short window, a hooked process whose work ended reads idle (not vanishes) for
    as long as its meta file is there; it goes only when that does."""
    import shutil

    from phasescope.live.annotate import HOOK_PHASE_RECENT_S

    events_dir, pids = events
    monkeypatch.setenv("XDG_CACHE_HOME", str(events_dir.parent / "cache"))
    work = tmp_path / "events"
    shutil.copytree(events_dir, work)
    ends = {pe.pid: float(pe.rows[:, 1].max()) + pe.wall_offset for pe in load_events(work)}
    now = [0.0]
    reader = HookKpiReader(work, window_s=5, every_s=0.0, clock=lambda: now[0])
    for role, pid in sorted(pids.items(), key=lambda kv: ends[kv[1]]):  # just after each run's last work
        now[0] = ends[pid] + 1
        reader.update()
        assert reader.phases[pid] == role
    now[0] = max(ends.values()) + HOOK_PHASE_RECENT_S + 60  # every event is far outside the 5 s window
    state = LiveState("test")
    reader.update(state)
    assert reader.process == {}  # no KPIs from work that left the window...
    idle = {pid: "idle" for pid in pids.values()}
    assert reader.phases == idle and state.process_phases() == idle  # ...but idle, not gone
    (work / f"meta-{pids['training']}.json").unlink()  # its run is gone: so is its phase
    now[0] += 1
    reader.update()
    assert reader.phases == {pids["inference"]: "idle"}


def test_chunks_are_read_once_and_junk_is_skipped(events: tuple[Path, dict[str, int]], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    events_dir, pids = events
    monkeypatch.setenv("XDG_CACHE_HOME", str(events_dir.parent / "cache"))
    work = tmp_path / "events"
    shutil.copytree(events_dir, work)
    now = [_last_wall(work) + 1]
    (work / "meta-999999.json").write_text("{not json")  # half-written by a dying process
    (work / "meta-999998.json").write_text(json.dumps({"format": "something else", "pid": 999998}))
    reader = HookKpiReader(work, window_s=3600, every_s=0.0, clock=lambda: now[0])
    reader.update()
    first = dict(reader.process)
    assert set(first) == set(pids.values())
    loaded = {pid: set(p.chunks) for pid, p in reader._procs.items()}
    # A chunk read once is not read again: remove the files, the KPIs stay (from the kept window).
    for f in work.glob("events-*.npz"):
        f.unlink()
    now[0] += 1
    reader.update()
    assert reader.process.keys() == first.keys()
    assert {pid: set(p.chunks) for pid, p in reader._procs.items()} == loaded
    assert HookKpiReader(tmp_path / "not-yet", every_s=0.0).update() is True  # no dir yet: nothing, no error


def test_annotate_runs_in_the_sampler_thread_and_a_failure_is_said_once(shared_data: Path) -> None:
    traces = training_traces(shared_data)
    source = ReplaySource(traces, speed=50.0, loop=True)
    state = LiveState(source.name)
    calls: list[str] = []

    def annotate(s: LiveState) -> None:
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise RuntimeError("model file vanished")

    stop = threading.Event()
    worker = threading.Thread(target=feed, args=(state, source, 0.1, stop),
                              kwargs={"annotate": annotate}, name="sampler")
    worker.start()
    deadline = time.monotonic() + 10
    while state.ticks < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    worker.join(5)
    assert state.ticks >= 8 and len(calls) == 3 and set(calls) == {"sampler"}
    assert "phase/KPI updates stopped: RuntimeError: model file vanished" in " ".join(state.events())


def test_annotator_copies_the_classifier_reading(shared_data: Path) -> None:
    from phasescope.live.classify import LiveClassifier
    from tests.live_helpers import ticks

    traces = training_traces(shared_data)
    state = LiveState("replay")
    clf = LiveClassifier()
    annotate = Annotator(clf)
    for batch in ticks(traces, 0, 90):
        state.ingest(batch)
        annotate(state)
    for t in traces:
        r = clf.reading(t.device.uuid)
        view = state.phase(t.device.uuid)
        assert r is not None and view is not None
        assert (view.phase, view.since) == (r.phase, r.since)
        assert view.confidence == r.confidence or (np.isnan(view.confidence) and np.isnan(r.confidence))


def test_a_held_phase_keeps_its_last_confidence_and_says_held() -> None:
    """A window the model does not judge keeps the phase (no flicker to unknown: the decoder bridges it)
    with the confidence of the last judged window, marked as held on the badge and in the API; the next
    judged window clears the mark."""
    from phasescope.live.classify import LiveClassifier
    from phasescope.schema import SIGNAL_NAMES, DeviceInfo, TickBatch
    from phasescope.views.table import HELD_MARK

    script = [("training", 0.87), ("unknown", 0.0), ("unknown", 0.0), ("training", 0.6)]
    model = _Confident(list(script))
    clf = LiveClassifier(model, every_s=1.0)  # type: ignore[arg-type]
    annotate = Annotator(clf)
    dev = DeviceInfo("GPU-x", "NVIDIA GeForce RTX 3090", 0)
    state = LiveState("scripted")
    row = np.full((1, len(SIGNAL_NAMES)), np.nan)
    row[0, 0] = 0.9
    # Window k is judged at the tick it completes: 30 points at 1 s from T0 + 15 k.
    ends = [T0 + k * model.config.stride_s + model.config.window_s - 1.0 for k in range(len(script))]
    cells, api = [], []
    for k in range(int(ends[-1] - T0) + 1):
        state.ingest(TickBatch(T0 + k, [dev], row))
        annotate(state)
        if T0 + k in ends:
            cells.append(next(r for r in table.rows(state) if r.key == dev.uuid).cells["phase"])
            api.append(clf.reading(dev.uuid).to_dict())  # type: ignore[union-attr]
    held = f"training 87%{HELD_MARK}"
    assert cells == ["training 87%", held, held, "training 60%"]
    assert [a["held"] for a in api] == [False, True, True, False]
    assert api[1]["confidence"] == pytest.approx(0.87) and api[1]["proba"] == api[0]["proba"]
    assert api[2]["since"] == api[0]["since"] <= ends[0]


def test_a_dark_device_goes_unknown_without_a_held_mark(shared_data: Path) -> None:
    """Held is for a live device the model could not judge; one that stops sending is unknown, no %."""
    from phasescope.live.classify import LiveClassifier
    from phasescope.schema import TickBatch
    from tests.live_helpers import ticks

    traces = training_traces(shared_data)
    state = LiveState("replay")
    clf = LiveClassifier()
    annotate = Annotator(clf)
    batches = list(ticks(traces, 0, 170))  # 80 s without GPU 0: longer than the classifier's window
    for batch in batches[:90]:
        state.ingest(batch)
        annotate(state)
    gone = traces[0].device.uuid
    assert (v := state.phase(gone)) is not None and v.phase != "unknown" and not v.held
    for batch in batches[90:]:
        state.ingest(TickBatch(batch.time, [batch.devices[1]], batch.values[1:2]))
        annotate(state)
    view = state.phase(gone)
    assert view is not None and view.phase == "unknown" and not view.held
    assert next(r for r in table.rows(state) if r.key == gone).cells["phase"] == "unknown"


# ---- a serving engine's /metrics (real captures, served over loopback) ----

VLLM = "formats/vllm-metrics/DataDog__integrations-core__vllm_metrics.txt"


@pytest.fixture
def metrics_url(shared_data: Path) -> Iterator[str]:
    """A loopback HTTP server answering every GET with the real vLLM capture."""
    body = (shared_data / VLLM).read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield f"{url}/metrics"


def test_scraped_vllm_latency_on_the_named_gpu(shared_data: Path, metrics_url: str) -> None:
    from phasescope.sources.scrape import read_file, server_kpis
    from phasescope.views.table import kpi_text
    from tests.live_helpers import ticks

    expect = server_kpis(read_file(shared_data / VLLM))[0]["latency_s"]
    traces = training_traces(shared_data)
    state = LiveState("replay")
    for batch in ticks(traces, 0, 3):
        state.ingest(batch)
    scraper = ScrapeKpiReader(metrics_url, device="1")
    scraper.poll_once()  # one scrape: latency since the server started, no rate yet
    assert scraper.engine == "vllm" and "requests_per_s" not in scraper.kpis
    Annotator(None, None, [scraper])(state)
    gpu1 = traces[1].device.uuid
    state.set_phase(gpu1, "inference", 0.9, 0.0)
    row = {r.key: r for r in table.rows(state)}[gpu1]
    assert row.cells["kpi"] == kpi_text({"latency_p50_s": expect["p50"], "latency_p99_s": expect["p99"]},
                                        "inference")
    assert row.cells["kpi"].startswith("p50 ")
    assert {r.key: r for r in table.rows(state)}[traces[0].device.uuid].cells["kpi"] == "–"  # not its server
    scraper.poll_once()  # a second scrape: a window with a rate (nothing new was served in it: 0 req/s)
    assert scraper.kpis["requests_per_s"] == 0.0


def test_a_dead_metrics_url_is_one_note(shared_data: Path) -> None:
    from tests.live_helpers import ticks

    traces = training_traces(shared_data)
    state = LiveState("replay")
    for batch in ticks(traces, 0, 2):
        state.ingest(batch)
    scraper = ScrapeKpiReader("http://127.0.0.1:9/metrics", device="0", timeout=0.5)  # discard port
    annotate = Annotator(None, None, [scraper])
    for _ in range(3):
        scraper.poll_once()
        annotate(state)
    notes = [e for e in state.events() if "--scrape" in e]
    assert len(notes) == 1 and "127.0.0.1:9" in notes[0] and scraper.failures == 3


def test_a_server_that_stops_answering_shows_no_kpis_not_its_last_ones(shared_data: Path) -> None:
    from phasescope.errors import SourceError
    from phasescope.sources.scrape import read_file
    from tests.live_helpers import ticks

    traces = training_traces(shared_data)
    state = LiveState("replay")
    for batch in ticks(traces, 0, 2):
        state.ingest(batch)
    answers: list[object] = [read_file(shared_data / VLLM), SourceError("http://gpu1/metrics: down")]

    def fetch(url: str, timeout: float) -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    scraper = ScrapeKpiReader("http://gpu1/metrics", device="1", fetch=fetch)
    annotate = Annotator(None, None, [scraper])
    gpu1 = traces[1].device.uuid
    scraper.poll_once()
    annotate(state)
    assert {r.key: r for r in table.rows(state)}[gpu1].cells["kpi"].startswith("p50 ")
    scraper.poll_once()  # the server is gone: its latency is no longer current
    annotate(state)
    assert scraper.kpis == {} and {r.key: r for r in table.rows(state)}[gpu1].cells["kpi"] == "–"
    assert any("down" in e for e in state.events())


@pytest.mark.parametrize("n_devices", [1, 2])
def test_a_scrape_for_a_device_not_here_says_so(shared_data: Path, metrics_url: str, n_devices: int) -> None:
    from tests.live_helpers import ticks

    traces = training_traces(shared_data)[:n_devices]
    state = LiveState("replay")
    for batch in ticks(traces, 0, 2):
        state.ingest(batch)
    scraper = ScrapeKpiReader(metrics_url, device="5")
    scraper.poll_once()
    Annotator(None, None, [scraper])(state)
    notes = [e for e in state.events() if "--scrape" in e]
    assert len(notes) == 1 and "@5: no such device here" in notes[0], notes


def test_top_once_with_a_scrape(shared_data: Path, metrics_url: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from phasescope.cli import main
    from tests.live_helpers import TRAINING_RUN

    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--source", spec,
                 "--scrape", f"{metrics_url}@1"]) == 0
    out = capsys.readouterr().out
    gpu1 = [ln for ln in out.splitlines() if "│ #1 " in ln]
    assert gpu1 and "p50 " in gpu1[-1] and "p99 " in gpu1[-1]


def test_consume_deletes_what_it_has_read(events: tuple[Path, dict[str, int]], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's own events directory must not grow for as long as the demo runs."""
    import shutil

    events_dir, pids = events
    monkeypatch.setenv("XDG_CACHE_HOME", str(events_dir.parent / "cache"))
    work = tmp_path / "events"
    shutil.copytree(events_dir, work)
    end = _last_wall(work)
    reader = HookKpiReader(work, window_s=3600, clock=lambda: end + 1, consume=True)
    reader.update()
    assert set(reader.process) == set(pids.values()) and not list(work.glob("events-*.npz"))
    assert list(work.glob("meta-*.json"))  # the small per-process metadata stays


def test_version1_chunks_give_the_same_live_kpis(events: tuple[Path, dict[str, int]], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs written before event format 2 (seven columns, two rows per forward) still show in the live
    views, with the same KPIs as today's rows: FORMATS.md promises version 1 is read."""
    import shutil

    from phasescope.instrument import events as ev
    from tests.hook_events import as_version1

    events_dir, pids = events
    monkeypatch.setenv("XDG_CACHE_HOME", str(events_dir.parent / "cache"))
    old = tmp_path / "v1"
    shutil.copytree(events_dir, old)
    for chunk in old.glob("events-*.npz"):
        with np.load(chunk, allow_pickle=False) as z:
            rows, anchor = z["rows"], z["anchor"]
        with chunk.open("wb") as fh:
            np.savez(fh, rows=as_version1(rows), anchor=anchor)
        assert ev.read_rows(chunk).shape[1] == ev.ROW
    now = _last_wall(events_dir) + 1
    new_reader = HookKpiReader(events_dir, window_s=3600, every_s=0.0, clock=lambda: now)
    old_reader = HookKpiReader(old, window_s=3600, every_s=0.0, clock=lambda: now)
    new_reader.update()
    old_reader.update()
    assert set(old_reader.process) == set(pids.values())
    assert old_reader.process == new_reader.process
