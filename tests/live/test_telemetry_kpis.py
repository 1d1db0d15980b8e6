"""Telemetry-only KPIs in the live pipeline: real shared traces through the replay source, the tick loop, the
live classifier and the annotate hook; computed once per classifier run, for the device's live phase."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phasescope.kpi.rhythm import trace_kpis
from phasescope.live import annotate as annotate_module
from phasescope.live.annotate import Annotator
from phasescope.live.classify import LiveClassifier
from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.views import table
from phasescope.views.display import MISSING
from tests.live_helpers import TRAINING_RUN

# A real A100 vLLM server replaying BurstGPT requests (4 Hz power and utilisation; labelled inference).
SERVING_RUN = "powertrace-vllm/runs/burstgpt_qwen3-8b_a100/a100_trace_replay_tp1_1784416185/power.csv"


def _replay(path: Path, seconds: float, step: float) -> tuple[LiveState, ReplaySource, list[int]]:
    """Play `path` through a ReplaySource on a scripted clock (one tick per `step` recorded seconds, as a
    sampler at that interval would), the tick loop and an Annotator with the shipped classifier; count
    the KPI computations (`ring_kpis`) it makes."""
    now = [0.0]
    source = ReplaySource.from_path(path, clock=lambda: now[0])
    clf = LiveClassifier()
    state = LiveState(source.name, capacity=max(600, clf.ring_ticks(step)))  # serve's: all 450 ticks
    annotate = Annotator(clf)
    loop = TickLoop(source, step, state, annotate=annotate)
    calls: list[int] = []
    real = annotate_module.ring_kpis

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        return real(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(annotate_module, "ring_kpis", counted)
    try:
        while now[0] <= seconds:
            loop.on_tick(source.read())
            now[0] += step
    finally:
        mp.undo()
    return state, source, calls


def _row(state: LiveState, uuid: str) -> dict[str, str]:
    return next(r for r in table.rows(state) if r.key == uuid).cells


def _offline(path: Path, state: LiveState, source: ReplaySource, uuid: str,
             kpis: dict[str, Any]) -> dict[str, Any]:
    """`trace_kpis` of the recording over the samples the live KPIs covered (the replay puts recorded time
    t0 at its first tick's time; the ring holds every tick here)."""
    times = state.history_times(uuid)
    shift = times[0] - source.t0
    live_t = times[-kpis["samples"]:]
    rec = next(tr for tr in read(path) if tr.device.uuid == uuid)
    keep = (rec.time >= live_t[0] - shift - 1e-3) & (rec.time <= live_t[-1] - shift + 1e-3)
    return trace_kpis(rec.take(keep), kpis["phase"])


def test_a_training_gpu_shows_its_step_period_and_stall_share(shared_data: Path) -> None:
    """GPT-2 training on an RTX 3090 (1 Hz), 450 s through the live path: the training GPU's step period
    and stall share are the offline figures of the same samples; the idle GPU beside it shows none."""
    state, source, calls = _replay(shared_data / TRAINING_RUN, 450.0, 1.0)
    train, idle = state.snapshot().devices
    assert train.phase is not None and train.phase.phase == "training"
    assert idle.phase is not None and idle.phase.phase == "idle"
    kpis = train.telemetry_kpis
    assert kpis["phase"] == "training" and kpis["samples"] >= 250  # the last KPI_WINDOW_S of the run
    offline = _offline(shared_data / TRAINING_RUN, state, source, train.info.uuid, kpis)
    period = kpis["step_period_s"]["value"]
    assert period is not None and period > kpis["shortest_visible_period_s"]["value"]
    assert period == pytest.approx(offline["step_period_s"]["value"], rel=0.05)
    assert kpis["stall_fraction"]["value"] == pytest.approx(offline["stall_fraction"]["value"], abs=0.01)
    cell = _row(state, train.info.uuid)["rhythm"]
    assert cell.startswith("step ") and "stall " in cell and MISSING not in cell
    assert idle.telemetry_kpis["phase"] == "idle" and _row(state, idle.info.uuid)["rhythm"] == MISSING
    # Once per classifier run (every 5 s of data) per device, not per tick: 451 ticks x 2 devices.
    assert 0 < len(calls) <= 2 * (450 / 5 + 2)


def test_a_serving_gpu_shows_its_busy_fraction_and_bursts(shared_data: Path) -> None:
    """A vLLM server on an A100 (4 Hz) through the live path: busy fraction, bursts and saturation, as the
    offline figures of the same samples; no step period (not training)."""
    state, source, _ = _replay(shared_data / SERVING_RUN, 110.0, 0.25)
    (dev,) = state.snapshot().devices
    assert dev.phase is not None and dev.phase.phase == "inference"
    kpis = dev.telemetry_kpis
    assert kpis["phase"] == "inference" and "step_period_s" not in kpis
    offline = _offline(shared_data / SERVING_RUN, state, source, dev.info.uuid, kpis)
    for key in ("busy_fraction", "burst_rate_per_s", "burst_mean_s"):
        assert kpis[key]["value"] == pytest.approx(offline[key]["value"], rel=0.02), key
    assert kpis["saturated"]["value"] is offline["saturated"]["value"]
    cell = _row(state, dev.info.uuid)["rhythm"]
    assert cell.startswith("busy ") and "bursts/min " in cell and MISSING not in cell


def test_a_failing_kpi_is_said_once_and_the_phase_goes_on(shared_data: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A KPI computation that fails does not stop the phase updates: one status line, no KPIs shown."""
    from tests.live_helpers import ticks, training_traces

    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ValueError("broken rhythm")

    monkeypatch.setattr(annotate_module, "ring_kpis", broken)
    traces = training_traces(shared_data)
    state = LiveState("replay")
    clf = LiveClassifier()
    annotate = Annotator(clf)
    for batch in ticks(traces, 0, 90):
        state.ingest(batch)
        annotate(state)
    assert clf.runs > 4 and all(state.phase(t.device.uuid) is not None for t in traces)
    said = [e for e in state.events() if "broken rhythm" in e]
    assert said == [f"telemetry KPIs of {traces[0].device.uuid}: ValueError: broken rhythm",
                    f"telemetry KPIs of {traces[1].device.uuid}: ValueError: broken rhythm"]
    assert state.telemetry_kpis() == {}
