"""An onset model for the "training started" alarm: windows that straddle a run's start, seen in training.

The shipped window classifier is fitted on labelled spans cut to their start and end, so it never sees a
window that holds the last seconds before a training run and the first seconds of it. A 30 s window then
needs most of its data from the run before the classifier calls it training, and the alarm waits for that.

The onset model is fitted on what the alarm actually watches (`alert_eval.AlarmCase.trace`): for a training
run with a recorded start, its pre-roll (marker bursts, settling; from the end of the previous labelled span
on the device, else the file's first sample) to the run's end, in windows of `ONSET_WINDOW_S` seconds every
`ONSET_STRIDE_S`. Each window's features are the ones the live alarm computes for it: on the last
`HISTORY_S` seconds of the trace at its tick (`live_windows`, the same `tick_windows` that `OnsetAlarm`
runs), so the memory ramp and plateau never count from a labelled start the live alarm cannot see. The
ticks are replayed from the case's context (`AlarmCase.context`: up to `HISTORY_S` of the device's telemetry
before the watched start, not past a labelled training span), and only the windows that end after the
watched start are the case's (`case_windows`), so its first windows hold the history live would hold. A
window is labelled training when at least `ONSET_SHARE` of it lies after the recorded start, and "other"
before that (the pre-roll is GEMM marker bursts and settling; only p_training matters to the alarm). Every
other case keeps its own label. The start times are training labels only: prediction reads telemetry alone.

The model is an ordinary `PhaseModel` (same features, LightGBM text boosters in JSON), so it loads with
`PhaseModel.load(path)` and is used by the alarm only; the window classifier is unchanged. It is fitted with
non-training spans watched with their pre-roll too where there is one (`build_cases(preroll_all=True)`), so a
marker burst followed by an inference start-up is a negative example. Its card holds the alarm threshold and
drift, chosen by `calibrate` (the rule the nested CV in `benchmarks/bench_alerts.py --onset` measures). Refit
with

    .venv/bin/python -m phasescope.classify.onset ../shared/data -o src/phasescope/models/alarm_model.json

The constants below were fixed before any alarm figure with this model was seen (the 15 s window after the
30 s and 15 s figures of the plain classifier had been).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from phasescope.classify import alert_eval, decide, train
from phasescope.classify.alert_eval import AlarmCase, build_cases
from phasescope.classify.dataset import Example, load_examples
from phasescope.classify.model import PhaseModel, UnknownRules, WindowPredictions
from phasescope.features import (
    FEATURE_NAMES,
    WindowConfig,
    WindowFeatures,
    device_limits,
    sample_interval,
    window_features,
)
from phasescope.schema import PAPER_SIGNALS, PHASES, FloatArray, Trace

ONSET_WINDOW_S = 15.0  # shorter than the classifier's 30 s: less data needed from the run
ONSET_STRIDE_S = 5.0  # the alarm's cadence; also gives several straddling windows per run start
ONSET_SHARE = 0.5  # a straddling window is "training" once at least half of it lies after the start
PRE_LABEL = "other"  # the pre-roll before a SensorGuard run: marker GEMM bursts and settling
ALARM_MODEL_FILE = "alarm_model.json"
ALARM_MODEL_VERSION = "onset-0.3.0"
HISTORY_S = 120.0  # seconds of history the alarm judges at each tick, live and in the table (`live_windows`)


def onset_config() -> WindowConfig:
    return WindowConfig(window_s=ONSET_WINDOW_S, stride_s=ONSET_STRIDE_S)


# --- the windows the live alarm judges -------------------------------------------------------------------
# Live, the alarm is handed each device's last HISTORY_S seconds every ONSET_STRIDE_S of data time, and the
# features that count from a trace's first sample (the memory ramp and plateau, the power floor) count from
# the start of that history. The table and the evaluation replay the same ticks on a whole case trace, so
# every window's features are the ones the live alarm computes for it: one definition, `tick_windows`.


def trailing(trace: Trace, end: float, history_s: float = HISTORY_S) -> Trace:
    """The samples of `trace` in (end - history_s, end]: what the live path hands the alarm at `end`."""
    lo, hi = np.searchsorted(trace.time, [end - history_s, end], side="right")
    return trace.take(slice(int(lo), int(hi)))


def tick_windows(history: Trace, config: WindowConfig, last_end: float, use_table: bool = True
                 ) -> WindowFeatures | None:
    """The windows one alarm tick judges: those of `history` ending after `last_end`, in time order.

    `history` is trimmed to the last `HISTORY_S` seconds before its newest sample (live hands no more, so
    this changes nothing there). None when it holds too little to window (the alarm then waits).
    """
    if len(history) < 2:
        return None
    order = np.argsort(history.time, kind="stable")
    if np.any(np.diff(order) < 0):
        history = history.take(order)
    history = trailing(history, float(history.time[-1]))
    wf = window_features(history, config, use_table=use_table)
    keep = np.argsort(wf.end, kind="stable")
    keep = keep[wf.end[keep] > last_end]
    return WindowFeatures(wf.start[keep], wf.end[keep], wf.values[keep], wf.names, wf.n_samples[keep],
                          wf.sufficient[keep], wf.interval_s, wf.window_samples, wf.present_signals)


@dataclass
class LiveWindows:
    """Every window a live `OnsetAlarm` judges on one trace, with its features, in the order it is fed."""

    start: FloatArray
    end: FloatArray
    values: FloatArray  # (n, features)
    sufficient: np.ndarray
    n_samples: np.ndarray
    interval_s: FloatArray  # per window: the grid spacing of the history it was cut from
    present: list[frozenset[str]]  # distinct signal sets the histories held
    present_id: np.ndarray  # per window, index into `present`

    def take(self, keep: np.ndarray) -> LiveWindows:
        return LiveWindows(self.start[keep], self.end[keep], self.values[keep], self.sufficient[keep],
                           self.n_samples[keep], self.interval_s[keep], self.present, self.present_id[keep])


def tick_times(time: FloatArray, every_s: float = ONSET_STRIDE_S) -> FloatArray:
    """Data times the live path runs the alarm at: the first sample, then the first sample at least
    `every_s` after the previous run (`live_classify.LiveClassifier.update`)."""
    out: list[float] = []
    if time.size == 0:
        return np.zeros(0)
    i = 0
    while i < time.size:
        t = float(time[i])
        out.append(t)
        i = int(np.searchsorted(time, t + every_s, side="left"))
    return np.asarray(out, dtype=np.float64)


def live_windows(trace: Trace, config: WindowConfig | None = None, use_table: bool = True) -> LiveWindows:
    """Replay the live alarm's ticks over `trace` and collect the windows each tick judges (`tick_windows`).

    Rows with no data at all are dropped from the history, as `live_classify` does, but still tick. Windows
    cut from a history sampled outside the models' validated rate range (`UnknownRules`), which no model
    judges, keep their times but carry NaN features (computing them would be most of the cost).
    """
    cfg = config or onset_config()
    if len(trace) and np.any(np.diff(trace.time) < 0):
        trace = trace.take(np.argsort(trace.time, kind="stable"))
    data = trace.take(trace.rows_with_data())
    last_end = -math.inf
    parts: list[WindowFeatures] = []
    rules = UnknownRules()
    for t in tick_times(trace.time).tolist():
        history = trailing(data, t)
        dt = sample_interval(history.time)
        if np.isfinite(dt) and not rules.min_interval_s <= dt <= rules.max_interval_s:
            # No model judges these windows (a 1-per-minute log): keep their times, skip their features.
            history = Trace(history.device, history.time, {}, history.meta)
        wf = tick_windows(history, cfg, last_end, use_table)
        if wf is None or wf.end.size == 0:
            continue
        last_end = float(wf.end[-1])
        parts.append(wf)
    presents: list[frozenset[str]] = []
    pid: list[np.ndarray] = []
    for wf in parts:
        p = frozenset(wf.present_signals)
        if p not in presents:
            presents.append(p)
        pid.append(np.full(wf.end.size, presents.index(p)))
    cat = np.concatenate
    if not parts:
        z = np.zeros(0)
        return LiveWindows(z, z, np.zeros((0, len(FEATURE_NAMES))), z.astype(bool), z.astype(np.int64), z, [],
                           z.astype(np.int64))
    return LiveWindows(cat([w.start for w in parts]), cat([w.end for w in parts]),
                       cat([w.values for w in parts]), cat([w.sufficient for w in parts]).astype(bool),
                       cat([w.n_samples for w in parts]),
                       cat([np.full(w.end.size, w.interval_s) for w in parts]), presents, cat(pid))


def case_windows(case: AlarmCase, config: WindowConfig | None = None, use_table: bool = True) -> LiveWindows:
    """The windows the live alarm judges on a case's watched span: ticks replayed over its context and watched
    trace (`AlarmCase.fed`, the first tick at its first sample), kept from the first that ends after the
    watched start. Only those are labelled and scored; the alarm's CUSUM starts at the first of them."""
    lw = live_windows(case.fed, config, use_table)
    return lw.take(lw.end > float(case.trace.time[0])) if len(case.trace) else lw


