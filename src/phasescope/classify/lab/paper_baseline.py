"""The reference method (Rahman & Tajdari), re-implemented for `phasescope eval --baseline paper`.

30 s windows with a 15 s stride over the 9 NVML signals; per window 18 statistics per signal (162) plus
4 cross-signal correlations = 166 features, computed window by window as a straightforward
implementation would; a 400-tree random forest with balanced class weights decides ML vs other vs
idle, and a second one training vs inference on the ML windows. It uses the same windows as our model
(the same resampled grid), so both are scored on identical windows and folds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from phasescope.features import WindowConfig, resample, sample_interval
from phasescope.schema import PAPER_SIGNALS, PHASES, FloatArray, Trace

STAT_NAMES = (
    "mean",
    "std",
    "min",
    "max",
    "median",
    "p5",
    "p25",
    "p75",
    "p95",
    "range",
    "iqr",
    "skew",
    "kurtosis",
    "slope",
    "ac1",
    "mean_abs_diff",
    "cv",
    "zero_cross",
)
PAIRS = (("power", "gpu_util"), ("power", "mem_util"), ("gpu_util", "mem_util"), ("power", "mem_used"))
FEATURE_NAMES = tuple(f"{s}_{k}" for s in PAPER_SIGNALS for k in STAT_NAMES) + tuple(
    f"corr_{a}_{b}" for a, b in PAIRS
)
N_TREES = 400


def _stats(x: FloatArray) -> list[float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return [np.nan] * len(STAT_NAMES)
    m = float(np.mean(x))
    sd = float(np.std(x))
    p5, p25, med, p75, p95 = np.percentile(x, [5, 25, 50, 75, 95])
    if sd > 0:
        z = (x - m) / sd
        skew = float(np.mean(z**3))
        kurt = float(np.mean(z**4) - 3.0)
    else:
        skew = kurt = 0.0
    slope = float(np.polyfit(np.arange(x.size), x, 1)[0]) if x.size > 1 else 0.0
    ac1 = (
        float(np.corrcoef(x[:-1], x[1:])[0, 1])
        if x.size > 2 and np.std(x[:-1]) > 0 and np.std(x[1:]) > 0
        else 0.0
    )
    mad = float(np.mean(np.abs(np.diff(x)))) if x.size > 1 else 0.0
    cv = sd / m if m != 0 else 0.0
    d = np.sign(x - m)
    zc = float(np.mean(d[1:] != d[:-1])) if x.size > 1 else 0.0
    return [
        m,
        sd,
        float(x.min()),
        float(x.max()),
        float(med),
        float(p5),
        float(p25),
        float(p75),
        float(p95),
        float(x.max() - x.min()),
        float(p75 - p25),
        skew,
        kurt,
        slope,
        ac1,
        mad,
        cv,
        zc,
    ]


def _corr(a: FloatArray, b: FloatArray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.std(a[ok]) == 0 or np.std(b[ok]) == 0:
        return 0.0 if ok.sum() >= 3 else np.nan
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def paper_features(trace: Trace, config: WindowConfig | None = None) -> FloatArray:
    """(n_windows, 166) for the same windows `features.window_features` makes, one window at a time."""
    cfg = config or WindowConfig()
    if len(trace) == 0:
        return np.zeros((0, len(FEATURE_NAMES)))
    dt = sample_interval(trace.time)
    dt = max(dt if np.isfinite(dt) else 1.0, cfg.min_grid_s)
    present = [s for s in PAPER_SIGNALS if trace.has(s)]
    _, grid = resample(trace, dt, present)
    n_grid = int(np.floor((trace.time[-1] - trace.time[0]) / dt + 0.5)) + 1
    w = max(1, round(cfg.window_s / dt))
    step = max(1, round(cfg.stride_s / dt))
    if cfg.adapt_to_rate and w < cfg.min_samples:
        step = max(1, round(cfg.min_samples * cfg.stride_s / cfg.window_s))
        w = cfg.min_samples
    w = min(w, n_grid)
    rows = []
    nan18 = [np.nan] * len(STAT_NAMES)
    for start in range(0, n_grid - w + 1, step):
        feats: list[float] = []
        for s in PAPER_SIGNALS:
            feats.extend(_stats(grid[s][start : start + w]) if s in grid else nan18)
        for a, b in PAIRS:
            feats.append(
                _corr(grid[a][start : start + w], grid[b][start : start + w])
                if a in grid and b in grid
                else np.nan
            )
        rows.append(feats)
    return np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURE_NAMES))


class PaperBaseline:
    """Two random forests: {ML, other, idle}, then {training, inference} on ML windows."""

    def __init__(self, n_trees: int = N_TREES, seed: int = 0, n_jobs: int = 2) -> None:
        from sklearn.ensemble import RandomForestClassifier

        kw: dict[str, Any] = {
            "n_estimators": n_trees,
            "class_weight": "balanced",
            "random_state": seed,
            "n_jobs": n_jobs,
        }
        self.stage1 = RandomForestClassifier(**kw)
        self.stage2 = RandomForestClassifier(**kw)
        self._two_stage_ok = False

    def fit(self, X: FloatArray, y: np.ndarray) -> PaperBaseline:
        tr, inf = PHASES.index("training"), PHASES.index("inference")
        ml = (y == tr) | (y == inf)
        y1 = np.where(ml, 0, np.where(y == PHASES.index("other"), 1, 2))
        self.stage1.fit(X, y1)
        self._two_stage_ok = bool(np.unique(y[ml]).size == 2)
        if self._two_stage_ok:
            self.stage2.fit(X[ml], (y[ml] == tr).astype(int))
        else:
            self._only = int(np.unique(y[ml])[0]) if ml.any() else tr
        return self

    def predict_proba(self, X: FloatArray) -> FloatArray:
        out = np.zeros((X.shape[0], len(PHASES)))
        if X.shape[0] == 0:
            return out
        p1 = np.zeros((X.shape[0], 3))
        p1[:, self.stage1.classes_] = self.stage1.predict_proba(X)
        if self._two_stage_ok:
            p2 = self.stage2.predict_proba(X)[:, list(self.stage2.classes_).index(1)]
        else:
            p2 = np.full(X.shape[0], 1.0 if self._only == PHASES.index("training") else 0.0)
        out[:, PHASES.index("training")] = p1[:, 0] * p2
        out[:, PHASES.index("inference")] = p1[:, 0] * (1 - p2)
        out[:, PHASES.index("other")] = p1[:, 1]
        out[:, PHASES.index("idle")] = p1[:, 2]
        return out


def table_features(traces: Sequence[Trace], config: WindowConfig | None = None) -> list[FloatArray]:
    return [paper_features(t, config) for t in traces]
