"""Fit and evaluate the phase model on labelled examples.

Design:
- Window features for every example are computed once (`build_table`), in two copies: with the device
  limits (trace columns or the known-GPU table) and without the table, so the model also learns to
  answer when the device model is unknown.
- One LightGBM multiclass booster per signal subset (`SUBSETS`), each fitted only on the features its
  signals allow and only on examples that have those signals. Prediction picks the largest subset the
  trace has (see `model.PhaseModel.choose`), so a missing signal never reads as a zero.
- Weights: every class weighs the same in total, and within a class every run weighs the same, so the
  many idle bystander GPUs and the long runs do not drown the short evasion runs.
- Evaluation splits are grouped by run: a run never sits on both sides (`folds`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from phasescope.classify.lab.dataset import Example
from phasescope.classify.model import Calibration, PhaseModel, Submodel, UnknownRules, calibrate, unfamiliar
from phasescope.features import (
    FEATURE_NAMES,
    WindowConfig,
    device_limits,
    features_for_signals,
    sample_interval,
    window_features,
)
from phasescope.schema import PAPER_SIGNALS, PHASES, FloatArray, Trace

MODEL_VERSION = "0.3.0"

# The phase model's windows: 30 s every 15 s on a grid of at least 1 s, so logs at 4 or 10 Hz and a
# 1 Hz poll give the same features (before 0.3.0 each trace kept its own rate, and the model learnt the
# sources' rates as well as their workloads).
PHASE_CONFIG = WindowConfig(min_grid_s=1.0)

# The coarse model, for what a Prometheus stack keeps: one sample every 15-60 s (dcgm-exporter collects
# every 30 s by default). Ten-minute windows every five minutes (20 samples at 30 s), fitted on snapshots
# of the same labelled traces at these intervals, and used for traces sampled more coarsely than the
# phase model's 10 s (told from the trace's own timestamps, never from a query step).
COARSE_CONFIG = WindowConfig(window_s=600.0, stride_s=300.0, plateau_cap_s=1800.0)
COARSE_RULES = UnknownRules(min_interval_s=10.0, max_interval_s=120.0)
COARSE_INTERVALS = (15.0, 30.0, 60.0)

_PCIE = {"pcie_tx", "pcie_rx"}
_CLOCKS = {"sm_clock", "mem_clock"}
_ALL9 = set(PAPER_SIGNALS)

# Realistic signal subsets, largest first. Names are used in reports and the model file.
SUBSETS: dict[str, frozenset[str]] = {
    "all9": frozenset(_ALL9),
    "no_pcie": frozenset(_ALL9 - _PCIE),
    "no_clocks": frozenset(_ALL9 - _CLOCKS),
    "no_pcie_no_clocks": frozenset(_ALL9 - _PCIE - _CLOCKS),
    "smi_default": frozenset({"power", "gpu_util", "mem_used"}),
    "util_mem": frozenset({"gpu_util", "mem_used"}),
    "power_util": frozenset({"power", "gpu_util"}),
    "power_mem": frozenset({"power", "mem_used"}),
}

LGB_PARAMS: dict[str, Any] = {
    "objective": "multiclass",
    "num_class": len(PHASES),
    "learning_rate": 0.08,
    "num_leaves": 8,
    "min_data_in_leaf": 20,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 1.0,
    "verbose": -1,
    "num_threads": 2,
    "seed": 7,
    "deterministic": True,
}
NUM_ROUNDS = 120


@dataclass
class WindowTable:
    """All windows of all examples, features precomputed. `copy` 1 = with device limits, 0 = without."""

    X: FloatArray
    y: np.ndarray
    ex: np.ndarray  # index into `examples`
    copy: np.ndarray
    sufficient: np.ndarray
    interval_s: np.ndarray  # per window, the example's grid spacing
    examples: list[Example]
    present: list[frozenset[str]]  # per example
    seconds: float = 0.0
    config: WindowConfig = PHASE_CONFIG
    rules: UnknownRules = field(default_factory=UnknownRules)  # the sample-rate range fitted on

    def rows(self, example_ids: np.ndarray, copies: Sequence[int]) -> np.ndarray:
        m = np.isin(self.ex, example_ids) & np.isin(self.copy, list(copies))
        return np.flatnonzero(m)


def build_table(
    examples: Sequence[Example],
    config: WindowConfig | None = None,
    limit_dropout: bool = True,
    rules: UnknownRules | None = None,
) -> WindowTable:
    cfg = config or PHASE_CONFIG
    t0 = time.perf_counter()
    Xs, ys, exs, copies, suff, ivs = [], [], [], [], [], []
    present: list[frozenset[str]] = []
    for i, ex in enumerate(examples):
        present.append(frozenset(ex.trace.present_signals()) & _ALL9)
        variants = [(1, True)]
        if limit_dropout and device_limits(ex.trace, True) != device_limits(ex.trace, False):
            variants.append((0, False))
        for copy, use_table in variants:
            wf = window_features(ex.trace, cfg, use_table=use_table)
            n = wf.values.shape[0]
            Xs.append(wf.values)
            ys.append(np.full(n, PHASES.index(ex.label)))
            exs.append(np.full(n, i))
            copies.append(np.full(n, copy))
            suff.append(wf.sufficient)
            rate = wf.sample_interval_s if np.isfinite(wf.sample_interval_s) else wf.interval_s
            ivs.append(np.full(n, rate))
    cat = np.concatenate
    return WindowTable(
        cat(Xs),
        cat(ys),
        cat(exs),
        cat(copies),
        cat(suff).astype(bool),
        cat(ivs),
        list(examples),
        present,
        time.perf_counter() - t0,
        cfg,
        rules or UnknownRules(),
    )


def _weights(table: WindowTable, rows: np.ndarray) -> FloatArray:
    """Each class weighs 1 in total; within a class each run weighs the same."""
    y = table.y[rows]
    runs = np.array([table.examples[i].run for i in table.ex[rows]])
    w = np.zeros(rows.size)
    classes = np.unique(y)
    for c in classes:
        mc = y == c
        rc = runs[mc]
        uniq, inv, counts = np.unique(rc, return_inverse=True, return_counts=True)
        w[np.flatnonzero(mc)] = 1.0 / (len(uniq) * counts[inv])
    return w * rows.size / max(len(classes), 1)


def _fit_rows(table: WindowTable, train_ids: np.ndarray, signals: frozenset[str]) -> np.ndarray:
    """Table rows a submodel for `signals` is fitted on: both copies of the eligible examples' judged
    windows at a validated sample rate."""
    eligible = np.array([i for i in train_ids if signals <= table.present[i]], dtype=np.int64)
    rows = table.rows(eligible, (0, 1))
    return rows[table.sufficient[rows] & _in_range(table.interval_s[rows], table.rules)]


def _booster(table: WindowTable, rows: np.ndarray, feats: Sequence[str], rounds: int) -> Any:
    import lightgbm as lgb

    cols = np.array([FEATURE_NAMES.index(f) for f in feats], dtype=np.intp)
    ds = lgb.Dataset(
        table.X[np.ix_(rows, cols)],
        label=table.y[rows],
        weight=_weights(table, rows),
        feature_name=list(feats),
        free_raw_data=True,
    )
    return lgb.train(LGB_PARAMS, ds, num_boost_round=rounds)


def fit_submodel(
    table: WindowTable,
    train_ids: np.ndarray,
    name: str,
    signals: frozenset[str],
    rounds: int = NUM_ROUNDS,
    calibrated: bool = True,
) -> Submodel | None:
    rows = _fit_rows(table, train_ids, signals)
    if rows.size < 50 or np.unique(table.y[rows]).size < 2:
        return None
    feats = features_for_signals(signals)
    booster = _booster(table, rows, feats, rounds)
    cal = fit_calibration(table, train_ids, signals, feats, rounds, rows) if calibrated else None
    return Submodel(name, tuple(sorted(signals)), tuple(feats), booster, booster.model_to_string(), cal)




CALIBRATION_FOLDS = 3


def fit_calibration(
    table: WindowTable,
    train_ids: np.ndarray,
    signals: frozenset[str],
    feats: Sequence[str],
    rounds: int,
    rows: np.ndarray,
) -> Calibration | None:
    """The two temperatures and the feature ranges of a submodel fitted on `rows` (its `_fit_rows`).

    Both temperatures are fitted on the training side only, as the ones with the least log loss (each
    class and run weighing as in fitting) on held-out predictions:
    - the familiar one, for windows inside every training range (a new run of a known source): each of
      three folds of whole runs held out in turn;
    - the new-source one, for the rest: each training source held out in turn, keeping only the held-out
      windows that the fold's own range check lets through (the others would be `unknown`, so their
      probabilities are never shown). With one source there is none, and the familiar one serves all.
    The ranges (0.5th to 99.5th percentile per feature) come from `rows`.

    Tried and measured (docs/EVALUATION.md, "Tried and not kept"): one temperature from runs left 4.6% of
    held-out windows confidently wrong; one from sources made familiar windows under-confident and left
    `verify` unable to call the disguised-training runs; sources without the range screen reached T = 20."""
    eligible = np.array([i for i in train_ids if signals <= table.present[i]], dtype=np.int64)
    if eligible.size == 0:
        return None
    cols = np.array([FEATURE_NAMES.index(f) for f in feats], dtype=np.intp)
    low, high = _ranges(table.X[np.ix_(rows, cols)])
    sources = np.array([table.examples[i].source for i in eligible])
    assign = stratified_run_folds([table.examples[i] for i in eligible], CALIBRATION_FOLDS, 0)
    run_groups = np.array([f"runs{assign[table.examples[i].run]}" for i in eligible])
    rows, raw = _held_out(table, eligible, run_groups, signals, feats, cols, rounds, screen=False)
    familiar = _fit_temperature(raw, table.y[rows], _weights(table, rows)) if rows.size else 1.0
    if len(set(sources)) < 2:  # one source: held-out runs are all there is to go by
        return Calibration(familiar, tuple(low), tuple(high), (f"{CALIBRATION_FOLDS} folds of whole runs",))
    rows, raw = _held_out(table, eligible, sources, signals, feats, cols, rounds, screen=True)
    new_source = _fit_temperature(raw, table.y[rows], _weights(table, rows)) if rows.size else familiar
    return Calibration(new_source, tuple(low), tuple(high), tuple(sorted(set(sources))), familiar)


def _ranges(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per feature, the 0.5th and 99.5th percentile (NaN for a feature with no value)."""
    if x.shape[0] == 0:
        return np.full(x.shape[1], np.nan), np.full(x.shape[1], np.nan)
    with warnings.catch_warnings():  # a feature with no value in any row has no range: NaN, never checked
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanpercentile(x, 0.5, axis=0), np.nanpercentile(x, 99.5, axis=0)


