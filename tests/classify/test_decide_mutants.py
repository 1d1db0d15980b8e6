"""Decision rules a mutation audit found untested: the alarm fires when the evidence *reaches* the
threshold, a phase wins a tie with unknown whatever the order, mean probabilities leave out unknown windows,
the first alert does not depend on the order windows are given in, and merge_short joins A, short B, A."""

from __future__ import annotations

import math

import numpy as np
import pytest

from phasescope.classify.decide import (
    AlarmParams,
    Segment,
    TrainingAlarm,
    first_alert,
    mean_probabilities,
    merge_short,
    overall_label,
    segments,
)
from phasescope.schema import PHASES
from tests.classify.test_decide import Preds, make


def test_alarm_fires_when_the_evidence_reaches_the_threshold_exactly() -> None:
    """One full 30 s window at p = 0.99 gives log(0.99 / 0.01) nats; with that as the threshold it fires."""
    threshold = math.log(0.99 / (1.0 - 0.99))
    alarm = TrainingAlarm(AlarmParams(threshold=threshold, window_s=30.0))
    assert alarm.update(30.0, 0.99)
    assert alarm.active


def test_a_tie_between_a_phase_and_unknown_goes_to_the_phase_in_either_order() -> None:
    nan = {ph: math.nan for ph in PHASES}
    unknown = Segment(0.0, 60.0, "unknown", nan, 2)
    training = Segment(60.0, 120.0, "training", dict(nan, training=0.9), 4)
    assert overall_label([unknown, training]) == "training"
    assert overall_label([training, unknown]) == "training"


def test_mean_probabilities_leave_out_windows_labelled_unknown() -> None:
    """A low-confidence window labelled unknown keeps finite probabilities but was not called."""
    proba = np.array([[0.9, 0.05, 0.03, 0.02], [0.7, 0.1, 0.1, 0.1], [0.3, 0.3, 0.2, 0.2]])
    pred = Preds(np.array([0.0, 15.0, 30.0]), np.array([30.0, 45.0, 60.0]), proba,
                 ["training", "training", "unknown"])
    mean = mean_probabilities(pred)
    assert mean["training"] == pytest.approx(0.8)  # (0.9 + 0.7) / 2
    assert mean["inference"] == pytest.approx(0.075)


def test_first_alert_does_not_depend_on_window_order() -> None:
    p = make("......" + "T" * 20, confidence=0.99)
    params = AlarmParams(threshold=4.0)
    expected = first_alert(p, params)
    assert expected == p.end[7]  # the second training window (test_decide: half of each window is new)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(p.labels))
    shuffled = Preds(p.start[order], p.end[order], p.proba[order], [p.labels[i] for i in order])
    assert first_alert(shuffled, params) == expected


def test_merge_short_joins_both_sides_when_it_leans_to_the_later_one() -> None:
    """Training (long enough to stay), 90 s of inference, then a longer training stretch: the short segment
    joins the longer (later) neighbour, and the earlier one of the same phase joins too: one segment."""
    segs = segments(make("T" * 10 + "IIIIII" + "T" * 14, confidence=0.99))
    assert [s.label for s in segs] == ["training", "inference", "training"]
    assert 120.0 < segs[0].duration < segs[2].duration
    (one,) = merge_short(segs, 120.0)
    assert (one.label, one.start, one.end, one.n_windows) == ("training", segs[0].start, segs[2].end, 30)