def predict_windows(model: PhaseModel, lw: LiveWindows) -> WindowPredictions:
    """The model's answer for each live window, as `OnsetAlarm.update` gets it tick by tick.

    Windows are grouped by what decides the model's answer besides their features (the signals their
    history held, and whether its sample interval is in the model's range) and judged group by group.
    """
    n = lw.end.size
    proba = np.full((n, len(PHASES)), np.nan)
    labels = ["unknown"] * n
    r = model.rules
    in_range = (lw.interval_s >= r.min_interval_s) & (lw.interval_s <= r.max_interval_s)
    for pid in np.unique(lw.present_id):
        for ok in (True, False):
            idx = np.flatnonzero((lw.present_id == pid) & (in_range == ok))
            if not idx.size:
                continue
            wf = WindowFeatures(lw.start[idx], lw.end[idx], lw.values[idx], FEATURE_NAMES, lw.n_samples[idx],
                                lw.sufficient[idx], float(lw.interval_s[idx[0]]), 0, sorted(lw.present[pid]))
            got, called = model.predict_features(wf, set(lw.present[pid]), evidence=False)[:2]
            proba[idx] = got
            for i, lab in zip(idx.tolist(), called, strict=True):
                labels[i] = lab
    return WindowPredictions(lw.start, lw.end, proba, labels, [], model.version, [{}] * n)


