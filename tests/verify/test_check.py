"""`check_trace` on real runs with the shipped model (functional checks; the held-out figures are in
docs/EVALUATION.md, from `python -m phasescope.verify.evaluate`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasescope.verify.check import CheckParams, check_trace, flop_total, verification_windows
from phasescope.verify.claims import parse_claim
from tests.verify._data import DUTY_SHAPING, IDLE, INFERENCE_CONTROL, labelled, model


def test_disguised_training_contradicts_no_training(shared_data: Path) -> None:
    (v,) = check_trace(labelled(shared_data, DUTY_SHAPING), parse_claim("no-training"), model())
    assert v.verdict == "inconsistent"
    assert any("training for" in r for r in v.reasons)
    assert v.probabilities["training"] > 0.5
    assert v.drivers and all(isinstance(x, float) for x in v.drivers.values())
    assert v.model_version == model().version
    assert "not authenticated" in v.assurance and "Data:" in v.assurance
    json.dumps(v.to_dict(), allow_nan=False)  # strict JSON


def test_inference_is_consistent_with_inference_and_no_training(shared_data: Path) -> None:
    t = labelled(shared_data, INFERENCE_CONTROL)
    for claim in ("inference", "no-training"):
        (v,) = check_trace(t, parse_claim(claim), model())
        assert v.verdict == "consistent", v.reasons
    (v,) = check_trace(t, parse_claim("idle"), model())
    assert v.verdict == "inconsistent" and "inference for" in v.reasons[0]


def test_idle_gpu_is_consistent_with_idle_and_not_with_training(shared_data: Path) -> None:
    t = labelled(shared_data, IDLE)
    (v,) = check_trace(t, parse_claim("idle"), model())
    assert v.verdict == "consistent", v.reasons
    (v,) = check_trace(t, parse_claim("training"), model())
    assert v.verdict == "inconsistent"


def test_thin_data_is_unverifiable_not_consistent(shared_data: Path) -> None:
    t = labelled(shared_data, INFERENCE_CONTROL)
    sparse = t.take(slice(None, None, 20))  # one sample per 20 s: outside the model's validated range
    (v,) = check_trace(sparse, parse_claim("no-training"), model())
    assert v.verdict == "unverifiable"
    assert "could call only 0" in v.reasons[0] and "sample interval" in v.reasons[0]


def test_windows_split_the_span_and_each_gets_a_verdict(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    vs = check_trace(t, parse_claim("no-training"), model(), window_s=60)
    spans = verification_windows(float(t.time[0]), float(t.time[-1]), 60)
    assert [(v.start, v.end) for v in vs] == spans and len(vs) == 3
    assert sum(v.coverage.windows for v in vs) == len(model().predict_trace(t).labels)


def test_flop_budget_claim(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    (v,) = check_trace(t, parse_claim("max-flop=1e25"), model())
    assert v.verdict == "consistent" and v.flop.method == "gpu_util"
    (v,) = check_trace(t, parse_claim("max-flop=1e9"), model())
    assert v.verdict == "unverifiable"  # lower bound 0 from utilisation alone: cannot prove excess
    total = flop_total([v, v], 1e9)
    assert total["flop"]["upper"] == 2 * v.flop.upper and total["versus_budget"] == "undetermined"


def test_window_flop_adds_up_to_the_whole_run(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    claim = parse_claim("max-flop=1e25")
    (whole,) = check_trace(t, claim, model())
    parts = check_trace(t, claim, model(), window_s=60)
    total = flop_total(parts, 1e25)
    assert total["flop"]["estimate"] == pytest.approx(whole.flop.estimate, rel=0.02)
    assert total["versus_budget"] == "below"


def test_boundaries_count_each_sample_and_each_classifier_window_once(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    claim = parse_claim("max-flop=1e25")
    # A verification window length that puts a boundary exactly on a sample time ...
    vs = check_trace(t, claim, model(), window_s=float(t.time[60] - t.time[0]))
    assert vs[0].end == t.time[60] and sum(v.coverage.samples for v in vs) == len(t)
    # ... and one that puts a boundary exactly on a classifier window's centre.
    pred = model().predict_trace(t)
    centre = (pred.start + pred.end) / 2
    vs = check_trace(t, claim, model(), window_s=float(centre[4] - t.time[0]))
    assert vs[0].end == centre[4] and sum(v.coverage.windows for v in vs) == len(pred.labels)


def test_a_short_forbidden_segment_is_not_enough_but_the_alarm_is(shared_data: Path) -> None:
    lenient = CheckParams(min_segment_windows=10_000)  # no segment is long enough to count
    (v,) = check_trace(labelled(shared_data, INFERENCE_CONTROL), parse_claim("idle"), model(), params=lenient)
    assert v.verdict == "consistent", v.reasons
    # Disguised training still contradicts "no-training" through the training alarm alone.
    disguised = labelled(shared_data, DUTY_SHAPING)
    (v,) = check_trace(disguised, parse_claim("no-training"), model(), params=lenient)
    assert v.verdict == "inconsistent" and [r.split(" at ")[0] for r in v.reasons] == ["training alarm fired"]


def test_telemetry_with_a_long_hole_is_unverifiable(shared_data: Path) -> None:
    t = labelled(shared_data, INFERENCE_CONTROL)
    holed = t.take((t.time < t.time[0] + 40) | (t.time > t.time[0] + 140))  # 100 s of 182 s lost
    # min_judged=0 so that the coverage rule, not the judged-windows rule, is what decides.
    (v,) = check_trace(holed, parse_claim("no-training"), model(), params=CheckParams(min_judged=0.0))
    assert v.coverage.covered_fraction < 0.5
    assert v.verdict == "unverifiable" and v.reasons == [
        f"telemetry covers only {v.coverage.covered_fraction:.0%} of the window"
    ]
