"""From window probabilities to decisions: phase segments with hysteresis, and a "training started" alarm.

Two rules, both on the model's per-window probabilities (columns in `schema.PHASES` order):

- `segments`: a 4-state HMM decoded with Viterbi. Each window's evidence for a phase is log(max(p, floor));
  changing phase between consecutive windows costs `switch_cost` nats. With floor 0.01 one window can
  give at most log(1/0.01) = 4.6 nats to one phase over another, so with a switch cost of 6 nats a
  stretch inside a segment flips (two switches, 12 nats) only after 3 confident windows, and one odd
  window never flips anything. "unknown" windows carry no evidence: short runs are bridged (they neither
  extend nor flip a segment), long runs become an "unknown" segment of their own.

- `TrainingAlarm`: a one-sided CUSUM on the log-odds of training, log(p / (1 - p)), with each window's
  evidence weighted by the fraction of its data that is new since the previous window. Overlapping windows
  share data; the weight counts every second of telemetry once, so a short burst that shows up in six
  overlapping windows is not counted six times. The alarm fires when the sum reaches `threshold`, then
  latches until the same amount of evidence against training has accumulated, and re-arms.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from phasescope.schema import PHASES, FloatArray

UNKNOWN = "unknown"
_TRAINING = PHASES.index("training")


class WindowProbs(Protocol):
    """What the rules read from `classify.model.WindowPredictions` (structural: any match works)."""

    @property
    def start(self) -> FloatArray: ...

    @property
    def end(self) -> FloatArray: ...

    @property
    def proba(self) -> FloatArray: ...  # (n_windows, len(PHASES)), PHASES order

    @property
    def labels(self) -> Sequence[str]: ...  # a phase or "unknown" per window


@dataclass(frozen=True)
class Segment:
    """A stretch of one trace in one phase (or "unknown")."""

    start: float
    end: float
    label: str
    probabilities: dict[str, float]  # mean window probability per phase over the segment's known windows
    n_windows: int  # windows that carried the segment (for an "unknown" segment: its unknown windows)
    n_unknown: int = 0  # short runs of unknown windows bridged inside a phase segment

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def confidence(self) -> float:
        """Mean probability of the segment's own label; NaN for an unknown segment."""
        return self.probabilities.get(self.label, float("nan"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "label": self.label,
            "probabilities": {k: finite_or_none(v) for k, v in self.probabilities.items()},
            "n_windows": self.n_windows,
            "n_unknown": self.n_unknown,
        }


@dataclass(frozen=True)
class SegmentParams:
    switch_cost: float = 6.0  # nats to change phase between consecutive windows
    floor: float = 0.01  # probabilities below this count as this: caps one window's evidence at log(1/floor)
    min_unknown_s: float = 60.0  # a run of unknown windows at least this long (in strides) is its own segment
    gap_factor: float = 2.0  # a step between window starts above gap_factor x the median step is a time gap


def unknown_mask(pred: WindowProbs) -> npt.NDArray[np.bool_]:
    """Windows the model declined to call (labelled "unknown" or without finite probabilities)."""
    proba = np.asarray(pred.proba, dtype=np.float64).reshape(len(pred.labels), len(PHASES))
    n = len(pred.labels)
    labelled_unknown = np.fromiter((lab == UNKNOWN for lab in pred.labels), dtype=bool, count=n)
    return labelled_unknown | ~np.isfinite(proba).all(axis=1)


def viterbi(log_evidence: FloatArray, switch_cost: float) -> npt.NDArray[np.intp]:
    """Most likely state path when staying is free and any change of state costs `switch_cost`.

    The recursion is sequential in time, so it runs on Python floats: with 4 states a numpy call per step
    costs more than the arithmetic (the same float64 operations in the same order, so the same path)."""
    n, k = log_evidence.shape
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    rows = log_evidence.tolist()
    states = range(k)
    score = rows[0]
    back: list[list[int]] = [list(states)]
    for row in rows[1:]:
        top = max(score)
        best = score.index(top)  # the first maximum, as np.argmax
        switch = top - switch_cost
        # Ties keep the current state: hysteresis.
        back.append([i if score[i] >= switch else best for i in states])
        score = [(score[i] if score[i] >= switch else switch) + row[i] for i in states]
    path = np.empty(n, dtype=np.intp)
    cur = score.index(max(score))
    path[-1] = cur
    for t in range(n - 1, 0, -1):
        cur = back[t][cur]
        path[t - 1] = cur
    return path


def segments(pred: WindowProbs, params: SegmentParams | None = None) -> list[Segment]:
    """Cut one trace's windows into phase segments (see the module doc for the rule)."""
    p = params or SegmentParams()
    n = len(pred.labels)
    if n == 0:
        return []
    start = np.asarray(pred.start, dtype=np.float64)
    end = np.asarray(pred.end, dtype=np.float64)
    proba = np.asarray(pred.proba, dtype=np.float64).reshape(n, len(PHASES))
    unknown = unknown_mask(pred)
    step = _median_step(start)

    # Label every window: a phase index, or -1 for unknown. Blocks between time gaps and long unknown runs
    # are decoded independently, since no evidence links them.
    state = np.full(n, -1, dtype=np.intp)
    long_unknown = _long_unknown_runs(unknown, step, p.min_unknown_s)
    breaks = _gap_breaks(start, step, p.gap_factor)
    for lo, hi in _blocks(breaks, long_unknown):
        known = lo + np.flatnonzero(~unknown[lo:hi])
        if known.size:
            evidence = np.log(np.clip(proba[known], p.floor, 1.0))
            state[known] = viterbi(evidence, p.switch_cost)
        else:
            long_unknown[lo:hi] = True  # nothing known to bridge to between these gaps

    return _collect(start, end, proba, state, unknown, long_unknown, breaks)


def merge_short(segs: Sequence[Segment], min_s: float) -> list[Segment]:
    """Fold every phase segment shorter than `min_s` into a phase segment it touches (the config's
    `[thresholds] min_segment_s`; not used unless set, so the evaluated segments are unchanged).

    Shortest first. Of its two neighbours it joins the one whose phase it gave more probability, then the
    longer. Segments across a time gap or beside an "unknown" segment do not touch: a short one with no
    touching phase neighbour is kept. Joined segments take the neighbour's label, and their probabilities
    are the mean over all their called windows (as `segments` computes them).
    """
    out = list(segs)
    while True:
        short = [k for k, s in enumerate(out) if s.label != UNKNOWN and s.duration < min_s
                 and _touching(out, k)]
        if not short:
            return out
        i = min(short, key=lambda k: (out[k].duration, k))
        j = max(_touching(out, i), key=lambda k: _pull(out[i], out[k]))
        lo, hi = min(i, j), max(i, j)
        # The other side may carry the same label (A, short B, A): then all three are one segment.
        if lo > 0 and out[lo - 1].label == out[j].label and _meet(out[lo - 1], out[lo]):
            lo -= 1
        if hi + 1 < len(out) and out[hi + 1].label == out[j].label and _meet(out[hi], out[hi + 1]):
            hi += 1
        out[lo : hi + 1] = [_join(out[lo : hi + 1], out[j].label)]


def _pull(short: Segment, neighbour: Segment) -> tuple[float, float]:
    """How much `short` leans to `neighbour`: the probability it gave its phase, then its length."""
    p = short.probabilities.get(neighbour.label, math.nan)
    return (p if math.isfinite(p) else -math.inf, neighbour.duration)


def _meet(a: Segment, b: Segment) -> bool:
    """Whether b starts where a ends. `segments` computes a shared boundary once (halfway between window
    centres), so equality is exact; across a time gap a segment ends at its last window's end instead."""
    return b.start == a.end


def _touching(segs: Sequence[Segment], i: int) -> list[int]:
    """Indices of the phase segments right beside segs[i] with no time gap between."""
    out = []
    if i > 0 and segs[i - 1].label != UNKNOWN and _meet(segs[i - 1], segs[i]):
        out.append(i - 1)
    if i + 1 < len(segs) and segs[i + 1].label != UNKNOWN and _meet(segs[i], segs[i + 1]):
        out.append(i + 1)
    return out


def _join(parts: Sequence[Segment], label: str) -> Segment:
    n = sum(p.n_windows for p in parts)
    probs = {
        ph: sum(p.probabilities.get(ph, 0.0) * p.n_windows for p in parts) / n if n else math.nan
        for ph in PHASES
    }
    return Segment(parts[0].start, parts[-1].end, label, probs, n, sum(p.n_unknown for p in parts))


def overall_label(segs: Sequence[Segment]) -> str:
    """The label that holds the most time across segments; "unknown" when unknown time dominates or none."""
    totals: dict[str, float] = {}
    for s in segs:
        totals[s.label] = totals.get(s.label, 0.0) + max(s.duration, 0.0)
    if not totals:
        return UNKNOWN
    return max(totals, key=lambda lab: (totals[lab], lab != UNKNOWN))


def mean_probabilities(pred: WindowProbs) -> dict[str, float]:
    """Mean probability per phase over the windows the model did call (NaN when it called none)."""
    proba = np.asarray(pred.proba, dtype=np.float64).reshape(len(pred.labels), len(PHASES))
    known = ~unknown_mask(pred)
    if not known.any():
        return {ph: float("nan") for ph in PHASES}
    mean = proba[known].mean(axis=0)
    return {ph: float(mean[i]) for i, ph in enumerate(PHASES)}


# --- the "training started" alarm -------------------------------------------------------------------


@dataclass(frozen=True)
class AlarmParams:
    # Nats of (decorrelated) evidence for training before the alarm fires. 3 nats is 20:1 odds, and more
    # than one window can give at the default 15 s stride (4.6 x 15/30 = 2.3): one odd window never fires.
    threshold: float = 3.0
    drift: float = 0.0  # nats subtracted from each window's log-odds: demands p_training > sigmoid(drift)
    floor: float = 0.01  # p_training is clipped to [floor, 1 - floor]: one window adds at most 4.6 nats
    window_s: float = 30.0  # window length, to weight each window by the share of its data that is new
    max_gap_s: float = 300.0  # a longer silence clears the evidence gathered so far

    def to_dict(self) -> dict[str, float]:
        return {
            "threshold": self.threshold,
            "drift": self.drift,
            "floor": self.floor,
            "window_s": self.window_s,
            "max_gap_s": self.max_gap_s,
        }


@dataclass
class TrainingAlarm:
    """Streaming CUSUM alarm for "training started" on one device; feed it windows in time order."""

    params: AlarmParams = field(default_factory=AlarmParams)
    score: float = 0.0  # evidence for training while armed; evidence against it while latched
    active: bool = False  # latched after firing, until the training evidence is gone again
    last_end: float = float("nan")

    def reset(self) -> None:
        self.score = 0.0
        self.active = False
        self.last_end = float("nan")

    def update(self, window_end: float, p_training: float) -> bool:
        """Add one window's evidence; True exactly when the alarm fires (armed -> active)."""
        p = self.params
        fresh = p.window_s if math.isnan(self.last_end) else window_end - self.last_end
        if fresh <= 0:
            return False  # out of order or duplicate: ignore rather than count twice
        if fresh > p.max_gap_s:
            self.score = 0.0
        self.last_end = window_end  # an unknown window's data is spent too, it just told us nothing
        if not math.isfinite(p_training):
            return False
        q = min(max(p_training, p.floor), 1.0 - p.floor)
        llr = (math.log(q / (1.0 - q)) - p.drift) * min(1.0, fresh / p.window_s)
        if not self.active:
            self.score = max(0.0, self.score + llr)
            if self.score >= p.threshold:
                self.active, self.score = True, 0.0
                return True
            return False
        # Latched: count evidence against training; re-arm once it matches what firing took.
        self.score = max(0.0, self.score - llr)
        if self.score >= p.threshold:
            self.active, self.score = False, 0.0
        return False


def alarm_times(
    window_end: FloatArray, p_training: FloatArray, params: AlarmParams | None = None
) -> FloatArray:
    """End times of the windows at which the alarm fires, replaying a whole trace through `TrainingAlarm`."""
    alarm = TrainingAlarm(params or AlarmParams())
    ends = np.asarray(window_end, dtype=np.float64)
    ps = np.asarray(p_training, dtype=np.float64)
    fired = [float(t) for t, q in zip(ends.tolist(), ps.tolist(), strict=True) if alarm.update(t, q)]
    return np.asarray(fired, dtype=np.float64)


def p_training(pred: WindowProbs) -> FloatArray:
    """Per-window probability of training; NaN for windows the model did not judge at all.

    A window labelled "unknown" only because no phase reached the model's confidence bar keeps its
    probability: a 0.45 for training is still (weak) evidence, and the alarm weighs it as such.
    """
    proba = np.asarray(pred.proba, dtype=np.float64).reshape(len(pred.labels), len(PHASES))
    out = proba[:, _TRAINING].copy()
    out[~np.isfinite(proba).all(axis=1)] = np.nan
    return out


def first_alert(
    pred: WindowProbs, params: AlarmParams | None = None, after: float | None = None
) -> float | None:
    """Time (window end) of the first alarm at or after `after`, or None when it never fires."""
    order = np.argsort(np.asarray(pred.end, dtype=np.float64), kind="stable")
    times = alarm_times(np.asarray(pred.end)[order], p_training(pred)[order], params)
    if after is not None:
        times = times[times >= after]
    return float(times[0]) if times.size else None


# --- helpers ------------------------------------------------------------------------------------------


def finite_or_none(v: float) -> float | None:
    """A number for strict JSON: NaN and infinities become null."""
    return v if math.isfinite(v) else None


def _median_step(start: FloatArray) -> float:
    d = np.diff(start)
    d = d[d > 0]
    return float(np.median(d)) if d.size else 0.0


def _gap_breaks(start: FloatArray, step: float, factor: float) -> npt.NDArray[np.bool_]:
    """breaks[i] is True when a time gap lies between window i-1 and window i."""
    out = np.zeros(start.shape[0], dtype=bool)
    if start.shape[0] > 1 and step > 0:
        out[1:] = np.diff(start) > factor * step
    return out


def _runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """[lo, hi) index ranges where mask is True."""
    m = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(m))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _long_unknown_runs(unknown: npt.NDArray[np.bool_], step: float, min_s: float) -> npt.NDArray[np.bool_]:
    out = np.zeros_like(unknown)
    n = unknown.shape[0]
    for lo, hi in _runs(unknown):
        # A run that is the whole trace is unknown however short: there is nothing to bridge it to.
        if (hi - lo) * step >= min_s or (lo == 0 and hi == n):
            out[lo:hi] = True
    return out


