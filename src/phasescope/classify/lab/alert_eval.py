"""Measure the "training started" alarm on labelled real data, honestly.

The figures are time-to-detect (from a training run's recorded start to the alarm) and false alerts per
GPU-hour of non-training data. Three rules keep them honest:

- Every window's probability comes from a model that never saw the window's run: models are fitted on
  run-grouped folds and predict only the held-out fold ("out of fold").
- The alarm's parameters are chosen by nested cross-validation: for each outer fold, the grid point is
  picked on out-of-fold predictions of the other folds' runs, made by models fitted without the outer
  fold, and only then scored on the outer fold. No parameter is chosen on the data it is scored on.
- A training run's "start" is the labelled `t_from` where the file holds telemetry from before it (the
  SensorGuard runs start with marker bursts); alerts before the start are false alerts. Runs labelled
  training from their first sample have no known start; their first-alert delay is reported apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.classify import decide
from phasescope.classify.lab.dataset import Example, load_examples
from phasescope.schema import FloatArray, Trace

# Grid the nested CV chooses from: (threshold nats, drift nats). Fixed before any data was seen.
ALARM_GRID: tuple[tuple[float, float], ...] = tuple(
    (h, k) for h in (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0) for k in (0.0, 0.5, 1.0)
)
MAX_FALSE_PER_GPU_HOUR = 0.01  # the target the nested selection must respect on its own (inner) data
MIN_PREROLL_S = 5.0  # a run has a known start when the file holds at least this much telemetry before it

Fitter = Callable[[Sequence[Example]], Any]  # labelled examples -> a PhaseModel
Predictor = Callable[[Any, Trace], Any]  # (model, trace) -> WindowPredictions


@dataclass
class AlarmCase:
    """One device's telemetry with what the alarm should and should not do on it."""

    run: str
    device: str
    source: str
    family: str
    label: str
    trace: Trace  # what the alarm watches: for a training run, from the file's start to the run's end
    onset: float | None  # training start; None for non-training data
    onset_known: bool  # False when the trace begins already in training
    starts: FloatArray = field(default_factory=lambda: np.zeros(0))  # of the windows, in time order
    ends: FloatArray = field(default_factory=lambda: np.zeros(0))
    p_train: FloatArray = field(default_factory=lambda: np.zeros(0))
    # Non-training case watched from before its labelled span (`build_cases(preroll_all=True)`): the
    # labelled start; the telemetry before it (marker bursts, settling) is non-training too.
    span_from: float = math.nan
    # The device's telemetry just before `trace` that the live alarm would still hold when `trace` begins
    # (`context_trace`). The onset evaluation replays the alarm over it too (`fed`), so a case's first windows
    # have their history; nothing in it is scored. The 30 s classifier's rows ignore it.
    context: Trace | None = None

    @property
    def fed(self) -> Trace:
        """What the alarm is fed for this case: the context, then the watched trace."""
        if self.context is None or len(self.context) == 0:
            return self.trace
        return Trace.concat([self.trace, self.context])  # sorted by time; the watched trace's meta

    def _span(self) -> tuple[float, float]:
        stop = float(self.trace.time[-1]) if self.onset is None else self.onset
        return float(self.trace.time[0]), stop

    @property
    def exposure_s(self) -> float:
        """Seconds of non-training telemetry watched (where any alert is false)."""
        if len(self.trace) == 0:
            return 0.0
        lo, hi = self._span()
        return max(0.0, hi - lo)

    @property
    def judged_exposure_s(self) -> float:
        """Seconds of non-training telemetry inside windows the model judged: where an alert could fire.

        A trace the model answers "unknown" throughout (a 1-per-minute log) cannot raise a false alert, so
        counting its hours would flatter the rate; this is the honest denominator.
        """
        if len(self.trace) == 0 or self.ends.size == 0:
            return 0.0
        lo, hi = self._span()
        ok = np.isfinite(self.p_train)
        a = np.clip(self.starts[ok], lo, hi)
        b = np.clip(self.ends[ok], lo, hi)
        if a.size == 0:
            return 0.0
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
        reach = np.maximum.accumulate(b)  # union length of the intervals, without a loop
        prev = np.concatenate([[a[0]], reach[:-1]])
        return float(np.maximum(0.0, b - np.maximum(a, prev)).sum())