def _held_out(
    table: WindowTable,
    eligible: np.ndarray,
    groups: np.ndarray,
    signals: frozenset[str],
    feats: Sequence[str],
    cols: np.ndarray,
    rounds: int,
    screen: bool,
) -> tuple[np.ndarray, FloatArray]:
    """Rows and raw probabilities of every group's windows predicted by a booster fitted on the other
    groups; `screen` keeps only the windows inside that booster's training ranges."""
    out_rows: list[np.ndarray] = []
    out_p: list[FloatArray] = []
    for g in sorted(set(groups)):
        fit = _fit_rows(table, eligible[groups != g], signals)
        test = _fit_rows(table, eligible[groups == g], signals)
        test = test[table.copy[test] == 1]
        if fit.size < 50 or np.unique(table.y[fit]).size < 2 or test.size == 0:
            continue
        x_test = table.X[np.ix_(test, cols)]
        if screen:
            keep = ~unfamiliar(x_test, feats, *_ranges(table.X[np.ix_(fit, cols)]))[0]
            test, x_test = test[keep], x_test[keep]
            if test.size == 0:
                continue
        b = _booster(table, fit, feats, rounds)
        out_rows.append(test)
        out_p.append(np.asarray(b.predict(x_test, num_threads=1)).reshape(test.size, len(PHASES)))
    if not out_rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, len(PHASES)))
    return np.concatenate(out_rows), np.concatenate(out_p)


