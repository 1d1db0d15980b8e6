"""Decision math: segments with hysteresis, unknown handling, and the training alarm.

These feed hand-built window probabilities, because they test the rules, not the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from phasescope.classify.decide import (
    AlarmParams,
    Segment,
    SegmentParams,
    TrainingAlarm,
    alarm_times,
    first_alert,
    merge_short,
    overall_label,
    segments,
    viterbi,
)
from phasescope.schema import PHASES


@dataclass
class Preds:
    start: np.ndarray
    end: np.ndarray
    proba: np.ndarray
    labels: list[str]
    missing_signals: list[str] = field(default_factory=list)


def make(seq: str, confidence: float = 0.9, window: float = 30.0, stride: float = 15.0,
         t0: float = 0.0) -> Preds:
    """One window per char: T I O . for a confident phase, ? for unknown, t for a weak training lean."""
    code = {"T": "training", "I": "inference", "O": "other", ".": "idle"}
    n = len(seq)
    proba = np.full((n, 4), (1 - confidence) / 3)
    labels: list[str] = []
    for i, ch in enumerate(seq):
        if ch == "?":
            proba[i] = np.nan
            labels.append("unknown")
        elif ch == "t":
            proba[i] = [0.55, 0.15, 0.15, 0.15]
            labels.append("training")
        else:
            proba[i, PHASES.index(code[ch])] = confidence
            labels.append(code[ch])
    start = t0 + stride * np.arange(n, dtype=float)
    return Preds(start, start + window, proba, labels)


def labels_of(p: Preds) -> list[str]:
    return [s.label for s in segments(p)]


def test_one_odd_window_does_not_flip_a_segment() -> None:
    for odd in "IO.":
        p = make("TTTTTT" + odd + "TTTTTT", confidence=0.99)
        segs = segments(p)
        assert [s.label for s in segs] == ["training"]
        assert segs[0].n_windows == 13
    # Even a window that rules the segment's phase out entirely (p = 0) gives at most log(1/floor) nats.
    for odd in "IO.":
        assert labels_of(make("TTTTTT" + odd + "TTTTTT", confidence=1.0)) == ["training"]


def test_two_odd_windows_do_not_flip_but_a_sustained_change_does() -> None:
    assert labels_of(make("TTTTTTIITTTTTT", confidence=0.99)) == ["training"]
    assert labels_of(make("TTTTTTIIIIIITTTTTT", confidence=0.99)) == ["training", "inference", "training"]
    assert labels_of(make("TTTTTTTT........")) == ["training", "idle"]


def test_segment_boundaries_meet_halfway_between_window_centres() -> None:
    p = make("TTTT....")
    first, second = segments(p)
    # last training window [45, 75], first idle window [60, 90]: centres 60 and 75.
    assert first.start == 0.0 and second.end == p.end[-1]
    assert first.end == second.start == pytest.approx(67.5)
    assert first.n_windows == 4 and second.n_windows == 4
    assert first.probabilities["training"] == pytest.approx(0.9)
    assert first.confidence == pytest.approx(0.9)


def test_short_unknown_run_is_bridged_not_counted() -> None:
    segs = segments(make("TTTT??TTTT"))
    assert [s.label for s in segs] == ["training"]
    assert segs[0].n_windows == 8 and segs[0].n_unknown == 2


def test_short_unknown_run_neither_extends_nor_flips_at_a_boundary() -> None:
    p = make("TTTT??....")
    a, b = segments(p)
    assert (a.label, b.label) == ("training", "idle")
    assert a.n_unknown == 0 and b.n_unknown == 0
    # Trailing unknown windows do not stretch the last segment to the end of the trace.
    c = segments(make("TTTTTT??"))
    assert len(c) == 1 and c[0].end == pytest.approx(5 * 15 + 30)


def test_long_unknown_run_becomes_an_unknown_segment() -> None:
    segs = segments(make("TTTT" + "?" * 6 + "TTTT"))  # 6 windows x 15 s = 90 s >= 60 s
    assert [s.label for s in segs] == ["training", "unknown", "training"]
    assert segs[1].n_windows == 6
    assert all(v is None for v in segs[1].to_dict()["probabilities"].values())
    assert overall_label(segs) == "training"


def test_all_unknown_trace_is_one_unknown_segment() -> None:
    segs = segments(make("??"))
    assert [s.label for s in segs] == ["unknown"]
    assert overall_label(segs) == "unknown"
    assert overall_label([]) == "unknown"


def test_time_gap_splits_segments() -> None:
    p = make("TTTTTTTT")
    p.start[4:] += 3600.0
    p.end[4:] += 3600.0
    a, b = segments(p)
    assert a.label == b.label == "training"
    assert a.end == p.end[3] and b.start == p.start[4]
    # The gap rule is relative to the stride: 3 strides between window starts (> 2x) is a gap, 1.5 is not.
    q = make("TTTTTTTT")
    q.start[4:] += 30.0
    q.end[4:] += 30.0
    assert len(segments(q)) == 2
    r = make("TTTTTTTT")
    r.start[4:] += 7.5
    r.end[4:] += 7.5
    assert len(segments(r)) == 1


def test_overall_label_is_the_label_with_most_time() -> None:
    segs = segments(make("TTT" + "I" * 10 + "TTT"))
    assert [s.label for s in segs] == ["training", "inference", "training"]
    assert overall_label(segs) == "inference"
    # A tie between a phase and unknown goes to the phase.
    tie = segments(make("TTTT" + "?" * 4, stride=30.0, window=30.0), SegmentParams(min_unknown_s=60.0))
    assert [s.label for s in tie] == ["training", "unknown"] and tie[0].duration == tie[1].duration
    assert overall_label(tie) == "training"


def test_viterbi_switch_cost_is_the_hysteresis() -> None:
    ev = np.log(np.array([[0.9, 0.1], [0.1, 0.9], [0.9, 0.1]]))
    assert viterbi(ev, switch_cost=0.0).tolist() == [0, 1, 0]
    assert viterbi(ev, switch_cost=3.0).tolist() == [0, 0, 0]


# --- alarm -----------------------------------------------------------------------------------------


def test_alarm_fires_on_a_sustained_rise_once() -> None:
    p = make("......" + "T" * 20, confidence=0.99)
    times = alarm_times(p.end, p.proba[:, 0], AlarmParams(threshold=4.0))
    assert times.size == 1  # latched while training continues: one alert per episode
    # 0.99 -> 4.6 nats x 0.5 (half of each window is new data): fires on the 2nd training window.
    assert times[0] == p.end[7]
    assert first_alert(p, AlarmParams(threshold=4.0)) == p.end[7]


def test_alarm_defaults_never_fire_on_one_window() -> None:
    for stride in (1.0, 5.0, 15.0):  # overlapping windows; at 30 s a window is 30 s of new data
        p = make("..T..", confidence=0.999, stride=stride)
        assert first_alert(p) is None, stride
        assert first_alert(make(".." + "T" * 60, stride=stride)) is not None, stride


def test_alarm_ignores_isolated_spikes() -> None:
    p = make("....T.....T....T.....T....", confidence=0.99)
    assert first_alert(p, AlarmParams(threshold=4.0)) is None
    # Spikes in overlapping windows (stride 5 s, window 30 s) are down-weighted to their new data.
    q = make("." * 10 + "TT" + "." * 10 + "TTT" + "." * 10, confidence=0.99, stride=5.0)
    assert first_alert(q, AlarmParams(threshold=4.0, window_s=30.0)) is None


def test_alarm_rearms_after_training_ends() -> None:
    p = make("...TTTTTT......TTTTTT...", confidence=0.99)
    times = alarm_times(p.end, p.proba[:, 0], AlarmParams(threshold=4.0))
    assert times.size == 2
    assert first_alert(p, AlarmParams(threshold=4.0), after=float(times[0]) + 1) == times[1]
    assert first_alert(p, AlarmParams(threshold=4.0), after=float(times[1])) == times[1]  # at or after


def test_alarm_weak_lean_needs_drift_free_evidence() -> None:
    p = make("t" * 40)
    assert first_alert(p, AlarmParams(threshold=4.0, drift=0.0)) is not None
    # Demanding p > sigmoid(0.5) = 0.62 stops a steady 0.55 lean from ever alerting.
    assert first_alert(p, AlarmParams(threshold=4.0, drift=0.5)) is None


def test_alarm_streaming_skips_unknown_and_duplicates() -> None:
    alarm = TrainingAlarm(AlarmParams(threshold=4.0))
    assert not alarm.update(30.0, float("nan"))
    assert not alarm.update(45.0, 0.99)
    assert not alarm.update(45.0, 0.99)  # duplicate window end: not counted twice
    before = alarm.score
    assert not alarm.update(40.0, 0.01)  # out of order: ignored, not counted (against) either
    assert alarm.score == before and alarm.last_end == 45.0
    assert alarm.update(60.0, 0.99)
    assert alarm.active
    alarm.reset()
    assert not alarm.active and alarm.score == 0.0


def test_alarm_long_silence_clears_evidence() -> None:
    alarm = TrainingAlarm(AlarmParams(threshold=4.0, max_gap_s=300.0))
    assert not alarm.update(30.0, 0.9)  # 2.2 nats
    assert not alarm.update(1000.0, 0.9)  # after a 970 s gap the first 2.2 nats are forgotten
    assert alarm.update(1015.0, 0.99)


# Frozen copies of the numpy-per-window versions that viterbi and _collect replaced: the faster code must
# give the same segments, to the bit, on sequences full of ties, unknown runs and time gaps.


def _viterbi_reference(log_evidence: np.ndarray, switch_cost: float) -> np.ndarray:
    n, k = log_evidence.shape
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    back = np.empty((n, k), dtype=np.intp)
    score = log_evidence[0].copy()
    back[0] = np.arange(k)
    states = np.arange(k)
    for t in range(1, n):
        best = int(np.argmax(score))
        switch = score[best] - switch_cost
        stay = score >= switch
        back[t] = np.where(stay, states, best)
        score = np.where(stay, score, switch) + log_evidence[t]
    path = np.empty(n, dtype=np.intp)
    path[-1] = int(np.argmax(score))
    for t in range(n - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path


def _collect_reference(start, end, proba, state, unknown, long_unknown, breaks):  # type: ignore[no-untyped-def]
    from phasescope.classify.decide import UNKNOWN, Segment

    n = state.shape[0]
    code = np.where(long_unknown, -1, state)
    keep = np.flatnonzero(~(unknown & ~long_unknown))
    if keep.size == 0:
        return []
    centre = (start + end) / 2.0
    out = []
    seg_lo = 0
    for j in range(1, keep.size + 1):
        if j < keep.size:
            a, b = keep[j - 1], keep[j]
            if code[a] == code[b] and not breaks[a + 1 : b + 1].any():
                continue
        first, last = keep[seg_lo], keep[j - 1]
        nxt = keep[j] if j < keep.size else n
        gap_after = j == keep.size or bool(breaks[last + 1 : nxt + 1].any())
        prev = keep[seg_lo - 1] if seg_lo > 0 else -1
        gap_before = seg_lo == 0 or bool(breaks[prev + 1 : first + 1].any())
        seg_start = float(start[first]) if gap_before else float((centre[prev] + centre[first]) / 2.0)
        seg_end = float(end[last]) if gap_after else float((centre[last] + centre[nxt]) / 2.0)
        members = np.arange(first, last + 1)
        label = UNKNOWN if code[first] < 0 else PHASES[int(code[first])]
        if label == UNKNOWN:
            probs = {ph: float("nan") for ph in PHASES}
            n_win, n_unk = int(members.size), 0
        else:
            called = members[~unknown[members]]
            mean = proba[called].mean(axis=0)
            probs = {ph: float(mean[i]) for i, ph in enumerate(PHASES)}
            n_win, n_unk = int(called.size), int(unknown[members].sum())
        out.append(Segment(seg_start, seg_end, label, probs, n_win, n_unk))
        seg_lo = j
    return out


def _random_preds(rng: np.random.Generator, n: int) -> Preds:
    # Probabilities on a coarse grid, so that exact ties between states are common.
    proba = rng.integers(0, 6, size=(n, 4)).astype(float) + 0.01
    proba /= proba.sum(axis=1, keepdims=True)
    labels = [PHASES[i] for i in proba.argmax(axis=1)]
    runs = rng.random(n) < 0.08
    for i in np.flatnonzero(runs):
        ln = int(rng.integers(1, 8))
        proba[i : i + ln] = np.nan
        labels[i : i + ln] = ["unknown"] * len(labels[i : i + ln])
    step = np.full(n, 15.0)
    step[rng.random(n) < 0.03] = 200.0  # time gaps
    start = np.cumsum(step)
    return Preds(start, start + 30.0, proba, labels)


def test_segments_equal_the_per_window_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from phasescope.classify import decide

    rng = np.random.default_rng(7)
    cases = [_random_preds(rng, int(n)) for n in rng.integers(1, 400, size=60)]
    fast = [segments(p) for p in cases]
    for p in cases[:20]:
        ev = np.log(np.clip(np.nan_to_num(p.proba, nan=0.25), 0.01, 1.0))
        for cost in (0.0, 2.0, 6.0):
            assert viterbi(ev, cost).tolist() == _viterbi_reference(ev, cost).tolist()
    monkeypatch.setattr(decide, "viterbi", _viterbi_reference)
    monkeypatch.setattr(decide, "_collect", _collect_reference)
    slow = [segments(p) for p in cases]
    assert sum(len(s) for s in fast) > 500
    for f, s in zip(fast, slow, strict=True):
        assert [x.to_dict() for x in f] == [x.to_dict() for x in s]


def _seg(start: float, end: float, label: str, lean: dict[str, float] | None = None, n: int = 4) -> Segment:
    probs = {ph: 0.0 for ph in PHASES} if label != "unknown" else {ph: float("nan") for ph in PHASES}
    if label != "unknown":
        probs.update(lean or {})
        probs[label] = 1.0 - sum(v for k, v in probs.items() if k != label)
    return Segment(start, end, label, probs, n)


def test_merge_short_folds_a_short_segment_into_the_same_phase_around_it() -> None:
    segs = segments(make("TTTTTTIIIIIITTTTTT", confidence=0.99))
    assert [s.label for s in segs] == ["training", "inference", "training"]
    assert segs[1].duration == pytest.approx(90.0)
    assert merge_short(segs, 90.0) == segs  # not shorter: kept
    (one,) = merge_short(segs, 120.0)
    assert (one.label, one.start, one.end) == ("training", segs[0].start, segs[2].end)
    assert one.n_windows == 18
    # The mean over all 18 called windows, as `segments` would have computed it: 12 at 0.99, 6 at 0.01/3.
    assert one.probabilities["training"] == pytest.approx((12 * 0.99 + 6 * 0.01 / 3) / 18)
    assert merge_short(segs, 0.0) == segs


def test_merge_short_joins_the_neighbour_it_leans_to_then_the_longer() -> None:
    long_training, idle = _seg(0, 300, "training"), _seg(320, 400, "idle")
    leans_idle = _seg(300, 320, "other", {"idle": 0.3, "training": 0.1})
    out = merge_short([long_training, leans_idle, idle], 30.0)
    assert [(s.label, s.start, s.end) for s in out] == [("training", 0, 300), ("idle", 300, 400)]
    no_lean = _seg(300, 320, "other")
    out = merge_short([long_training, no_lean, idle], 30.0)
    assert [(s.label, s.start, s.end) for s in out] == [("training", 0, 320), ("idle", 320, 400)]


def test_merge_short_keeps_what_touches_no_phase() -> None:
    across_gap = [_seg(0, 300, "training"), _seg(400, 410, "idle")]
    assert merge_short(across_gap, 60.0) == across_gap
    beside_unknown = [_seg(0, 300, "unknown"), _seg(300, 310, "idle"), _seg(310, 600, "unknown")]
    assert merge_short(beside_unknown, 60.0) == beside_unknown
    alone = [_seg(0, 10, "idle")]
    assert merge_short(alone, 60.0) == alone
