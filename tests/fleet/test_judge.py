"""Per-GPU verdicts on real traces, and the held-idle rule."""

from __future__ import annotations

import pytest

from phasescope.classify.model import PhaseModel
from phasescope.fleet.judge import HELD_IDLE, judge
from phasescope.fleet.summary import counts, summary
from phasescope.kpi.cost import Prices
from phasescope.schema import DeviceInfo, Trace


def test_real_traces_get_their_labels(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    for label, trace in fleet_traces.items():
        v = judge(trace, model)
        assert v.label == label, (label, v.seconds)
        assert v.segments and abs(sum(v.probabilities.values()) - 1) < 1e-6
        assert v.missing_signals == trace.missing_signals()
    # A GPU scraped without PCIe counters says so in its verdict.
    v = judge(fleet_traces["training"].without("pcie_tx", "pcie_rx"), model)
    assert v.missing_signals == ["pcie_tx", "pcie_rx"] and v.to_dict()["missing_signals"] == v.missing_signals


def test_idle_with_memory_held_or_a_pod_is_held_idle(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    idle = fleet_traces["idle"]  # a real idle bystander: ~450 MiB of driver context
    assert judge(idle, model).label == "idle"
    held = judge(idle, model, Prices(usd_per_gpu_hour=3.0), held_mem_bytes=256 * 1024**2)
    assert held.label == HELD_IDLE and held.held_idle
    hours = held.seconds[HELD_IDLE] / 3600
    assert hours == pytest.approx(idle.duration() / 3600, rel=0.05)
    assert held.held_idle_cost.time_usd == pytest.approx(hours * 3.0)
    d = idle.device
    in_pod = Trace(
        DeviceInfo(d.uuid, d.name, d.index, d.host, extra={"pod": "nb-1", "namespace": "lab"}),
        idle.time,
        idle.columns,
    )
    assert judge(in_pod, model).label == HELD_IDLE


def test_counts_by_host_and_namespace(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    vs = [judge(t, model) for t in fleet_traces.values()]
    assert counts(vs)["fleet"]["training"] == 1 and counts(vs)["fleet"]["inference"] == 1
    assert counts(vs, "host")["node-idle"]["idle"] == 1
    assert counts(vs, "namespace") == {}  # no device carries the label
    s = summary(vs)
    assert s["gpus"] == 3 and s["waste"]["held_idle_gpu_hours"] == 0 and s["waste"]["held_idle_usd"] is None