def _fit_temperature(raw: FloatArray, y: np.ndarray, w: FloatArray) -> float:
    """The temperature (0.5 to 20, on a log grid) with the least weighted log loss."""
    best_t, best = 1.0, np.inf
    for t in np.geomspace(0.5, 20.0, 61):
        p = calibrate(raw, float(t))
        loss = -float(np.sum(w * np.log(np.clip(p[np.arange(y.size), y], 1e-12, 1.0))))
        if loss < best:
            best_t, best = float(t), loss
    return best_t



def _in_range(interval: FloatArray, rules: UnknownRules | None = None) -> np.ndarray:
    r = rules or UnknownRules()
    return (interval >= r.min_interval_s) & (interval <= r.max_interval_s)


def fit_model(
    table: WindowTable,
    train_ids: np.ndarray | None = None,
    subsets: Sequence[str] | None = None,
    card: dict[str, Any] | None = None,
    config: WindowConfig | None = None,
    calibrated: bool = True,
) -> PhaseModel:
    """One booster per signal subset (those in `subsets`, default all) on the examples `train_ids`;
    `calibrated` also fits each one's calibration (see `fit_calibration`), which costs one more fit
    per training source."""
    ids = np.arange(len(table.examples)) if train_ids is None else train_ids
    subs = []
    for name in subsets or SUBSETS:
        sm = fit_submodel(table, ids, name, SUBSETS[name], calibrated=calibrated)
        if sm is not None:
            subs.append(sm)
    return PhaseModel(MODEL_VERSION, config or table.config, table.rules, subs, card)


# ---------------------------------------------------------------------------------------------
# Evaluation