def _blocks(breaks: npt.NDArray[np.bool_], long_unknown: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """Index ranges decoded independently: split at time gaps and at the edges of long unknown runs."""
    n = breaks.shape[0]
    cut = breaks.copy()
    cut[1:] |= long_unknown[1:] != long_unknown[:-1]
    bounds = [0, *(np.flatnonzero(cut[1:]) + 1).tolist(), n]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _collect(
    start: FloatArray,
    end: FloatArray,
    proba: FloatArray,
    state: npt.NDArray[np.intp],
    unknown: npt.NDArray[np.bool_],
    long_unknown: npt.NDArray[np.bool_],
    breaks: npt.NDArray[np.bool_],
) -> list[Segment]:
    """Turn per-window states into segments. Adjacent segments meet halfway between window centres."""
    # code: phase index, or -1 for a long-unknown window; bridged (short) unknown windows take the code
    # of the segment they sit in and never start or end one.
    n = state.shape[0]
    code = np.where(long_unknown, -1, state)
    bridged = unknown & ~long_unknown
    keep = np.flatnonzero(~bridged)
    if keep.size == 0:
        return []
    centre = (start + end) / 2.0
    # breaks_upto[i]: time gaps among breaks[0 .. i-1], so that "a gap lies in (a, b]" is one subtraction.
    breaks_upto = np.concatenate([[0], np.cumsum(breaks)])
    a, b = keep[:-1], keep[1:]
    # Positions j in keep where a new segment starts: the code changes, or a gap lies in between.
    cuts = np.flatnonzero((code[a] != code[b]) | (breaks_upto[b + 1] - breaks_upto[a + 1] > 0)) + 1
    out: list[Segment] = []
    seg_lo = 0  # position in keep
    for j in [*cuts.tolist(), keep.size]:
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