def share_after(start: FloatArray, end: FloatArray, onset: float) -> FloatArray:
    """Share of each window [start, end) that lies at or after `onset` (0..1)."""
    width = np.maximum(end - start, 1e-9)
    return np.clip((end - np.maximum(start, onset)) / width, 0.0, 1.0)


def window_labels(case: AlarmCase, start: FloatArray, end: FloatArray) -> np.ndarray:
    """Class index per window of a case's watched trace (see the module docstring)."""
    if case.onset is None:
        own = np.full(start.size, PHASES.index(case.label))
        if not math.isfinite(case.span_from):
            return own
        # Watched with its pre-roll: the windows mostly before the labelled span are the pre-roll's.
        return np.where(share_after(start, end, case.span_from) >= ONSET_SHARE, own, PHASES.index(PRE_LABEL))
    if not case.onset_known:  # labelled training from its first sample
        return np.full(start.size, PHASES.index("training"))
    trained = share_after(start, end, case.onset) >= ONSET_SHARE
    return np.where(trained, PHASES.index("training"), PHASES.index(PRE_LABEL))


def case_example(case: AlarmCase) -> Example:
    """A stand-in `Example` for a case, so that `train.fit_model` can weigh runs and pick subsets."""
    return Example(case.trace, case.label, case.family, "", case.source, case.run, "", case.device)


@dataclass
class OnsetTable(train.WindowTable):
    """`train.WindowTable` of the alarm's live windows, with each case's windows kept for prediction."""

    live: list[LiveWindows] = field(default_factory=list)  # per case, with the GPU table (as live predicts)