@dataclass
class Predictions:
    """Test-side predictions gathered over all folds (one entry per window of the primary copy)."""

    rows: list[np.ndarray] = field(default_factory=list)
    proba: list[FloatArray] = field(default_factory=list)
    labels: list[np.ndarray] = field(default_factory=list)  # class index, -1 = unknown
    raw: list[np.ndarray] = field(default_factory=list)  # argmax ignoring the unknown rules (-1 = no data)
    fold: list[np.ndarray] = field(default_factory=list)

    def cat(self) -> tuple[np.ndarray, FloatArray, np.ndarray, np.ndarray, np.ndarray]:
        if not self.rows:
            z = np.zeros(0, dtype=np.int64)
            return z, np.zeros((0, len(PHASES))), z, z, z
        return (
            np.concatenate(self.rows),
            np.concatenate(self.proba),
            np.concatenate(self.labels),
            np.concatenate(self.raw),
            np.concatenate(self.fold),
        )


def predict_rows(
    model: PhaseModel, table: WindowTable, rows: np.ndarray
) -> tuple[FloatArray, np.ndarray, np.ndarray]:
    """Model answer for table rows (grouped by example so each uses its own submodel)."""
    proba = np.full((rows.size, len(PHASES)), np.nan)
    labels = np.full(rows.size, -1)
    raw = np.full(rows.size, -1)
    exs = table.ex[rows]
    r = model.rules
    for e in np.unique(exs):
        pos = np.flatnonzero(exs == e)
        sub = model.choose(set(table.present[e]))
        if sub is None or len(table.present[e]) < r.min_signals:
            continue
        rr = rows[pos]
        ok = table.sufficient[rr]
        if not ok.any():
            continue
        p, called, _ = sub.judge(table.X[rr[ok]], r.min_proba)
        raw[pos[ok]] = p.argmax(axis=1)
        if not _in_range(table.interval_s[rr[:1]], r)[0]:
            continue
        proba[pos[ok]] = p
        labels[pos[ok]] = called
    return proba, labels, raw


def _random_run_folds(runs: np.ndarray, k: int, seed: int) -> dict[str, int]:
    """Whole runs shuffled and dealt into k folds, ignoring what they hold."""
    uniq = np.array(sorted(set(runs)))
    np.random.default_rng(seed).shuffle(uniq)
    return {str(r): i % k for i, r in enumerate(uniq)}


def run_family(examples: Sequence[Example], run: str) -> str:
    """A run's workload family: its most common family other than the idle bystanders beside it."""
    fams = [e.family for e in examples if e.run == run]
    work = [f for f in fams if f != "bystander_idle"] or fams
    return max(sorted(set(work)), key=work.count)


def stratified_run_folds(examples: Sequence[Example], k: int, seed: int) -> dict[str, int]:
    """Whole runs dealt into k folds family by family (StratifiedGroupKFold by workload family).

    A family with several runs then sits on both sides of most folds, so the run split measures
    "a new run of a known workload"; "a workload never seen" is what the family split measures.
    With plain shuffling, seed 0 happened to put all four low-utilisation GPT-2 inference and ResNet
    training runs in one fold, which measured the latter by accident.
    """
    by_run: dict[str, list[Example]] = {}
    for e in examples:
        by_run.setdefault(e.run, []).append(e)
    fam_runs: dict[str, list[str]] = {}
    for r in sorted(by_run):
        fam_runs.setdefault(run_family(by_run[r], r), []).append(r)
    rng = np.random.default_rng(seed)
    assign: dict[str, int] = {}
    nxt = 0  # carried across families so the folds stay even in size
    for fam in sorted(fam_runs):
        rs = list(fam_runs[fam])
        rng.shuffle(rs)
        for r in rs:
            assign[r] = nxt % k
            nxt += 1
    return assign


