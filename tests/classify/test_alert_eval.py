"""Scoring of the training alarm: false alerts before a run's start, delays, and the judged exposure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from phasescope.classify.alert_eval import AlarmCase, build_cases, choose_params, run_folds, score
from phasescope.classify.decide import AlarmParams
from phasescope.schema import DeviceInfo, Trace
from tests.classify._subset import write_subset


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
