"""`phasescope_gpu_info` for a device listed as its own parent (a damaged source): a whole GPU, empty
parent_uuid, as `kpi.cost.mig_shares` prices it; the series stays promtool-clean, one per GPU."""

from __future__ import annotations

import numpy as np
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.schema import DeviceInfo, Trace
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.replay_live import ReplaySource
from tests.live_helpers import ticks
from tests.serve.conftest import feed, promtool_check

A100 = "NVIDIA A100-SXM4-80GB"


def test_own_parent_exports_no_parent() -> None:
    t = np.arange(20.0)
    devs = [DeviceInfo("GPU-a", A100, 0), DeviceInfo("MIG-1", f"{A100} MIG 3g.40gb", 0, parent_uuid="GPU-a"),
            DeviceInfo("GPU-c", A100, 2, parent_uuid="GPU-c")]
    traces = [Trace(d, t, {"power": np.full(t.size, 100.0), "gpu_util": np.full(t.size, 0.5)}) for d in devs]
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()))
    registry = registry_for(agent, host="n1")
    feed(agent, ticks(traces, stop=10))
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    info = {s.labels["uuid"]: (s.labels["parent_uuid"], s.labels["mig_profile"])
            for fam in text_string_to_metric_families(text.decode()) if fam.name == "phasescope_gpu_info"
            for s in fam.samples}
    assert info == {"GPU-a": ("", ""), "MIG-1": ("GPU-a", "3g.40gb"), "GPU-c": ("", "")}