def folds(
    examples: Sequence[Example], split: str, k: int = 5, seed: int = 0
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, train example ids, test example ids). A run never sits on both sides.

    run: k folds of whole runs, dealt family by family (see `stratified_run_folds`); run-random: the
    same without the family stratification. gpu|source|family|dataset: leave one value out (dataset =
    one labels table, e.g. a site's own recordings); training then drops every run that has any example
    in the test side (bystander GPUs share the run of the workload beside them).
    """
    runs = np.array([e.run for e in examples])
    if split in ("run", "run-random"):
        if split == "run":
            assign = stratified_run_folds(examples, k, seed)
        else:
            assign = _random_run_folds(runs, k, seed)
        fold_of = np.array([assign[r] for r in runs])
        return [(f"fold{f}", np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)) for f in range(k)]
    attr = {"gpu": "gpu", "source": "source", "family": "family", "dataset": "dataset"}.get(split)
    if attr is None:
        raise ValueError(f"unknown split {split!r}")
    values = np.array([getattr(e, attr) for e in examples])
    out = []
    for v in sorted(set(values)):
        if split == "family" and v == "bystander_idle":
            continue  # the idle GPUs beside every workload: holding them out would hold out every run
        test = np.flatnonzero(values == v)
        test_runs = set(runs[test])
        train = np.flatnonzero(~np.isin(runs, list(test_runs)))
        out.append((v, train, test))
    return out


def cross_validate(
    table: WindowTable,
    split: str,
    k: int = 5,
    fitter: Callable[[WindowTable, np.ndarray, set[frozenset[str]]], Any] | None = None,
    predictor: Callable[[Any, WindowTable, np.ndarray], tuple[FloatArray, np.ndarray, np.ndarray]]
    | None = None,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> Predictions:
    """Fit on the train side of each fold, predict the primary copy of the test side."""
    out = Predictions()
    for fi, (name, train, test) in enumerate(folds(table.examples, split, k, seed)):
        rows = table.rows(test, (1,))
        if rows.size == 0 or train.size == 0:
            continue
        needed = {table.present[i] for i in test}
        if fitter is None:
            subsets = [n for n, s in SUBSETS.items() if any(s <= p for p in needed)]
            # Only the largest subset each test example would use is needed.
            chosen = set()
            for p in needed:
                for n in subsets:
                    if SUBSETS[n] <= p:
                        chosen.add(n)
                        break
            model: Any = fit_model(table, train, subsets=[n for n in SUBSETS if n in chosen])
        else:
            model = fitter(table, train, needed)
        proba, labels, raw = (predictor or predict_rows)(model, table, rows)
        out.rows.append(rows)
        out.proba.append(proba)
        out.labels.append(labels)
        out.raw.append(raw)
        out.fold.append(np.full(rows.size, fi))
        if progress:
            progress(f"{split} {name}: {len(train)} train / {len(test)} test examples")
    return out


EVASION_FAMILIES = ("duty_shaping", "interleaving", "memory_minimal", "migration")
ALIBABA_SOURCE_PREFIX = "alibaba"


def metrics(table: WindowTable, pred: Predictions) -> dict[str, Any]:
    """Window, run and per-family figures from gathered test predictions."""
    rows, proba, labels, raw, _ = pred.cat()
    y = table.y[rows]
    ex = table.ex[rows]
    is_ali = np.array([table.examples[i].source.startswith(ALIBABA_SOURCE_PREFIX) for i in ex], dtype=bool)
    k = len(PHASES)
    res: dict[str, Any] = {}

    def window_block(mask: np.ndarray) -> dict[str, Any]:
        yt, lp = y[mask], labels[mask]
        n = int(mask.sum())
        called = lp >= 0
        conf = np.zeros((k, k + 1), dtype=np.int64)
        np.add.at(conf, (yt, np.where(called, lp, k)), 1)
        per_class = {}
        for c, name in enumerate(PHASES):
            tp = conf[c, c]
            support = conf[c].sum()
            predicted = conf[:, c].sum()
            per_class[name] = {
                "support": int(support),
                "recall": _ratio(tp, support),
                "precision": _ratio(tp, predicted),
            }
        tr = PHASES.index("training")
        neg = yt != tr
        return {
            "windows": n,
            "accuracy": _ratio((lp == yt).sum(), n),
            "called_fraction": _ratio(called.sum(), n),
            "accuracy_on_called": _ratio((lp == yt)[called].sum(), called.sum()),
            "balanced_accuracy": float(
                np.nanmean([per_class[p]["recall"] for p in PHASES if per_class[p]["support"] > 0])
            )
            if n
            else float("nan"),
            "training_recall": per_class["training"]["recall"],
            "training_precision": per_class["training"]["precision"],
            "training_fpr": _ratio(((lp == tr) & neg).sum(), neg.sum()),
            "per_class": per_class,
            "confusion": {
                "rows_true": list(PHASES),
                "cols_pred": [*PHASES, "unknown"],
                "counts": conf.tolist(),
            },
        }

    res["window"] = window_block(~is_ali)
    res["window"].update(reliability(proba[~is_ali], labels[~is_ali], y[~is_ali]))
    # Run level: mean probability over the example's called windows, argmax; unknown when none is called.
    ex_ids = np.unique(ex)
    run_pred = {}
    for e in ex_ids:
        m = (ex == e) & np.isfinite(proba).all(axis=1) & (labels >= 0)
        run_pred[int(e)] = int(np.argmax(proba[m].mean(axis=0))) if m.any() else -1

    def run_block(ids: Sequence[int]) -> dict[str, Any]:
        yt = np.array([PHASES.index(table.examples[i].label) for i in ids], dtype=np.int64)
        yp = np.array([run_pred[i] for i in ids], dtype=np.int64)
        out: dict[str, Any] = {
            "examples": len(ids),
            "accuracy": _ratio((yt == yp).sum(), len(ids)),
            "unknown": int((yp < 0).sum()),
        }
        pc = {}
        for c, name in enumerate(PHASES):
            sup = (yt == c).sum()
            pc[name] = {
                "support": int(sup),
                "recall": _ratio(((yt == c) & (yp == c)).sum(), sup),
                "precision": _ratio(((yt == c) & (yp == c)).sum(), (yp == c).sum()),
            }
        out["per_class"] = pc
        return out

    main_ids = [int(e) for e in ex_ids if not table.examples[e].source.startswith(ALIBABA_SOURCE_PREFIX)]
    res["run"] = run_block(main_ids)
    by_source: dict[str, dict[str, Any]] = {}
    for src in sorted({table.examples[i].source for i in main_ids}):
        ids = [i for i in main_ids if table.examples[i].source == src]
        wm = np.isin(ex, ids)
        block = window_block(wm)
        block.update(reliability(proba[wm], labels[wm], y[wm]))
        by_source[src] = {"window": block, "run": run_block(ids)}
    res["by_source"] = by_source
    workload = [i for i in main_ids if table.examples[i].family != "bystander_idle"]
    res["run_workloads_only"] = run_block(workload)
    fam: dict[str, dict[str, Any]] = {}
    for i in main_ids:
        f = table.examples[i].family
        d = fam.setdefault(
            f, {"label": table.examples[i].label, "examples": 0, "correct": 0, "called_training": 0}
        )
        d["examples"] += 1
        d["correct"] += int(run_pred[i] == PHASES.index(d["label"]))
        d["called_training"] += int(run_pred[i] == PHASES.index("training"))
    for d in fam.values():
        d["accuracy"] = _ratio(d["correct"], d["examples"])
    res["families"] = dict(sorted(fam.items()))
    ev = [i for i in main_ids if table.examples[i].family in EVASION_FAMILIES]
    res["evasion_detection"] = {
        "examples": len(ev),
        "detected": _ratio(sum(run_pred[i] == PHASES.index("training") for i in ev), len(ev)),
        "by_family": {
            f: _ratio(fam[f]["called_training"], fam[f]["examples"]) for f in EVASION_FAMILIES if f in fam
        },
    }
    if is_ali.any():
        la = labels[is_ali]
        ra = raw[is_ali]
        tr = PHASES.index("training")
        res["alibaba"] = {
            "windows": int(is_ali.sum()),
            "called_training": _ratio((la == tr).sum(), la.size),
            "unknown": _ratio((la < 0).sum(), la.size),
            "raw_argmax_training": _ratio((ra == tr).sum(), (ra >= 0).sum()),
            "raw_windows_with_data": int((ra >= 0).sum()),
        }
    return res


CONFIDENT = 0.8  # "confidently wrong": called with at least this probability, and wrong
RISK_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def reliability(proba: FloatArray, labels: np.ndarray, y: np.ndarray, bins: int = 10) -> dict[str, Any]:
    """Calibration and selective-accuracy figures for windows (unknown counts as not called).

    - `ece`: expected calibration error of the best-class probability over the judged windows (those
      with probabilities), in `bins` equal-width bins: sum over bins of share x |accuracy - confidence|;
    - `confidently_wrong`: share of all windows called with probability >= CONFIDENT and wrong;
    - `coverage_accuracy`: for each level, the share of windows whose best probability reaches it and
      the accuracy of those windows' argmax (the trade-off a stricter `min_confidence` buys).
    """
    n = y.size
    judged = np.isfinite(proba).all(axis=1) if n else np.zeros(0, dtype=bool)
    conf = np.where(judged, np.nan_to_num(proba, nan=0.0).max(axis=1), 0.0) if n else np.zeros(0)
    best = np.nan_to_num(proba, nan=-1.0).argmax(axis=1) if n else np.zeros(0, dtype=np.int64)
    right = best == y
    ece = float("nan")
    if judged.any():
        c, r = conf[judged], right[judged]
        edges = np.minimum((c * bins).astype(np.int64), bins - 1)
        ece = 0.0
        for b in range(bins):
            m = edges == b
            if m.any():
                ece += m.mean() * abs(float(r[m].mean()) - float(c[m].mean()))
    wrong_conf = (labels >= 0) & (labels != y) & (conf >= CONFIDENT)
    curve = []
    for level in RISK_LEVELS:
        m = judged & (conf >= level)
        curve.append(
            {"level": level, "coverage": _ratio(m.sum(), n), "accuracy": _ratio((right & m).sum(), m.sum())}
        )
    return {"ece": ece, "confidently_wrong": _ratio(wrong_conf.sum(), n), "coverage_accuracy": curve}


def _ratio(a: Any, b: Any) -> float:
    return float(a) / float(b) if b else float("nan")


def paper_matrix(table: WindowTable, config: WindowConfig | None = None) -> FloatArray:
    """The baseline's 166 features for the primary-copy rows of `table` (NaN rows elsewhere)."""
    from phasescope.classify.lab.paper_baseline import FEATURE_NAMES as PAPER_NAMES
    from phasescope.classify.lab.paper_baseline import paper_features

    out = np.full((table.X.shape[0], len(PAPER_NAMES)), np.nan)
    for i, ex in enumerate(table.examples):
        rows = np.flatnonzero((table.ex == i) & (table.copy == 1))
        f = paper_features(ex.trace, config or table.config)
        if f.shape[0] != rows.size:
            raise AssertionError(f"baseline windows {f.shape[0]} != feature windows {rows.size} for {ex.key}")
        out[rows] = f
    return out


def baseline_cv(
    table: WindowTable,
    split: str,
    k: int = 5,
    n_trees: int | None = None,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> Predictions:
    """The paper's pipeline on the same folds and windows as `cross_validate`."""
    from phasescope.classify.lab.paper_baseline import N_TREES, PaperBaseline

    Xp = paper_matrix(table)

    def fitter(tab: WindowTable, train: np.ndarray, needed: set[frozenset[str]]) -> PaperBaseline | None:
        rows = tab.rows(train, (1,))
        rows = rows[tab.sufficient[rows] & _in_range(tab.interval_s[rows], tab.rules)]
        if rows.size == 0:  # nothing long enough to fit on: the baseline answers nothing in this fold
            return None
        return PaperBaseline(n_trees or N_TREES).fit(Xp[rows], tab.y[rows])

    def predictor(
        model: PaperBaseline | None, tab: WindowTable, rows: np.ndarray
    ) -> tuple[FloatArray, np.ndarray, np.ndarray]:
        if model is None:
            none = np.full(rows.size, -1)
            return np.full((rows.size, len(PHASES)), np.nan), none, none.copy()
        has_data = np.isfinite(Xp[rows]).any(axis=1)
        proba = np.full((rows.size, len(PHASES)), np.nan)
        proba[has_data] = model.predict_proba(Xp[rows[has_data]])
        labels = np.where(has_data, np.nan_to_num(proba, nan=-1).argmax(axis=1), -1)
        return proba, labels, labels.copy()

    say = (lambda m: progress(f"paper RF {m}")) if progress else None
    return cross_validate(table, split, k, fitter, predictor, say, seed)


def evaluate(
    table: WindowTable,
    split: str,
    baseline: bool = False,
    k: int = 5,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Figures for our model (and the paper baseline) on the same grouped folds."""
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "split": split,
        "seed": seed,
        "folds": len(folds(table.examples, split, k, seed)),
        "model": metrics(table, cross_validate(table, split, k, progress=progress, seed=seed)),
    }
    res["model_seconds"] = time.perf_counter() - t0
    if baseline:
        t1 = time.perf_counter()
        res["baseline"] = metrics(table, baseline_cv(table, split, k, progress=progress, seed=seed))
        res["baseline_seconds"] = time.perf_counter() - t1
    return res


def subset_accuracy(
    table: WindowTable, k: int = 5, progress: Callable[[str], None] | None = None
) -> dict[str, dict[str, Any]]:
    """Run-grouped CV with every example reduced to one realistic signal subset at a time.

    Features of the removed signals are blanked (they depend on nothing else), and each fold fits only
    the subset's own booster, exactly as a trace with just those signals would be judged.
    """
    out: dict[str, dict[str, Any]] = {}
    for name in SUBSET_REPORTED:
        signals = SUBSETS[name]
        keep = [i for i, p in enumerate(table.present) if signals <= p]
        if not keep:
            continue
        sub = _restrict(table, signals)
        pred = cross_validate(sub, "run", k)
        out[name] = {"signals": sorted(signals), **headline(metrics(sub, pred))}
        if progress:
            progress(f"subset {name}")
    return out


def headline(m: dict[str, Any]) -> dict[str, Any]:
    """The few figures quoted everywhere (model card, subset table) from a `metrics` result."""
    return {
        "window_accuracy": m["window"]["accuracy"],
        "window_balanced_accuracy": m["window"]["balanced_accuracy"],
        "training_recall": m["window"]["training_recall"],
        "training_fpr": m["window"]["training_fpr"],
        "run_accuracy": m["run"]["accuracy"],
        "evasion_detected": m["evasion_detection"]["detected"],
    }


SUBSET_REPORTED = tuple(n for n in SUBSETS if n not in ("power_util", "power_mem"))


def _restrict(table: WindowTable, signals: frozenset[str]) -> WindowTable:
    """The same table as if every trace had carried only `signals` (examples lacking them are dropped)."""
    keep_ex = np.array([signals <= p for p in table.present])
    rows = np.flatnonzero(keep_ex[table.ex])
    X = table.X[rows].copy()
    allowed = set(features_for_signals(signals))
    for j, f in enumerate(FEATURE_NAMES):
        if f not in allowed:
            X[:, j] = np.nan
    new_ids = np.cumsum(keep_ex) - 1
    return WindowTable(
        X,
        table.y[rows],
        new_ids[table.ex[rows]],
        table.copy[rows],
        table.sufficient[rows],
        table.interval_s[rows],
        [e for e, k in zip(table.examples, keep_ex, strict=True) if k],
        [signals for k in keep_ex if k],
        config=table.config,
        rules=table.rules,
    )


def snapshots(trace: Trace, interval_s: float, offset_s: float = 0.0) -> Trace:
    """`trace` as a scraper polling every `interval_s` seconds would keep it: at each scrape, the latest
    sample at or before it (a snapshot, not an average), stamped with the scrape time. A sample that two
    scrapes would both see is kept once: only real samples reach the classifier."""
    if len(trace) == 0:
        return trace
    t = trace.time
    scrape = np.arange(float(t[0]) + offset_s, float(t[-1]) + 1e-9, interval_s)
    pick = np.searchsorted(t, scrape, side="right") - 1
    ok = pick >= 0
    scrape, pick = scrape[ok], pick[ok]
    first = np.concatenate([[True], pick[1:] != pick[:-1]]) if pick.size else np.zeros(0, dtype=bool)
    scrape, pick = scrape[first], pick[first]
    meta = {**trace.meta, "snapshots_every_s": interval_s}
    return Trace(trace.device, scrape, {k: v[pick] for k, v in trace.columns.items()}, meta)


def coarse_examples(
    examples: Sequence[Example], intervals: Sequence[float] = COARSE_INTERVALS
) -> list[Example]:
    """The examples as a coarse scraper sees them: each one's snapshots at every interval (same run, so
    grouped splits keep them together), and examples already sampled in the coarse range as they are."""
    out: list[Example] = []
    for ex in examples:
        own = sample_interval(ex.trace.time)
        if np.isfinite(own) and COARSE_RULES.min_interval_s < own <= COARSE_RULES.max_interval_s:
            out.append(ex)
            continue
        if np.isfinite(own) and own > COARSE_RULES.max_interval_s:
            continue
        for iv in intervals:
            dec = snapshots(ex.trace, iv)
            if len(dec) >= COARSE_CONFIG.min_samples:
                out.append(replace(ex, trace=dec))
    return out


def build_coarse_table(
    examples: Sequence[Example], intervals: Sequence[float] = COARSE_INTERVALS
) -> WindowTable:
    """The window table of the coarse model (see `COARSE_CONFIG`)."""
    return build_table(coarse_examples(examples, intervals), COARSE_CONFIG, rules=COARSE_RULES)


def fit_shipped(table: WindowTable, coarse: WindowTable | None = None) -> PhaseModel:
    """The phase model on every example, with the coarse model (fitted on `coarse`) inside it."""
    model = fit_model(table)
    if coarse is not None and len(coarse.examples):
        c = fit_model(coarse)
        if c.submodels:
            c.version = f"{MODEL_VERSION}+coarse"
            model.coarse = c
    return model


def load_data(data: Sequence[str], reader: Any = None) -> list[Example]:
    """Examples from one or more labels tables; runs are prefixed when several tables are joined."""
    from phasescope.classify.lab.dataset import load_examples

    out: list[Example] = []
    for d in data:
        exs = load_examples(d, reader=reader)
        if len(data) > 1:
            for e in exs:
                e.run = f"{d}::{e.run}"
        out.extend(exs)
    return out


def model_card(table: WindowTable, evaluation: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    from phasescope.classify.lab.dataset import summary
    from phasescope.features import describe

    s = summary(table.examples)
    card: dict[str, Any] = {
        "model": "phasescope phase classifier",
        "version": MODEL_VERSION,
        "classes": list(PHASES),
        "algorithm": f"LightGBM multiclass, {NUM_ROUNDS} rounds, {LGB_PARAMS['num_leaves']} leaves, "
        "one booster per "
        "signal subset; class- and run-balanced weights; device-limit dropout; temperature "
        "scaling (held-out runs for familiar windows, held-out sources for the rest); unknown outside "
        "the training ranges",
        "sources": sorted({e.source for e in table.examples}),
        "window_grid_s": table.config.min_grid_s,
        "training_data": {
            **s,
            "windows": int((table.copy == 1).sum()),
            "runs": len({e.run for e in table.examples}),
        },
        "subsets": {k: sorted(v) for k, v in SUBSETS.items()},
        "features": describe(),
        "unknown_rules": UnknownRules().__dict__,
        "fit_seconds": round(seconds, 2),
    }
    if evaluation is not None:
        card["evaluation"] = evaluation
    return card
