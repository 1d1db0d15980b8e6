"""Fitting the onset model of the "training started" alarm: windows that straddle a run's start.

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

    .venv/bin/python -m phasescope.classify.lab.onset_fit ../shared/data \
        -o src/phasescope/models/alarm_model.json

The constants (in `classify.onset`) were fixed before any alarm figure with this model was seen (the 15 s
window after the 30 s and 15 s figures of the plain classifier had been).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phasescope.classify import decide
from phasescope.classify.lab import alert_eval, train
from phasescope.classify.lab.alert_eval import AlarmCase, build_cases
from phasescope.classify.lab.dataset import Example, load_examples
from phasescope.classify.model import PhaseModel, WindowPredictions
from phasescope.classify.onset import (
    ALARM_MODEL_VERSION,
    ONSET_SHARE,
    ONSET_STRIDE_S,
    ONSET_WINDOW_S,
    PRE_LABEL,
    LiveWindows,
    live_windows,
    onset_config,
    predict_windows,
)
from phasescope.features import WindowConfig, device_limits
from phasescope.schema import PAPER_SIGNALS, PHASES, FloatArray, Trace


def case_windows(case: AlarmCase, config: WindowConfig | None = None, use_table: bool = True) -> LiveWindows:
    """The windows the live alarm judges on a case's watched span: ticks replayed over its context and watched
    trace (`AlarmCase.fed`, the first tick at its first sample), kept from the first that ends after the
    watched start. Only those are labelled and scored; the alarm's CUSUM starts at the first of them."""
    lw = live_windows(case.fed, config, use_table)
    return lw.take(lw.end > float(case.trace.time[0])) if len(case.trace) else lw


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
