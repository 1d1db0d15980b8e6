"""Fleet verdicts, rules a mutation audit found untested, on real RTX 3090 traces (tests/fleet/conftest.py)
joined end to end: a brief memory spike does not make an idle GPU held, "held idle now" is about the last
segment, the range label splits idle by which kind took longer, the last window's probabilities are
reported, and held-idle energy is in kWh."""

from __future__ import annotations

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel
from phasescope.fleet.judge import HELD_IDLE, judge
from phasescope.kpi.cost import Prices
from phasescope.schema import PHASES, Trace

GIB = 1024.0**3


def _with_mem(t: Trace, mem: np.ndarray) -> Trace:
    return Trace(t.device, t.time, {**t.columns, "mem_used": mem}, t.meta)


def _join(*parts: Trace) -> Trace:
    """The parts one after another, 1 s apart, on one device (the first part's)."""
    times, t0 = [], 0.0
    for p in parts:
        times.append(p.time - p.time[0] + t0)
        t0 = times[-1][-1] + 1.0
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0].columns}
    return Trace(parts[0].device, np.concatenate(times), cols, parts[0].meta)


def test_a_brief_memory_spike_does_not_make_an_idle_gpu_held(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    """5 of 256 samples at 2 GiB (a short-lived allocation); the median stays at the ~450 MiB context."""
    idle = fleet_traces["idle"]
    mem = idle["mem_used"].copy()
    mem[128:133] = 2 * GIB
    assert np.median(mem) < 1 * GIB
    v = judge(_with_mem(idle, mem), model)
    assert v.label == "idle" and not v.held_idle
    assert HELD_IDLE not in v.seconds


def test_held_idle_then_training_is_not_held_idle_now(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    idle, train = fleet_traces["idle"], fleet_traces["training"]
    held = _with_mem(idle, idle["mem_used"] + 2 * GIB)  # a process kept 2 GiB while the GPU sat idle
    trace = _join(held, train)
    v = judge(trace, model)
    assert [s.label for s in v.segments] == ["idle", "training"]
    assert v.seconds[HELD_IDLE] > 200  # the idle part was held ...
    assert v.current == "training" and not v.held_idle  # ... but is over
    # Probabilities are the last judged window's (training), not the first's (idle).
    pred = model.predict_trace(trace, evidence=False)
    last = np.flatnonzero(np.isfinite(pred.proba).all(axis=1))[-1]
    assert v.probabilities == pytest.approx({ph: float(pred.proba[last, i]) for i, ph in enumerate(PHASES)})
    assert max(v.probabilities, key=v.probabilities.__getitem__) == "training"


def test_the_range_label_is_held_idle_only_when_held_idle_took_longer(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    """255 s idle (not held), 120 s of training, 100 s idle with 2 GiB held: idle took longer than held."""
    idle, train = fleet_traces["idle"], fleet_traces["training"]
    t0 = train.time[0]
    held = _with_mem(idle, idle["mem_used"] + 2 * GIB).slice_time(idle.time[0], idle.time[0] + 100)
    v = judge(_join(idle, train.slice_time(t0 + 200, t0 + 320), held), model)
    assert [s.label for s in v.segments] == ["idle", "training", "idle"]
    assert v.seconds["idle"] > v.seconds[HELD_IDLE] > 0
    assert v.label == "idle"
    assert v.current == "idle" and v.held_idle


def test_held_idle_energy_is_reported_in_kwh(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    idle = fleet_traces["idle"]
    v = judge(idle, model, Prices(usd_per_gpu_hour=3.0, usd_per_kwh=0.2), held_mem_bytes=256 * 1024**2)
    joules = float(np.trapezoid(idle["power"], idle.time))  # the whole trace is one held idle stretch
    assert v.held_idle_joules == pytest.approx(joules, rel=0.02)
    d = v.to_dict()
    assert d["held_idle_kwh"] == pytest.approx(joules / 3.6e6, rel=0.02)
    assert d["held_idle_cost"]["energy_usd"] == pytest.approx(joules / 3.6e6 * 0.2, rel=0.02)
