"""The live classifier judges all devices' due windows in one model call per model, and reads every device
exactly as it would alone. Real recordings, the shipped models."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.live.state import LiveState
from phasescope.schema import Trace
from tests.live_helpers import ticks, training_traces

TICKS = 200  # past the alarm's 120 s history and several 15 s windows, at 1 Hz


def _run(traces: list[Trace], lc: LiveClassifier, calls: list[Any]) -> tuple[list[list[str]], list[int]]:
    """Every tick's readings and bands per device, and the model calls each update made."""
    state = LiveState("replay", lc.ring_ticks(1.0))
    seen: list[list[str]] = []
    per_update = []
    for batch in ticks(traces, stop=TICKS):
        state.ingest(batch)
        before = len(calls)
        lc.update(state)
        per_update.append(len(calls) - before)
        seen.append([repr((lc.reading(d.uuid), lc.bands(d.uuid))) for d in batch.devices])  # NaN == NaN
    return seen, per_update


def test_devices_are_judged_in_one_call_and_each_reads_as_alone(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four GPUs: the recording's training GPU and idle GPU, and each again shifted in time (so devices
    # differ in phase and in when their windows fall due is the same tick: the batched case).
    # All on the first GPU's clock, as one sampler's ticks are (so alone, each sees the same tick times).
    whole = training_traces(shared_data)
    clock = whole[0].time[:TICKS]
    base = [Trace(t.device, clock, {s: v[:TICKS] for s, v in t.columns.items()}) for t in whole]
    shifted = [Trace(replace(t.device, uuid=f"{t.device.uuid}-late", index=k + len(base)), clock,
                     {s: v[30:30 + TICKS] for s, v in t.columns.items()}) for k, t in enumerate(whole)]
    traces = [*base, *shifted]
    model = PhaseModel.load()
    calls: list[Any] = []
    predict = PhaseModel.predict_features

    def spy(self: PhaseModel, wf: Any, present: set[str], evidence: bool = False) -> Any:
        calls.append((self.version, len(wf.start)))
        return predict(self, wf, present, evidence)

    monkeypatch.setattr(PhaseModel, "predict_features", spy)
    together, per_update = _run(traces, LiveClassifier(model), calls)
    # One call for the phase model and one for the alarm's at most, whatever the number of devices.
    assert max(per_update) <= 2 and sum(per_update) > 0
    assert any(n > 1 for _, n in calls)  # several devices' windows in one call
    for k, trace in enumerate(traces):
        alone, _ = _run([trace], LiveClassifier(model), [])
        for tick, (both, one) in enumerate(zip(together, alone, strict=True)):
            assert both[k] == one[0], (trace.device.uuid, tick)
    lc = LiveClassifier(model)
    _run(traces, lc, [])
    phases = [lc.reading(t.device.uuid) for t in traces]
    assert {r.phase for r in phases if r is not None} >= {"training"}  # the run's GPUs are judged
