"""The one verdict builder (classify/verdict.py) on real traces from ../shared/data with the shipped model:
`classify`, the report, the fleet judge and `verify` read the same verdict; unknown and its reasons carry
through each of them; a trace with no samples, or too few for one window, is unknown with a reason."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phasescope.classify import verdict
from phasescope.classify.model import PhaseModel
from phasescope.cli.classify import Result, classify_trace, print_human
from phasescope.config import ThresholdConfig
from phasescope.errors import InputError
from phasescope.fleet.judge import DeviceVerdict, judge
from phasescope.kpi.cost import Prices
from phasescope.report.data import DeviceReport, device_report
from phasescope.schema import Trace
from phasescope.sources.replay import read
from phasescope.verify.check import WindowVerdict, check_trace
from phasescope.verify.claims import parse_claim

# BERT inference on GPU 0 and its idle bystander GPU 1: 644 samples at 1 Hz each.
INFER_BERT = "sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01"
# Calibration bursts around 45 s of idle (237 samples): three segments, other - idle - other.
CALIB_IDLE = "sensorguard-rtx3090/20260824_calib-idle_verifier-gpu0_s0_r01/nvml.csv"


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


@pytest.fixture(scope="module")
def traces(shared_data: Path) -> list[Trace]:
    return read(shared_data / INFER_BERT)


def _callers(trace: Trace, model: PhaseModel) -> tuple[Result, DeviceReport, DeviceVerdict, WindowVerdict]:
    """What each of the four callers makes of one trace (verify: one verdict over the whole trace)."""
    (checked,) = check_trace(trace, parse_claim("no-training"), model)
    return (classify_trace(model, trace, "x", None, None), device_report(trace, "x", model, Prices()),
            judge(trace, model), checked)


def _segments(segs: Any) -> list[dict[str, Any]]:
    return [s.to_dict() for s in segs]


@pytest.mark.parametrize(("path", "gpu", "label", "phases"), [
    (INFER_BERT, 0, "inference", ["inference"]),
    (INFER_BERT, 1, "idle", ["idle"]),
    (CALIB_IDLE, 0, "other", ["other", "idle", "other"]),
])
def test_the_four_callers_agree_on_one_real_trace(
    shared_data: Path, model: PhaseModel, path: str, gpu: int, label: str, phases: list[str]
) -> None:
    trace = next(t for t in read(shared_data / path) if t.device.index == gpu)
    v = verdict.build(trace, model)
    assert v.label == label and [s.label for s in v.segments] == phases and v.device == trace.device
    assert (v.start, v.end) == (trace.time[0], trace.time[-1])
    assert v.unknown_reasons == {} and 0.5 < v.confidence <= 1.0
    cli, rep, fleet, checked = _callers(trace, model)
    for other in (cli.verdict, rep.verdict):  # classify and the report carry the verdict itself
        assert other.label == v.label and other.confidence == v.confidence
        assert other.probabilities == v.probabilities and _segments(other.segments) == _segments(v.segments)
    o = cli.to_json()
    assert o["label"] == label and o["confidence"] == v.confidence and o["probabilities"] == v.probabilities
    assert rep.label == label and rep.confidence == v.confidence
    # The fleet: the same segments and label; its "current" is the last segment's phase and confidence.
    assert fleet.label == label and _segments(fleet.segments) == _segments(v.segments)
    assert (fleet.current, fleet.confidence) == (v.segments[-1].label, v.segments[-1].confidence)
    # Held (these GPUs keep under the 1 GiB bar): the same answer everywhere, for the device and per segment.
    assert fleet.held is o["held"] is v.held.held is False
    told = [None if h is None else h.held for h in v.segment_held]
    assert fleet.segment_held == told == [seg.get("held") for seg in o["segments"]]
    assert told == [False if p == "idle" else None for p in phases]
    # verify over the whole trace: the same segments, probabilities and time per phase.
    assert checked.segments == _segments(v.segments) and checked.probabilities == v.probabilities
    seconds = {p: sum(s.duration for s in v.segments if s.label == p) for p in phases}
    assert checked.phase_seconds == pytest.approx(seconds)


def test_unknown_and_its_reasons_carry_through_every_caller(
    traces: list[Trace], model: PhaseModel, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sparse = traces[0].take(slice(None, None, 20))  # one sample per 20 s: outside the validated rates
    v = verdict.build(sparse, model)
    assert v.windows is not None and len(v.windows) > 0
    ((why, n),) = v.unknown_reasons.items()
    assert why.startswith("sample interval 20s outside") and n == len(v.windows)
    assert v.label == "unknown" and math.isnan(v.confidence) and v.held.held is None
    cli, rep, fleet, checked = _callers(sparse, model)
    o = cli.to_json()
    assert (o["label"], o["confidence"], o["held"]) == ("unknown", None, None)
    assert o["unknown_reasons"] == v.unknown_reasons
    assert rep.label == "unknown" and rep.verdict.unknown_reasons == v.unknown_reasons
    assert fleet.label == fleet.current == "unknown" and fleet.held is None
    assert fleet.to_dict()["confidence"] is None
    assert checked.verdict == "unverifiable" and why in checked.reasons[0]
    monkeypatch.setenv("COLUMNS", "300")  # the reason on one line
    print_human([cli])
    assert f"unknown: {why} ({n} windows)\n" in capsys.readouterr().out


def test_min_confidence_makes_unknown_windows_that_say_so(traces: list[Trace], model: PhaseModel) -> None:
    trace = traces[0]
    v = verdict.build(trace, model, min_confidence=0.99)
    assert v.windows is not None and v.thresholds == {"min_confidence": 0.99}
    unknown = sum(lab == "unknown" for lab in v.windows.labels)
    assert 0 < unknown < len(v.windows)  # some windows are called under 0.99, not all
    assert v.unknown_reasons == {"low confidence": unknown}
    o = classify_trace(model, trace, "x", None, None, ThresholdConfig(min_confidence=0.99)).to_json()
    assert o["unknown_reasons"] == v.unknown_reasons and o["thresholds"] == v.thresholds


@pytest.mark.parametrize(("samples", "reason", "windows"),
                         [(0, verdict.NO_SAMPLES, 0), (5, "too little data in window", 1)])
def test_an_empty_or_too_short_trace_is_unknown_with_a_reason(
    traces: list[Trace], model: PhaseModel, capsys: pytest.CaptureFixture[str],
    samples: int, reason: str, windows: int,
) -> None:
    trace = traces[0].take(np.arange(samples))  # the first `samples` seconds of a real trace
    v = verdict.build(trace, model)
    assert v.label == "unknown" and v.unknown_reasons == {reason: windows}
    assert [s.label for s in v.segments] == ["unknown"] * windows
    assert math.isnan(v.confidence) and v.held.held is None
    r = classify_trace(model, trace, "x", None, None)
    assert r.to_json()["unknown_reasons"] == {reason: windows} and r.to_json()["label"] == "unknown"
    print_human([r])
    assert f"unknown: {reason}" in capsys.readouterr().out
    assert device_report(trace, "x", model, Prices()).label == "unknown"
    assert judge(trace, model).label == "unknown"


def test_a_report_without_a_model_is_unknown_with_why(traces: list[Trace]) -> None:
    note = "classifier not available (ImportError: no lightgbm)"
    d = device_report(traces[0], "x", None, Prices(), model_note=note)
    assert d.label == "unknown" and d.pred is None and d.segments == [] and d.note == note
    assert d.verdict.unknown_reasons == {note: 0} and math.isnan(d.confidence)


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("min_confidence", 1.5, "min_confidence: expected a probability between 0 and 1, got 1.5"),
    ("min_confidence", math.nan, "min_confidence: expected a probability between 0 and 1, got nan"),
    ("min_segment_s", -1.0, "min_segment_s: expected a finite number of seconds, 0 or more, got -1.0"),
    ("min_segment_s", math.inf, "min_segment_s: expected a finite number of seconds, 0 or more, got inf"),
])
def test_a_bad_threshold_is_one_clear_error(
    traces: list[Trace], model: PhaseModel, option: str, value: float, expected: str
) -> None:
    with pytest.raises(InputError) as err:
        verdict.build(traces[0], model, **{option: value})
    assert str(err.value) == f"{traces[0].device.label()}: {expected}"