@dataclass
class CaseOutcome:
    case: AlarmCase
    false_alerts: int
    delay_s: float  # first alert at/after the onset minus the onset; inf when it never came; nan if no onset


@dataclass
class AlarmScore:
    outcomes: list[CaseOutcome]

    def delays(self, onset_known: bool = True) -> FloatArray:
        return np.array([o.delay_s for o in self.outcomes
                         if o.case.onset is not None and o.case.onset_known == onset_known], dtype=np.float64)

    def median_delay(self, onset_known: bool = True) -> float:
        d = self.delays(onset_known)
        return float(np.median(d)) if d.size else float("nan")  # misses count as infinite delays

    def detected(self, onset_known: bool = True) -> tuple[int, int]:
        d = self.delays(onset_known)
        return int(np.isfinite(d).sum()), int(d.size)

    def false_alerts(self, label: str | None = None, exclude_source: str | None = None
                     ) -> tuple[int, float, float]:
        """(false alerts, GPU-hours watched, GPU-hours judged) of non-training telemetry, for one label
        ("pre-start" for the telemetry before a training run) or without one source."""
        n, secs, judged = 0, 0.0, 0.0
        for o in self.outcomes:
            lab = o.case.label if o.case.onset is None else "pre-start"
            if label is not None and lab != label:
                continue
            if exclude_source is not None and o.case.source == exclude_source:
                continue
            n += o.false_alerts
            secs += o.case.exposure_s
            judged += o.case.judged_exposure_s
        return n, secs / 3600.0, judged / 3600.0

    def false_per_gpu_hour(self) -> float:
        """False alerts per GPU-hour of judged non-training telemetry."""
        n, _, hours = self.false_alerts()
        return n / hours if hours > 0 else float("nan")

    def first_called_delay(self, min_p: float = 0.5) -> FloatArray:
        """Per run with a recorded start: end of the first window after the start with p_training >= min_p,
        minus the start. The model's own latency, which no alarm rule on its output can beat."""
        out = []
        for o in self.outcomes:
            c = o.case
            if c.onset is None or not c.onset_known:
                continue
            hit = c.ends[(c.ends >= c.onset) & (c.p_train >= min_p)]
            out.append(float(hit[0] - c.onset) if hit.size else math.inf)
        return np.array(out, dtype=np.float64)


def score(cases: Sequence[AlarmCase], params: decide.AlarmParams) -> AlarmScore:
    out: list[CaseOutcome] = []
    for c in cases:
        fired = decide.alarm_times(c.ends, c.p_train, params)
        if c.onset is None:
            out.append(CaseOutcome(c, int(fired.size), float("nan")))
            continue
        false = int((fired < c.onset).sum())
        after = fired[fired >= c.onset]
        delay = float(after[0] - c.onset) if after.size else math.inf
        out.append(CaseOutcome(c, false, delay))
    return AlarmScore(out)


def choose_params(cases: Sequence[AlarmCase], base: decide.AlarmParams,
                  grid: Sequence[tuple[float, float]] = ALARM_GRID) -> decide.AlarmParams:
    """The grid point with the shortest median delay among those within the false-alert target on `cases`;
    ties go to the higher threshold. If none meets the target, the one with the fewest false alerts."""
    best: tuple[Any, ...] | None = None
    chosen = base
    for h, k in grid:
        p = decide.AlarmParams(threshold=h, drift=k, floor=base.floor, window_s=base.window_s,
                               max_gap_s=base.max_gap_s)
        s = score(cases, p)
        n_false, _, hours = s.false_alerts()
        ok = n_false <= MAX_FALSE_PER_GPU_HOUR * hours
        key = (not ok, n_false if not ok else 0, s.median_delay(), -h, -k)
        if best is None or key < best:
            best, chosen = key, p
    return chosen