def build_onset_table(cases: Sequence[AlarmCase], config: WindowConfig | None = None) -> OnsetTable:
    """Windows of every case's watched trace as the live alarm judges them (`case_windows`: with the case's
    context as history), labelled per window; the layout of `train.build_table`."""
    cfg = config or onset_config()
    t0 = time.perf_counter()
    examples = [case_example(c) for c in cases]
    Xs, ys, exs, copies, suff, ivs = [], [], [], [], [], []
    present: list[frozenset[str]] = []
    live: list[LiveWindows] = []
    for i, (case, ex) in enumerate(zip(cases, examples, strict=True)):
        present.append(frozenset(ex.trace.present_signals()) & set(PAPER_SIGNALS))
        variants = [(1, True)]
        if device_limits(ex.trace, True) != device_limits(ex.trace, False):
            variants.append((0, False))  # as `build_table`: also learn to answer without the GPU table
        for copy, use_table in variants:
            lw = case_windows(case, cfg, use_table=use_table)
            if copy == 1:
                live.append(lw)
            n = lw.end.size
            Xs.append(lw.values)
            ys.append(window_labels(case, lw.start, lw.end))
            exs.append(np.full(n, i))
            copies.append(np.full(n, copy))
            suff.append(lw.sufficient)
            ivs.append(lw.interval_s)
    cat = np.concatenate
    return OnsetTable(cat(Xs), cat(ys), cat(exs), cat(copies), cat(suff).astype(bool), cat(ivs),
                      examples, present, time.perf_counter() - t0, live=live)


def case_predictor(cases: Sequence[AlarmCase], table: OnsetTable) -> alert_eval.Predictor:
    """An `alert_eval.Predictor` for the cases the table was built from: each case's live windows (with its
    context, as in the table: the refit and the nested CV judge the same windows)."""
    by_trace = {id(c.trace): lw for c, lw in zip(cases, table.live, strict=True)}

    def predict(model: Any, trace: Trace) -> WindowPredictions:
        return predict_windows(model, by_trace[id(trace)])

    return predict


def fit_onset(table: train.WindowTable, runs: set[str] | None = None,
              subsets: Sequence[str] | None = None, card: dict[str, Any] | None = None) -> PhaseModel:
    """The onset model fitted on the table's cases whose run is in `runs` (None: all)."""
    ids = np.array([i for i, e in enumerate(table.examples) if runs is None or e.run in runs], dtype=np.int64)
    model = train.fit_model(table, ids, subsets=subsets, card=card, config=onset_config(), calibrated=False)
    model.version = ALARM_MODEL_VERSION
    return model


def card(table: train.WindowTable, seconds: float) -> dict[str, Any]:
    runs = {e.run for e in table.examples}
    starts = sum(1 for e, lab in _first_labels(table) if lab)
    return {
        "purpose": "training-started alarm only (phasescope.classify.onset); not the window classifier",
        "window_s": ONSET_WINDOW_S,
        "stride_s": ONSET_STRIDE_S,
        "onset_share": ONSET_SHARE,
        "cases": len(table.examples),
        "runs": len(runs),
        "runs_with_recorded_start": starts,
        "windows": int(table.y.size),
        "fit_seconds": round(seconds, 1),
        "evaluation": "benchmarks/bench_alerts.py --onset --preroll-all (nested CV); see docs/EVALUATION.md",
    }


def _first_labels(table: train.WindowTable) -> list[tuple[Example, bool]]:
    """Per case, whether it has both pre-roll and training windows (a recorded start)."""
    out = []
    for i, e in enumerate(table.examples):
        ys = set(table.y[table.ex == i].tolist())
        out.append((e, e.label == "training" and len(ys) > 1))
    return out


def load_alarm_model(path: str | None = None) -> PhaseModel:
    """The shipped alarm model (or one at `path`)."""
    if path is not None:
        return PhaseModel.load(path)
    text = resources.files("phasescope.models").joinpath(ALARM_MODEL_FILE).read_text(encoding="utf-8")
    return PhaseModel.from_dict(json.loads(text), f"phasescope/models/{ALARM_MODEL_FILE}")


def needed_subsets(traces: Sequence[Trace]) -> list[str]:
    """The largest signal subset each trace has: the only boosters a prediction on them will use."""
    chosen: set[str] = set()
    for t in traces:
        present = set(t.present_signals()) & set(PAPER_SIGNALS)
        for name, sig in train.SUBSETS.items():
            if sig <= present:
                chosen.add(name)
                break
    return [n for n in train.SUBSETS if n in chosen]


