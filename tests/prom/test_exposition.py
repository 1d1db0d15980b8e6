"""The fast text writer writes exactly what prometheus_client's generate_latest writes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.prom.exposition import TextWriter
from phasescope.schema import ProcessSample, Trace
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from tests.live_helpers import ticks
from tests.serve.conftest import MIGRATION_RUN, feed, promtool_check
from tests.sources.fake_procfs import build_tree, resolver


class _Frozen:
    """One collect()'s families, replayable: both writers see the very same values."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def test_same_bytes_as_generate_latest_on_a_real_scrape(shared_data: Path, tmp_path: Path) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()))
    uuids = [t.device.uuid for t in traces]
    on_gpus = [(101, uuids[0]), (202, uuids[1])]  # a pod per GPU, from the fake procfs tree
    feed(agent, (replace(b, processes=[ProcessSample(b.time, pid, u) for pid, u in on_gpus])
                 for b in ticks(traces, stop=80)))
    registry = registry_for(agent, host='node "1"\\a\nb', resolver=resolver(build_tree(tmp_path)))
    frozen = _Frozen(list(registry.collect()))
    assert {m.name for m in frozen.families} >= {"phasescope_gpu_pod_info", "phasescope_gpu_process_info"}
    writer = TextWriter()
    first = writer.render(frozen.collect())
    assert first == generate_latest(frozen)  # type: ignore[arg-type]
    assert writer.render(frozen.collect()) == first  # from the label cache
    assert promtool_check(first) == ""


def test_other_family_types_and_odd_labels() -> None:
    g = GaugeMetricFamily("x_ratio", "help with \\ and\nnewline", labels=["a", "b"])
    g.add_metric(['q"uote', "back\\slash"], 0.5)
    g.add_metric(["", "nl\nx"], float("nan"))
    c = CounterMetricFamily("y_bytes", "bytes", labels=["a"], created=1.5)
    c.add_metric(["1"], 3.0, created=2.0)
    g.add_metric(["inf", "x"], float("inf"), timestamp=1700000000.25)  # a sample with its own time (ms)
    g.add_metric(["-inf", "x"], float("-inf"))
    info = InfoMetricFamily("z", "build", value={"version": "1"})
    frozen = _Frozen([g, c, info])
    assert TextWriter().render(frozen.collect()) == generate_latest(frozen)  # type: ignore[arg-type]


def test_label_cache_stays_bounded() -> None:
    from phasescope.prom.exposition import _MAX_CACHED

    g = GaugeMetricFamily("x_ratio", "churning label sets", labels=["pod"])
    for i in range(_MAX_CACHED + 10):
        g.add_metric([f"pod-{i}"], 1.0)
    writer = TextWriter()
    assert writer.render([g]) == generate_latest(_Frozen([g]))  # type: ignore[arg-type]
    assert len(writer._labels) <= _MAX_CACHED


SPAR_A100 = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"
SG_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"


def test_mig_parent_and_profile_in_gpu_info(shared_data: Path, fake_nvml) -> None:
    """One A100 in two MIG instances (scripted NVML, as tests/test_live_mig_cost.py): phasescope_gpu_info
    names each instance's parent GPU and profile, one series per GPU; the other series keep their labels."""
    (spar,) = read(shared_data / SPAR_A100)
    # Real NVML names a MIG instance "<GPU> MIG <profile>"; the recordings replayed are RTX 3090 runs.
    kids = [Trace(replace(t.device, name=f"NVIDIA A100-SXM4-40GB MIG {p}"), t.time, t.columns, t.meta)
            for t, p in zip(read(shared_data / SG_RUN), ("3g.20gb", "4g.20gb"), strict=False)]
    fake = fake_nvml([spar], mig={0: kids}, mem_total_bytes=40e9)
    src = NvmlSource()
    agent = Agent(src, 1.0, classifier=LiveClassifier(PhaseModel.load()))
    batches = []
    for _ in range(5):
        batches.append(src.read())
        fake.advance()
    feed(agent, iter(batches))
    src.close()
    text = TextWriter().render(registry_for(agent, host="n1").collect())
    info = {s.labels["uuid"]: s.labels for f in text_string_to_metric_families(text.decode())
            if f.name == "phasescope_gpu_info" for s in f.samples}
    assert len(info) == 3  # the parent GPU and its two instances
    parent = next(u for u, lab in info.items() if not lab["parent_uuid"])
    assert info[parent]["mig_profile"] == ""
    assert sorted((lab["parent_uuid"], lab["mig_profile"]) for u, lab in info.items() if u != parent) == [
        (parent, "3g.20gb"), (parent, "4g.20gb")]
    # A MIG instance sits on its GPU's PCI address (NVML is asked once, for the board).
    assert {lab["pci_bus_id"] for lab in info.values()} == {"00000000:10:00.0"}
    phase = [s.labels for f in text_string_to_metric_families(text.decode())
             if f.name == "phasescope_gpu_phase" for s in f.samples]
    assert len(phase) == 3 * 5  # 3 rows x 5 phases (incl. unknown), labels unchanged:
    assert all(lab.keys() == {"uuid", "gpu", "model", "host", "phase"} for lab in phase)
    assert promtool_check(text) == ""
