"""Process evidence beside the phase, and a recognised engine scraped unasked: real processes, fake GPU.

A real child runs under vLLM's module path (`python -m vllm.entrypoints.openai.api_server --port P`) and
serves a real vLLM /metrics capture from ../shared/data; the fake NVML (replaying a real trace) lists it on
GPU 0.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from phasescope.live.annotate import Annotator
from phasescope.live.evidence import DeviceEvidence, EvidenceTracker
from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState
from phasescope.sources.host import CombinedSource, HostSource
from phasescope.sources.nvml import NvmlSource
from phasescope.views.table import DISAGREES, rows
from tests.engine_helpers import running_as_vllm
from tests.fakes.fake_nvml import FakeProcess
from tests.live_helpers import training_traces

VLLM_CAPTURE = "formats/vllm-metrics/DataDog__integrations-core__vllm_metrics.txt"


@pytest.fixture
def served_capture(shared_data: Path, tmp_path: Path) -> Path:
    """The fake vLLM serves its folder: /metrics is a real capture."""
    shutil.copy(shared_data / VLLM_CAPTURE, tmp_path / "metrics")
    return tmp_path / "metrics"


@pytest.fixture
def gpu_with_vllm(
    served_capture: Path, tmp_path: Path, fake_nvml: Callable[..., object], shared_data: Path
) -> Iterator[tuple[TickLoop, EvidenceTracker, int]]:
    with running_as_vllm(tmp_path) as (proc, port):
        yield from _watched(proc.pid, port, fake_nvml, shared_data)


Watched = tuple[TickLoop, EvidenceTracker, int]


def _watched(pid: int, port: int, fake_nvml: Callable[..., object], shared_data: Path) -> Iterator[Watched]:
    traces = training_traces(shared_data)[:1]
    fake_nvml(traces, processes={0: [FakeProcess(pid, 2**30, sm_util_pct=50)]})
    source = CombinedSource(NvmlSource(), HostSource(find_torch=False))
    state = LiveState(source.name, 64)
    tracker = EvidenceTracker(auto_scrape=True)
    loop = TickLoop(source, 0.1, state, annotate=Annotator(None, None, evidence=tracker))
    try:
        yield loop, tracker, port
    finally:
        tracker.stop()
        source.close()


def _tick(loop: TickLoop) -> None:
    loop.on_tick(loop.source.read())


def test_the_server_is_named_and_scraped_unasked(gpu_with_vllm: Watched) -> None:
    loop, tracker, port = gpu_with_vllm
    _tick(loop)
    (uuid,) = loop.state.device_uuids()
    assert loop.state.evidence()[uuid] == DeviceEvidence(("vLLM",), "inference", False)  # no phase yet
    assert [r.url for r in tracker.scrapes.values()] == [f"http://127.0.0.1:{port}/metrics"]
    deadline = time.monotonic() + 20
    while not loop.state.device_kpis().get(uuid) and time.monotonic() < deadline:
        time.sleep(0.2)
        _tick(loop)
    kpis = loop.state.device_kpis()[uuid]
    assert kpis.get("latency_p50_s", 0) > 0  # from the capture's e2e latency histogram
    snapshot = next(d for d in loop.state.snapshot().devices if d.info.uuid == uuid)
    assert snapshot.evidence is not None and snapshot.evidence.engines == ("vLLM",)


def test_a_training_phase_on_a_serving_gpu_is_marked(gpu_with_vllm: Watched) -> None:
    loop, _, _ = gpu_with_vllm
    _tick(loop)
    (uuid,) = loop.state.device_uuids()
    loop.state.set_phase(uuid, "training", 0.9, time.time())
    _tick(loop)
    assert loop.state.evidence()[uuid].disagrees
    row = next(r for r in rows(loop.state.snapshot()) if r.key == uuid)
    assert row.cells["info"].startswith(f"{DISAGREES} vLLM (inference)")
    loop.state.set_phase(uuid, "idle", 0.9, time.time())  # a server may sit idle: no contradiction
    _tick(loop)
    assert not loop.state.evidence()[uuid].disagrees


def test_no_auto_scrape_and_foreign_processes(gpu_with_vllm: Watched) -> None:
    loop, tracker, _ = gpu_with_vllm
    tracker.auto_scrape = False
    _tick(loop)
    assert tracker.scrapes == {} and loop.state.evidence()
    loop.state.set_local_processes(False)  # PIDs from elsewhere (a replay): they name no process here
    _tick(loop)
    assert loop.state.evidence() == {}


def test_metrics_carry_the_disagreement_and_the_engine(shared_data: Path) -> None:
    """`phasescope_gpu_phase_disagreement` and `phasescope_gpu_engine_info` from the state's evidence; a
    device whose processes were not read has neither (absent, not 0)."""
    from prometheus_client import generate_latest

    from phasescope.serve.agent import Agent
    from phasescope.serve.collector import registry_for
    from phasescope.sources.replay_live import ReplaySource
    from tests.live_helpers import TRAINING_RUN

    agent = Agent(ReplaySource.from_path(shared_data / TRAINING_RUN, speed=100), 0.1)
    try:
        agent.loop.on_tick(agent.source.read())
        first, second = agent.state.device_uuids()[:2]
        agent.state.set_evidence({first: DeviceEvidence(("vLLM",), "inference", True)})
        text = generate_latest(registry_for(agent)).decode()
    finally:
        agent.source.close()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    dis = {s.labels["uuid"]: s.value for s in samples if s.name == "phasescope_gpu_phase_disagreement"}
    assert dis == {first: 1.0}
    info = [s.labels for s in samples if s.name == "phasescope_gpu_engine_info"]
    assert [(i["uuid"], i["engine"], i["role"]) for i in info] == [(first, "vLLM", "inference")]
    assert second not in dis


def test_a_tgi_launcher_is_scraped_as_tgi(
    shared_data: Path, tmp_path: Path, fake_nvml: Callable[..., object]
) -> None:
    """Text Generation Inference, known by its launcher's name, serving a real TGI /metrics capture."""
    from tests.engine_helpers import running_as_launcher

    capture = next((shared_data / "formats" / "tgi-metrics").glob("*.txt"))
    shutil.copy(capture, tmp_path / "metrics")
    with running_as_launcher(tmp_path, "text-generation-launcher") as (proc, port):
        for loop, tracker, _ in _watched(proc.pid, port, fake_nvml, shared_data):
            _tick(loop)
            (uuid,) = loop.state.device_uuids()
            assert loop.state.evidence()[uuid].engines == ("TGI",)
            (reader,) = tracker.scrapes.values()
            deadline = time.monotonic() + 20
            while not reader.engine and time.monotonic() < deadline:
                time.sleep(0.1)
            assert reader.engine == "tgi" and reader.url == f"http://127.0.0.1:{port}/metrics"