def calibrate(cases: Sequence[AlarmCase], examples: Sequence[Example], table: OnsetTable,
              k: int = 4, seed: int = 0) -> decide.AlarmParams:
    """The alarm parameters for the shipped model, by the rule the nested CV measures.

    Out-of-fold predictions (stratified run folds, as `bench_alerts.py`) over all cases, then
    `alert_eval.choose_params`: the same procedure each outer fold of the nested CV applied to its inner data.
    """
    folds = alert_eval.run_folds([c.run for c in cases], k, seed)
    folds |= train.stratified_run_folds(examples, k, seed)
    oof: list[AlarmCase] = []
    subsets = needed_subsets([c.trace for c in cases])
    predict = case_predictor(cases, table)
    for f in range(k):
        print(f"calibrating the alarm: fold {f + 1}/{k}", file=sys.stderr, flush=True)
        model = fit_onset(table, {r for r, g in folds.items() if g != f}, subsets)
        held = [c for c in cases if folds[c.run] == f]
        oof += alert_eval.predict_cases(model, held, predict)
    return alert_eval.choose_params(oof, decide.AlarmParams(window_s=ONSET_WINDOW_S))


def alarm_params(model: PhaseModel) -> decide.AlarmParams:
    """The alarm parameters stored with an alarm model (its card), else the a-priori defaults."""
    got = model.card.get("alarm_params") if isinstance(model.card, dict) else None
    if isinstance(got, dict):
        return decide.AlarmParams(**{k: float(v) for k, v in got.items()})
    return decide.AlarmParams(window_s=model.config.window_s)


@dataclass
class OnsetAlarm:
    """Streaming "training started" alarm for one device on the onset model (for the live path).

    Call `update(trace)` with the device's recent telemetry at the alarm cadence; only its last `HISTORY_S`
    seconds are read (`tick_windows`, the same windows and features the table and the evaluation use). It
    feeds the windows that end after the last one seen into a `decide.TrainingAlarm` and returns True
    exactly when the alarm fires.
    """

    model: PhaseModel
    params: decide.AlarmParams
    alarm: decide.TrainingAlarm = field(init=False)
    last_end: float = -math.inf

    def __post_init__(self) -> None:
        self.alarm = decide.TrainingAlarm(self.params)

    @classmethod
    def shipped(cls) -> OnsetAlarm:
        model = load_alarm_model()
        return cls(model, alarm_params(model))

    def windows(self, trace: Trace) -> WindowFeatures | None:
        """The windows the next `update(trace)` would judge (for tests and diagnostics)."""
        return tick_windows(trace, self.model.config, self.last_end)

    def update(self, trace: Trace) -> bool:
        wf = self.windows(trace)
        if wf is None:
            return False
        proba = self.model.predict_features(wf, set(wf.present_signals), evidence=False)[0]
        p = proba[:, PHASES.index("training")].copy()
        p[~np.isfinite(proba).all(axis=1)] = np.nan  # not judged (as `decide.p_training`)
        fired = False
        for end, q in zip(wf.end.tolist(), p.tolist(), strict=True):
            self.last_end = end
            fired |= self.alarm.update(end, q)
        return fired

    @property
    def active(self) -> bool:
        return self.alarm.active


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fit the alarm's onset model on labelled recordings.")
    ap.add_argument("data", nargs="+", help="labels tables or folders holding labels.csv")
    ap.add_argument("-o", "--output", required=True, help="model file to write (JSON)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cases: list[AlarmCase] = []
    for d in args.data:
        cases += build_cases(d, preroll_all=True)
    table = build_onset_table(cases)
    print(f"{len(cases)} cases, {table.y.size} windows ({time.perf_counter() - t0:.1f} s)", file=sys.stderr,
          flush=True)
    examples = [e for d in args.data for e in load_examples(d)]
    params = calibrate(cases, examples, table)
    print(f"alarm threshold {params.threshold} nats, drift {params.drift}; fitting the shipped model",
          file=sys.stderr, flush=True)
    model = fit_onset(table)
    model.card = card(table, time.perf_counter() - t0) | {"alarm_params": params.to_dict()}
    model.save(args.output)
    print(f"wrote {args.output}: {len(cases)} cases, {table.y.size} windows, "
          f"{len(model.submodels)} submodels, alarm threshold {params.threshold} nats, drift {params.drift}, "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
