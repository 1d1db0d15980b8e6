"""Per-GPU verdicts on real traces, and the held-idle rule."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from phasescope.classify.model import PhaseModel
from phasescope.fleet.judge import HELD_IDLE, judge
from phasescope.fleet.summary import counts, summary
from phasescope.kpi.cost import Prices
from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay import read


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


def test_held_flag_is_true_false_or_not_told(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    """`held` as `classify --json` says it: the bystander's ~0.45 GiB driver context is not held, 2 GiB more
    is, a pod holds it whatever its memory, and without a memory series (and no pod) it cannot be told."""
    from phasescope.fleet.summary import render

    idle = fleet_traces["idle"]
    free = judge(idle, model)
    assert free.label == "idle" and free.held is False and not free.held_idle
    assert [s["held"] for s in free.to_dict()["segments"] if s["label"] == "idle"] == [False]
    loaded = judge(idle.with_columns(mem_used=idle["mem_used"] + 2 * 1024**3), model)
    assert loaded.label == HELD_IDLE and loaded.held is True and loaded.held_idle
    d = loaded.to_dict()
    assert d["held"] is True and [s["held"] for s in d["segments"]] == [True]
    blind = judge(idle.without("mem_used"), model)
    assert blind.label == "idle" and blind.held is None and not blind.held_idle
    assert blind.to_dict()["held"] is None and blind.to_dict()["segments"][0]["held"] is None
    dev = idle.device
    in_pod = Trace(DeviceInfo(dev.uuid, dev.name, dev.index, dev.host, extra={"pod": "nb-1"}), idle.time,
                   idle.without("mem_used").columns)
    assert judge(in_pod, model).held is True
    working = judge(fleet_traces["training"], model)
    assert working.held is False and all("held" not in s for s in working.to_dict()["segments"])
    console = Console(file=io.StringIO(), width=200)
    render([free, loaded, blind], console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert text.count("idle (held)") == 2  # the loaded GPU's phase and now columns; the others say idle


def test_vllm_idle_before_the_first_request_is_held(shared_data: Path, model: PhaseModel) -> None:
    """Real vLLM serving (A100-80GB, prefill/decode pair): wherever the fleet calls it idle, the GPU holds
    the loaded model (~72 GiB), so that time is held-idle waste."""
    path = "powertrace-vllm/disagg/gpt-oss-20b-a100-pd-confirmatory-35692922/rate-1-repeat-1/power.csv"
    for trace in read(shared_data / path):
        v = judge(trace, model)
        idle = [h for s, h in zip(v.segments, v.segment_held, strict=True) if s.label == "idle"]
        assert all(h is True for h in idle) and v.seconds.get("idle", 0.0) == 0.0
        # The labelled idle span before the first request (30 s) on its own: idle, and all of it held.
        span = judge(trace.slice_time(end=float(trace.time[0]) + 30.0), model)
        held = [h for s, h in zip(span.segments, span.segment_held, strict=True) if s.label == "idle"]
        assert held and all(h is True for h in held)
        assert span.seconds[HELD_IDLE] > 20 and span.seconds.get("idle", 0.0) == 0.0