# --- building cases from a labels table --------------------------------------------------------------


def preroll_from(ex: Example, examples: Sequence[Example], full: Trace) -> tuple[float, bool]:
    """Where the telemetry before a labelled span begins: (time, exclusive).

    The end of the previous labelled span on the same device (exclusive: its last sample is that span's),
    else the file's first sample. One rule for training and non-training spans alike.
    """
    t_from = float(ex.trace.time[0])
    prev = [float(o.trace.time[-1]) for o in examples
            if o is not ex and o.path == ex.path and o.device == ex.device and len(o.trace)
            and float(o.trace.time[-1]) <= t_from]
    return (max(prev), True) if prev else (float(full.time[0]), False)


def preroll_trace(ex: Example, full: Trace, start: tuple[float, bool]) -> Trace:
    """The span `ex` with its pre-roll from the device's file, from `start` (`preroll_from`'s answer), meta
    of both merged."""
    lo, exclusive = start
    watched = full.slice_time(np.nextafter(lo, math.inf) if exclusive else lo, float(ex.trace.time[-1]))
    watched.meta = {**full.meta, **ex.trace.meta}  # a copy: the file's traces are shared
    return watched


def context_trace(watched: Trace, ex: Example, examples: Sequence[Example], full: Trace, history_s: float
                  ) -> Trace | None:
    """The device's telemetry before `watched` that a live alarm would still hold when `watched` begins.

    It runs from the latest of: `history_s` before the watched start (the alarm reads no further back), the
    end of the last labelled training span on the device that ends by then (exclusive: its alerts are that
    run's, and live the alarm would already have fired during it), and the file's first sample; up to the
    watched start (exclusive). None when that is empty.
    """
    t0 = float(watched.time[0])
    ends = [float(o.trace.time[-1]) for o in examples
            if o.label == "training" and o.path == ex.path and o.device == ex.device and len(o.trace)
            and float(o.trace.time[-1]) <= t0]
    keep = (full.time > max([t0 - history_s, *ends])) & (full.time < t0)  # live reads (t - history_s, t]
    return full.take(keep) if keep.any() else None


def build_cases(labels: str | Path, read: Callable[[str], list[Trace]] | None = None,
                preroll_all: bool = False) -> list[AlarmCase]:
    """Alarm cases from a labels table: each labelled device span, training spans with their pre-roll.

    A pre-roll runs from the end of the previous labelled span on that device, or the file's first sample
    (`preroll_from`). With `preroll_all`, a non-training span is watched with its pre-roll too, as a live
    alarm would see it: a marker burst followed by an inference server starting up must not look like a
    training run starting. Every labelled span is one case: none is watched as part of another's pre-roll.
    Each case also carries its `context` (`context_trace`): up to the alarm's history before the watched
    start, replayed but not scored, so the onset evaluation's first windows are the ones live would judge.
    """
    from phasescope.classify.onset import HISTORY_S  # here: onset imports this module
    from phasescope.sources.replay import read as default_read

    reader = read or default_read
    examples = load_examples(labels, reader=reader)
    files: dict[str, list[Trace]] = {}

    def full_trace(ex: Example) -> Trace | None:
        if "+" in ex.path:  # joined from several files (Alibaba): no pre-roll to add
            return None
        if ex.path not in files:
            files[ex.path] = reader(ex.path)
        for t in files[ex.path]:
            if t.device.uuid == ex.device:
                return t
        return None

    cases: list[AlarmCase] = []
    for ex in examples:  # training spans first, then the rest (the order the folds and tables keep)
        if ex.label != "training" or len(ex.trace) == 0:
            continue
        full = full_trace(ex)
        onset = float(ex.trace.time[0])
        # A start is recorded when the file holds telemetry before it; the watched pre-roll then follows
        # the rule every span uses, so no other labelled span is watched twice or relabelled as pre-roll.
        known = full is not None and len(full) > 0 and onset - float(full.time[0]) >= MIN_PREROLL_S
        watched = preroll_trace(ex, full, preroll_from(ex, examples, full)) if known and full else ex.trace
        context = context_trace(watched, ex, examples, full, HISTORY_S) if full else None
        cases.append(AlarmCase(ex.run, ex.device, ex.source, ex.family, ex.label, watched, onset, known,
                               context=context))
    for ex in examples:
        if ex.label == "training" or len(ex.trace) == 0:
            continue
        watched, span_from, context = ex.trace, math.nan, None
        full = full_trace(ex)
        if full is not None and len(full):
            t_from = float(ex.trace.time[0])
            start = preroll_from(ex, examples, full)
            if preroll_all and t_from - start[0] >= MIN_PREROLL_S:
                watched, span_from = preroll_trace(ex, full, start), t_from
            context = context_trace(watched, ex, examples, full, HISTORY_S)
        cases.append(AlarmCase(ex.run, ex.device, ex.source, ex.family, ex.label, watched, None, False,
                               span_from=span_from, context=context))
    return cases


