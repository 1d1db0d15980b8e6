"""Scoring of the training alarm: false alerts before a run's start, delays, and the judged exposure."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from phasescope.classify.decide import AlarmParams
from phasescope.classify.lab.alert_eval import (
    AlarmCase,
    build_cases,
    choose_params,
    context_trace,
    preroll_from,
    run_folds,
    score,
)
from phasescope.classify.lab.dataset import Example, load_examples
from phasescope.schema import DeviceInfo, Trace
from tests.classify._subset import write_labels, write_subset


def case(p: list[float], onset: float | None, stride: float = 15.0, window: float = 30.0) -> AlarmCase:
    n = len(p)
    starts = stride * np.arange(n, dtype=float)
    ends = starts + window
    trace = Trace(DeviceInfo("gpu-x"), np.arange(0.0, float(ends[-1]) + 1.0))
    label = "idle" if onset is None else "training"
    return AlarmCase("run", "gpu-x", "src", "fam", label, trace, onset, onset is not None, starts, ends,
                     np.asarray(p, dtype=float))


def test_delay_is_first_alert_after_the_start() -> None:
    c = case([0.01] * 4 + [0.99] * 6, onset=60.0)
    s = score([c], AlarmParams(threshold=4.0))
    # windows end at 30, 45, ...: the 2nd confident window ends at 15 * 5 + 30 = 105.
    assert s.outcomes[0].delay_s == 45.0
    assert s.outcomes[0].false_alerts == 0
    assert s.median_delay() == 45.0 and s.detected() == (1, 1)


def test_alert_before_the_start_is_false_and_the_run_counts_as_missed() -> None:
    c = case([0.99] * 10, onset=100.0)
    s = score([c], AlarmParams(threshold=4.0))
    assert s.outcomes[0].false_alerts == 1  # fired at 30 s, on telemetry before the run began
    assert math.isinf(s.outcomes[0].delay_s)  # latched since: no alert at or after the start
    assert s.detected() == (0, 1)


def test_false_alert_rate_uses_judged_hours_only() -> None:
    p = [np.nan] * 200 + [0.01] * 40 + [0.99] * 4 + [0.01] * 40
    c = case(p, onset=None)
    s = score([c], AlarmParams(threshold=4.0))
    n, watched, judged = s.false_alerts()
    assert n == 1
    assert watched > judged
    # judged: windows 200..283 cover [3000, 4275 + 30] s.
    assert judged * 3600 == (283 * 15 + 30) - 3000
    assert s.false_per_gpu_hour() == 1 / judged


def test_choose_params_respects_false_alert_target() -> None:
    noisy = case([0.01, 0.99, 0.99, 0.01] * 30, onset=None)  # pairs of odd windows on non-training data
    run = case([0.01] * 4 + [0.99] * 10, onset=60.0)
    p = choose_params([noisy, run], AlarmParams())
    s = score([noisy], p)
    assert s.false_alerts()[0] == 0
    assert math.isfinite(score([run], p).outcomes[0].delay_s)


def test_run_folds_keep_runs_whole_and_cover_every_fold() -> None:
    runs = [f"r{i % 10}" for i in range(50)]
    folds = run_folds(runs, 4, seed=0)
    assert set(folds) == set(runs) and set(folds.values()) == {0, 1, 2, 3}


def test_preroll_all_watches_non_training_from_the_file_start(shared_data: Path, tmp_path: Path) -> None:
    labels = write_subset(shared_data, tmp_path)
    plain = build_cases(labels)
    full = build_cases(labels, preroll_all=True)
    assert [(c.run, c.device, c.label) for c in plain] == [(c.run, c.device, c.label) for c in full]
    widened = 0
    for a, b in zip(plain, full, strict=True):
        assert b.trace.time[-1] == a.trace.time[-1]  # same end; only the start may move back
        if a.onset is not None or not math.isfinite(b.span_from):
            assert len(b.trace) == len(a.trace)
            continue
        widened += 1
        assert b.span_from == a.trace.time[0] and b.trace.time[0] < b.span_from
        assert b.exposure_s >= a.exposure_s + 5.0  # the pre-roll counts as non-training exposure
    # The subset's SensorGuard inference, other and idle runs all start after marker bursts.
    assert widened >= 6


def test_every_pre_roll_starts_after_the_previous_labelled_span(shared_data: Path, tmp_path: Path) -> None:
    """One rule for training and non-training spans (`preroll_from`): the pre-roll starts where the previous
    labelled span on the device ends, so a labelled marker span is its own case, not a training pre-roll."""
    run = "20260825_train_bert_node2-gpu0_s0_r01-copy"  # a marker span (other), 3 s, then training
    rows = list(csv.DictReader((shared_data / "labels.csv").open(newline="")))
    keep = [r for r in rows if r["run"] == run]
    out = write_labels(keep, shared_data, tmp_path / "labels.csv")
    marker = next(r for r in keep if r["family"] == "marker_gemm_bursts")
    for preroll_all in (False, True):
        cases = build_cases(out, preroll_all=preroll_all)
        train = next(c for c in cases if c.label == "training")
        assert train.onset is not None and train.onset_known  # the file holds telemetry before the start
        assert float(marker["t_to"]) < train.trace.time[0] < train.onset  # watched from the marker's end
        others = [c for c in cases if c.family == "marker_gemm_bursts"]
        assert len(others) == 1 and others[0].trace.time[-1] <= float(marker["t_to"])
    # The non-training rule is the same function: a span after the marker would start where it ends.
    examples = load_examples(out)
    ex = next(e for e in examples if e.label == "training")
    lo, exclusive = preroll_from(ex, examples, ex.trace)
    assert exclusive and lo == max(float(e.trace.time[-1]) for e in examples
                                   if e.device == ex.device and e is not ex)


def test_context_stops_at_the_history_and_at_a_labelled_training_span() -> None:
    """A case's context: the device's telemetry before its watched start, at most the alarm's history back,
    never into a labelled training span (its alerts are that run's), never another device's or file's."""
    full = Trace(DeviceInfo("gpu-x"), np.arange(0.0, 300.0), {"gpu_util": np.zeros(300)})

    def ex(lo: float, hi: float, label: str, path: str = "f", device: str = "gpu-x") -> Example:
        return Example(full.slice_time(lo, hi), label, label, "", "src", "run", path, device)

    first, marker, second = ex(0, 99, "training"), ex(100, 149, "other"), ex(200, 299, "training")
    elsewhere = [ex(110, 140, "training", path="g"), ex(110, 140, "training", device="y")]
    examples = [first, marker, second, *elsewhere]
    watched = full.slice_time(150, 299)  # the second run with its pre-roll (after the marker span)
    got = context_trace(watched, second, examples, full, history_s=120.0)
    assert got is not None and got.time.tolist() == list(np.arange(100.0, 150.0))  # after the first run
    got = context_trace(watched, second, examples, full, history_s=30.0)
    assert got is not None and got.time.tolist() == list(np.arange(121.0, 150.0))  # (t - 30, t), as live
    assert context_trace(marker.trace, marker, examples, full, 120.0) is None  # right after a training run
    assert context_trace(full, first, examples, full, 120.0) is None  # the file's first sample
