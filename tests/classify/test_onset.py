"""The alarm's onset model: straddling windows labelled by their share of training, fit/save/load, the shipped
file, on a small real subset."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify import onset
from phasescope.classify.decide import AlarmParams, TrainingAlarm, alarm_times, p_training
from phasescope.classify.lab import onset_fit
from phasescope.classify.lab.alert_eval import AlarmCase, build_cases
from phasescope.classify.model import PhaseModel
from phasescope.features import FEATURE_NAMES, window_features
from phasescope.schema import PHASES, DeviceInfo, Trace
from phasescope.sources.replay import read
from tests.classify._subset import write_labels, write_subset

TRAIN, OTHER, INFER = PHASES.index("training"), PHASES.index("other"), PHASES.index("inference")


def fake_case(label: str, onset_at: float | None, span_from: float = math.nan) -> AlarmCase:
    trace = Trace(DeviceInfo("gpu-x"), np.arange(0.0, 100.0))
    return AlarmCase("run", "gpu-x", "src", "fam", label, trace, onset_at, onset_at is not None,
                     span_from=span_from)


def test_share_after() -> None:
    s = onset_fit.share_after(np.array([0.0, 10.0, 20.0, 30.0]), np.array([15.0, 25.0, 35.0, 45.0]), 20.0)
    assert s.tolist() == [0.0, pytest.approx(1 / 3), 1.0, 1.0]


def test_window_labels_follow_the_share_rule() -> None:
    start = np.array([40.0, 45.0, 50.0, 55.0])
    end = start + 15.0
    # Onset at 55: shares 0, 1/3, 2/3, 1 -> only the last two hold at least half training.
    got = onset_fit.window_labels(fake_case("training", 55.0), start, end)
    assert got.tolist() == [OTHER, OTHER, TRAIN, TRAIN]
    # Inference watched with its pre-roll: the same rule, with the inference label after the span's start.
    got = onset_fit.window_labels(fake_case("inference", None, span_from=55.0), start, end)
    assert got.tolist() == [OTHER, OTHER, INFER, INFER]
    assert onset_fit.window_labels(fake_case("idle", None), start, end).tolist() == [PHASES.index("idle")] * 4


@pytest.fixture(scope="module")
def cases(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> list[AlarmCase]:
    return build_cases(write_subset(shared_data, tmp_path_factory.mktemp("subset")), preroll_all=True)


def test_onset_table_labels_straddling_windows(cases: list[AlarmCase]) -> None:
    table = onset_fit.build_onset_table(cases)
    cfg = onset.onset_config()
    known = [i for i, c in enumerate(cases) if c.onset is not None and c.onset_known]
    assert known, "the subset has SensorGuard training runs with a recorded start"
    for i in known:
        c = cases[i]
        assert c.onset is not None
        rows = np.flatnonzero((table.ex == i) & (table.copy == 1))
        y = table.y[rows]
        assert (y[: np.argmax(y == TRAIN)] == OTHER).all()  # pre-roll first, then training to the end
        assert (y[np.argmax(y == TRAIN):] == TRAIN).all()
        # The first training window starts before the run: it straddles the start.
        wf = onset_fit.case_windows(c, cfg)
        assert wf.start.size == rows.size
        first = int(np.argmax(y == TRAIN))
        assert wf.start[first] < c.onset < wf.end[first]
        assert (y == OTHER).sum() >= 2  # the SensorGuard pre-roll is 17-89 s


def test_fit_save_load_predicts_the_same(cases: list[AlarmCase], tmp_path: Path) -> None:
    table = onset_fit.build_onset_table(cases)
    runs = sorted({c.run for c in cases})
    model = onset_fit.fit_onset(table, set(runs[::2]) | {c.run for c in cases if c.onset_known}, ["all9"])
    assert model.config.window_s == onset.ONSET_WINDOW_S and model.version == onset.ALARM_MODEL_VERSION
    path = tmp_path / "alarm.json"
    model.save(path)
    again = onset.load_alarm_model(str(path))
    trace = next(c.trace for c in cases if c.onset_known)
    a, b = model.predict_trace(trace, evidence=False), again.predict_trace(trace, evidence=False)
    np.testing.assert_allclose(p_training(a), p_training(b), rtol=1e-9)


def test_shipped_alarm_model_is_separate_and_fires_after_a_real_start(cases: list[AlarmCase]) -> None:
    model = onset.load_alarm_model()
    assert model.version == onset.ALARM_MODEL_VERSION
    assert model.config.window_s == onset.ONSET_WINDOW_S
    assert PhaseModel.load().config.window_s == 30.0  # the window classifier is untouched
    # A smoke check on runs the shipped file was fitted on (the honest figures are the nested CV's).
    for c in cases:
        if not c.onset_known or c.family != "train_gpt2_wikitext":
            continue
        assert c.onset is not None
        pred = model.predict_trace(c.trace, evidence=False)
        order = np.argsort(pred.end)
        fired = alarm_times(np.asarray(pred.end)[order], p_training(pred)[order],
                            AlarmParams(window_s=onset.ONSET_WINDOW_S))
        assert fired.size and c.onset <= fired[0] <= c.onset + 60.0


def test_streaming_onset_alarm_fires_once_after_a_real_start(cases: list[AlarmCase]) -> None:
    alarm = onset.OnsetAlarm.shipped()
    assert alarm.params == onset.alarm_params(alarm.model)  # the card's calibrated parameters
    assert alarm.params.window_s == onset.ONSET_WINDOW_S
    c = next(c for c in cases if c.onset_known and c.family == "train_gpt2_wikitext")
    assert c.onset is not None
    t = c.trace.time
    fired_at = []
    for now in np.arange(t[0] + 5.0, min(t[-1], c.onset + 120.0), 5.0):  # a live tick every 5 s
        if alarm.update(c.trace.slice_time(now - onset.HISTORY_S, now)):
            fired_at.append(now)
    assert len(fired_at) == 1 and c.onset <= fired_at[0] <= c.onset + 60.0
    assert alarm.active


def _live_replay(trace: Trace, since: float = -math.inf, until: float = math.inf
                 ) -> tuple[list[float], list[np.ndarray]]:
    """What the live path hands `OnsetAlarm` on `trace` (a tick every ONSET_STRIDE_S of data time from its
    first sample at or after `since` to `until`, the last HISTORY_S seconds of `trace` each, as
    `live_classify` does), and the features of each window it then judges."""
    alarm = onset.OnsetAlarm(onset.load_alarm_model(), AlarmParams(window_s=onset.ONSET_WINDOW_S))
    ends: list[float] = []
    rows: list[np.ndarray] = []
    last_tick = -math.inf
    for now in trace.time.tolist():
        if now < since or now > until or now - last_tick < onset.ONSET_STRIDE_S:
            continue
        last_tick = now
        history = trace.take((trace.time > now - onset.HISTORY_S) & (trace.time <= now))
        wf = alarm.windows(history)
        alarm.update(history)
        if wf is not None:
            ends += wf.end.tolist()
            rows += list(wf.values)
    return ends, rows


def test_onset_table_features_are_the_live_alarms(cases: list[AlarmCase]) -> None:
    """Every window of the table carries the features the live alarm computes for the same end time, on
    its trailing HISTORY_S of history; not those of the whole trace (whose memory ramp counts from the
    case's first sample)."""
    c = max((c for c in cases if c.onset_known), key=lambda c: len(c.trace))
    assert c.trace.time[-1] - c.trace.time[0] > 3 * onset.HISTORY_S  # long enough for the histories to differ
    table = onset_fit.build_onset_table([c])
    rows = np.flatnonzero((table.ex == 0) & (table.copy == 1))
    ends, live = _live_replay(c.fed)
    kept = [k for k, e in enumerate(ends) if e > c.trace.time[0]]  # the rest judge only its context
    ends, live = [ends[k] for k in kept], [live[k] for k in kept]
    np.testing.assert_array_equal(table.live[0].end, ends)
    np.testing.assert_array_equal(table.X[rows], np.array(live))  # NaN where NaN
    # Counted from the case's first sample instead (the old table), the ramp features differ late in a run.
    late = [k for k, e in enumerate(ends) if e >= c.trace.time[0] + 2 * onset.HISTORY_S][::10][:6]
    assert late
    cfg = onset.onset_config()
    whole = np.array([window_features(c.trace.slice_time(None, ends[k]), cfg).values[-1] for k in late])
    for name in ("mem_rise_gib", "mem_plateau_s", "power_above_floor"):
        col = FEATURE_NAMES.index(name)
        assert not np.array_equal(whole[:, col], table.X[rows][late, col], equal_nan=True), name


BERT_COPY = "20260825_train_bert_node2-gpu0_s0_r01-copy"  # 10 s marker burst (other), 3 s, then training


@pytest.fixture(scope="module")
def bert_case(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[AlarmCase, Trace]:
    """The training case of a `train_bert` copy, with its device's whole file."""
    rows = [r for r in csv.DictReader((shared_data / "labels.csv").open(newline="")) if r["run"] == BERT_COPY]
    labels = write_labels(rows, shared_data, tmp_path_factory.mktemp("bert") / "labels.csv")
    c = next(c for c in build_cases(labels, preroll_all=True) if c.label == "training")
    full = next(t for t in read(str(shared_data / rows[0]["path"])) if t.device.uuid == c.device)
    return c, Trace(full.device, full.time, full.columns, c.trace.meta)  # the GPU model, as live knows it


def test_case_windows_hold_the_history_before_the_watched_start(bert_case: tuple[AlarmCase, Trace]) -> None:
    """A case's first windows carry what the live alarm computes on the device's whole file, whose last
    HISTORY_S before the watched start hold the marker burst; not what a replay of the watched span alone
    (which starts after the burst) computes."""
    c, full = bert_case
    assert c.onset is not None and c.onset_known
    t0 = float(c.trace.time[0])
    # No labelled training span before it: the context is the file's telemetry in the last HISTORY_S.
    before = full.time[(full.time > t0 - onset.HISTORY_S) & (full.time < t0)]
    assert c.context is not None and before.size >= 10
    np.testing.assert_array_equal(c.context.time, before)
    table = onset_fit.build_onset_table([c])
    rows = np.flatnonzero((table.ex == 0) & (table.copy == 1))
    # A live alarm started at the context's first sample, handed the file's trailing HISTORY_S at each tick.
    ends, live = _live_replay(full, since=float(before[0]), until=float(c.trace.time[-1]))
    kept = [k for k, e in enumerate(ends) if e > t0]
    np.testing.assert_array_equal(table.live[0].end, [ends[k] for k in kept])
    np.testing.assert_array_equal(table.X[rows], np.array([live[k] for k in kept]))
    # The first kept window's own tick, checked directly: the file's trailing HISTORY_S at that tick.
    ticks = onset.tick_times(full.time[full.time >= before[0]])
    first_end = float(table.live[0].end[0])
    history = onset.trailing(full, float(ticks[np.searchsorted(ticks, first_end)]))
    assert history.time[0] < t0  # it reaches back before the watched start
    alarm = onset.OnsetAlarm(onset.load_alarm_model(), AlarmParams(window_s=onset.ONSET_WINDOW_S))
    wf = alarm.windows(history)
    assert wf is not None
    np.testing.assert_array_equal(table.X[rows][0], wf.values[wf.end == first_end][0])
    # Replayed over the watched span alone, as before, the case's first window differs.
    alone = onset.live_windows(c.trace)
    assert alone.end[0] != first_end or not np.array_equal(alone.values[0], table.X[rows][0], equal_nan=True)


@pytest.mark.parametrize("which", ["subset", "bert_copy"])
def test_evaluation_predicts_the_live_windows(which: str, cases: list[AlarmCase],
                                              bert_case: tuple[AlarmCase, Trace]) -> None:
    """The nested CV's per-window probabilities are what `OnsetAlarm` would feed its CUSUM live (ticks from
    the case's context on; the windows that end by the watched start are not the case's)."""
    c = next(c for c in cases if c.onset_known) if which == "subset" else bert_case[0]
    table = onset_fit.build_onset_table([c])
    model = onset.load_alarm_model()
    got = onset_fit.case_predictor([c], table)(model, c.trace)
    alarm = onset.OnsetAlarm(model, AlarmParams(window_s=onset.ONSET_WINDOW_S))
    fed: list[tuple[float, float]] = []

    class Spy(TrainingAlarm):
        def update(self, window_end: float, p_training: float) -> bool:
            fed.append((window_end, p_training))
            return super().update(window_end, p_training)

    alarm.alarm = Spy(alarm.params)
    for now in onset.tick_times(c.fed.time).tolist():
        alarm.update(onset.trailing(c.fed, now))
    fed = [(e, p) for e, p in fed if e > c.trace.time[0]]
    assert fed
    np.testing.assert_array_equal(got.end, [e for e, _ in fed])
    np.testing.assert_allclose(p_training(got), [p for _, p in fed], rtol=0, atol=1e-12)