# --- out-of-fold predictions and nested selection ------------------------------------------------------


def run_folds(runs: Sequence[str], k: int, seed: int = 0) -> dict[str, int]:
    """Assign each run to one of k folds at random (fixed seed): rows of one run never straddle folds."""
    uniq = sorted(set(runs))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(uniq))
    return {uniq[i]: int(j % k) for j, i in enumerate(order)}


def predict_cases(model: Any, cases: Sequence[AlarmCase], predict: Predictor) -> list[AlarmCase]:
    out: list[AlarmCase] = []
    for c in cases:
        pred = predict(model, c.trace)
        order = np.argsort(np.asarray(pred.end), kind="stable")
        out.append(replace(c, starts=np.asarray(pred.start, dtype=np.float64)[order],
                           ends=np.asarray(pred.end, dtype=np.float64)[order],
                           p_train=decide.p_training(pred)[order]))
    return out


@dataclass
class NestedResult:
    outer: AlarmScore  # every case scored with the parameters chosen without its fold
    chosen: list[tuple[int, decide.AlarmParams]]  # per outer fold
    predicted: list[AlarmCase]  # every case with its out-of-fold window probabilities
    inner: list[list[AlarmCase]] = field(default_factory=list)  # per outer fold, what its choice saw


def nested_alarm_cv(
    examples: Sequence[Example],
    cases: Sequence[AlarmCase],
    fit: Fitter,
    predict: Predictor,
    base: decide.AlarmParams,
    k: int = 4,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> NestedResult:
    """Out-of-fold predictions with the alarm's parameters picked by an inner CV inside each outer fold."""
    from phasescope.classify.lab.train import stratified_run_folds

    # Runs dealt family by family (as `phasescope eval --split run`); a case whose run has no example
    # (cannot happen with one labels table) falls back to a seeded random fold.
    folds = run_folds([c.run for c in cases], k, seed) | stratified_run_folds(examples, k, seed)
    say = progress or (lambda _msg: None)
    outcomes: list[CaseOutcome] = []
    chosen: list[tuple[int, decide.AlarmParams]] = []
    predicted: list[AlarmCase] = []
    inners: list[list[AlarmCase]] = []
    for f in range(k):
        train_ex = [e for e in examples if folds[e.run] != f]
        inner: list[AlarmCase] = []
        for g in (g for g in range(k) if g != f):
            say(f"outer fold {f + 1}/{k}: inner fold {g + 1}")
            model = fit([e for e in train_ex if folds[e.run] != g])
            inner += predict_cases(model, [c for c in cases if folds[c.run] == g], predict)
        params = choose_params(inner, base)
        chosen.append((f, params))
        inners.append(inner)
        say(f"outer fold {f + 1}/{k}: chose threshold={params.threshold} drift={params.drift}")
        model = fit(train_ex)
        held_out = predict_cases(model, [c for c in cases if folds[c.run] == f], predict)
        predicted += held_out
        outcomes += score(held_out, params).outcomes
    return NestedResult(AlarmScore(outcomes), chosen, predicted, inners)
