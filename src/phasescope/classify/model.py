"""The phase model: load a model file and classify the windows of a trace.

A model file is JSON (no code runs on load): window settings, the a-priori rules for saying
`unknown`, a model card, and one LightGBM booster (its own text format, embedded as a string) per
signal subset. A trace is judged by the booster of the largest subset whose signals it has, so a
log with only power, utilisation and memory gets a model fitted on exactly those features.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.classify.decide import finite_or_none
from phasescope.errors import InputError
from phasescope.features import FEATURE_NAMES, WindowConfig, WindowFeatures, sample_interval, window_features
from phasescope.schema import PAPER_SIGNALS, PHASES, SIGNAL_NAMES, FloatArray, Trace

MODEL_FORMAT = "phasescope-phase-model"
SHIPPED_MODEL = "phase_model.json"
# Set to 1 to load a model whose boosters do not match the sha256 stored with them (edited by hand, or
# saved before digests were stored). Its structure is checked all the same.
TRUST_MODEL_ENV = "PHASESCOPE_TRUST_MODEL"
BOOSTER_VERSIONS = ("v3", "v4")  # LightGBM text-format versions this parser has been checked against


@dataclass
class WindowPredictions:
    """Per-window answer for one trace.

    `proba` rows are NaN for windows the model did not judge at all (too little data, a sampling rate
    outside the range it was validated for, or too few signals); such windows and windows whose best
    probability is below the model's `min_proba` are labelled "unknown".
    """

    start: FloatArray
    end: FloatArray
    proba: FloatArray  # (n_windows, 4), columns in schema.PHASES order
    labels: list[str]
    missing_signals: list[str]
    model_version: str
    evidence: list[dict[str, float]]
    # Which signal subset's booster judged the trace ("" if none could).
    subset: str = ""
    # Why windows are unknown, one entry per window ("" for a called window).
    reasons: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass(frozen=True)
class UnknownRules:
    """Fixed before any evaluation (not tuned on reported data)."""

    min_proba: float = 0.5  # below this best-class probability, say unknown
    max_interval_s: float = 10.0  # coarser than 0.1 Hz: outside the validated range
    min_interval_s: float = 0.05  # finer than 20 Hz: outside the validated range
    min_signals: int = 2  # of the paper's 9


@dataclass(frozen=True)
class Calibration:
    """How a submodel's raw probabilities become calibrated ones, and when it must say unknown.

    All of it is fitted on the training side only.
    - `temperature`: probabilities are softmax(log p / T) for a window outside some training range, T
      fitted on predictions for held-out training sources (see `train.fit_calibration`); T > 1 flattens
      an over-confident booster.
    - `low`/`high`: per feature, the range the training windows spanned (0.5th and 99.5th percentile);
      a window with many features outside it is unlike the training data.
    """

    temperature: float
    low: tuple[float, ...]
    high: tuple[float, ...]
    groups: tuple[str, ...] = ()  # what was held out in turn to fit it (sources, or "run folds")
    # For a window whose every feature lies inside the training range: fitted on held-out runs of the
    # training sources (a familiar window is a new run of a known source). None: `temperature` for all.
    familiar_temperature: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "familiar_temperature": self.familiar_temperature,
            "low": [finite_or_none(v) for v in self.low],
            "high": [finite_or_none(v) for v in self.high],
            "groups": list(self.groups),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], n_features: int) -> Calibration:
        if not isinstance(d["low"], list) or not isinstance(d["high"], list):
            raise ValueError("calibration low and high are not lists")
        low = tuple(_num_or_nan(v) for v in d["low"])
        high = tuple(_num_or_nan(v) for v in d["high"])
        temperature = float(d["temperature"])
        if len(low) != n_features or len(high) != n_features:
            raise ValueError("calibration ranges do not match the submodel's features")
        if not (np.isfinite(temperature) and temperature > 0):
            raise ValueError(f"calibration temperature {temperature} is not a positive number")
        familiar = d.get("familiar_temperature")
        if familiar is not None:
            familiar = float(familiar)
            if not (np.isfinite(familiar) and familiar > 0):
                raise ValueError(f"calibration familiar_temperature {familiar} is not a positive number")
        return cls(temperature, low, high, tuple(str(g) for g in d.get("groups", ())), familiar)


def _num_or_nan(v: Any) -> float:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
        raise ValueError(f"calibration range {v!r} is not a number or null")
    return float("nan") if v is None else float(v)


def calibrate(raw: FloatArray, temperature: float) -> FloatArray:
    """Temperature-scaled probabilities: softmax(log p / T), row by row."""
    if temperature == 1.0 or raw.size == 0:
        return raw
    logit = np.log(np.clip(raw, 1e-12, 1.0)) / temperature
    logit -= logit.max(axis=1, keepdims=True)
    e = np.exp(logit)
    return np.asarray(e / e.sum(axis=1, keepdims=True), dtype=np.float64)


# A window's 90th-percentile power this far above the known limit cannot be that board at that limit.
POWER_OVER_LIMIT = 1.15

# Where the device works relative to its own limits. Trees extrapolate flat beyond the last split, so a
# window at an operating point no training window had (a GPU filled to 90% when none in training was)
# is judged as "unlike the training data" even when the rest of its features look familiar.
OPERATING_POINT = frozenset({"mem_frac", "power_frac_mean", "memutil_mean", "memutil_per_util"})

# Utilisation (the share of time a kernel ran) at or below this over a whole window: nothing ran.
NO_KERNEL_UTIL = 0.005

# Signal groups named in "unlike the training data" reasons, by feature-name prefix.
_GROUP_WORDS = (
    ("util", "utilisation"),
    ("memutil", "memory-controller activity"),
    ("power", "power"),
    ("mem", "memory use"),
    ("corr", "how signals move together"),
    ("temp", "temperature"),
    ("sm_clock", "clocks"),
    ("mem_clock", "clocks"),
    ("pcie", "PCIe traffic"),
)


def unfamiliar(
    x: FloatArray, features: Sequence[str], low: FloatArray, high: FloatArray
) -> tuple[np.ndarray, np.ndarray]:
    """Windows (rows of `x`, columns `features`) unlike the data that spanned [low, high] per feature:
    a quarter or more of their features, or any operating-point feature, outside the range widened by
    a tenth of its width. Returns the per-window flag and the per-feature "outside" matrix."""
    out = outside_ranges(x, low, high, widen=0.1)
    present = np.isfinite(x).sum(axis=1)
    key = [j for j, f in enumerate(features) if f in OPERATING_POINT]
    flag = (out.sum(axis=1) >= np.maximum(1, 0.25 * present)) | out[:, key].any(axis=1)
    return flag, out


def outside_ranges(x: FloatArray, low: FloatArray, high: FloatArray, widen: float = 0.0) -> np.ndarray:
    """Per window and feature: the value exists and lies outside [low, high] widened on each side by
    `widen` times the range's width (a feature without a range is never outside)."""
    pad = widen * np.where(np.isfinite(high - low), high - low, 0.0)
    with np.errstate(invalid="ignore"):
        return np.asarray(np.isfinite(x) & ((x < (low - pad)[None, :]) | (x > (high + pad)[None, :])))


def _feature_group(name: str) -> str:
    best = ""
    word = "telemetry"
    for prefix, w in _GROUP_WORDS:
        if name.startswith(prefix) and len(prefix) > len(best):
            best, word = prefix, w
    return word


# LightGBM reads a feature value this close to 0 as 0 (kZeroThreshold, a C float).
_ZERO = float(np.float32(1e-35))
# Decision-type bits: default direction left, and the missing-value type (0 none, 1 zero, 2 NaN).
_DEFAULT_LEFT, _MISSING_NONE, _MISSING_ZERO = 2, 0, 1
_ROWS_PER_BLOCK = 1024  # windows evaluated at once: a block's (rows, trees) arrays take a few MiB
# Above this many windows in one call (3.5 days at a 15 s stride), LightGBM evaluates them: its walk is
# 3-6x faster per window than numpy's, which repays its import (a second or more) from here on. A
# submodel whose LightGBM booster is parsed already (`PhaseModel.warm_up`) always uses it.
FOREST_MAX_ROWS = 20_000


@dataclass(frozen=True)
class Forest:
    """A LightGBM multiclass booster as arrays, evaluated with numpy: LightGBM's own scores and
    probabilities, to the last bit (the same walk, sums in its order; tests/classify/test_forest.py
    compares them on real windows), without importing LightGBM, whose import (scikit-learn and SciPy
    with it) took a second of every start-up. LightGBM's C walk is faster per window, so a call with
    many windows, or a warmed-up model (a long-running process), goes to it (`Submodel.predict_raw`).

    Nodes of all trees in one table: tree t's internal nodes, then its leaves, from `t * width`. A leaf
    leads back to itself, so every walk takes `depth` steps. Node i sits at 2i and 2i + 1 of `column`
    (which column of the row's `_variants` it compares), `threshold` and `child` (right at 2i, left at
    2i + 1, as 2 * node); `value` holds each leaf's value at 2i."""

    column: np.ndarray
    threshold: FloatArray
    child: np.ndarray
    value: FloatArray
    root: np.ndarray  # 2 * each tree's first node (its first leaf for a tree that is one leaf)
    depth: int  # steps that take every walk to its leaf
    sigmoid: float  # > 0: one-vs-all sigmoids (multiclassova); 0: softmax (multiclass)
    average: bool  # a random forest's output: the mean over iterations, not the sum

    @classmethod
    def from_text(cls, text: str, where: str = "model", sub: str = "") -> Forest:
        """The trees of a booster text that `check_booster` passed (or a packaged one)."""
        start = text.find("\nTree=") + 1
        end = text.find("\nend of trees\n") + 1
        head = dict(line.partition("=")[::2] for line in text[:start].split("\n") if "=" in line)

        def bad(part: str, expected: str, got: object) -> InputError:
            return InputError(where, f"submodel {sub} booster: {part}", expected, got)

        n_trees = text.count("\nTree=", start - 1, end)
        f = _tree_fields(text[start:end], n_trees, bad)
        leaves = np.array([int(v) for v in f["num_leaves"]])
        m = int(leaves.max()) - 1  # internal nodes of the largest tree
        width = m + int(leaves.max())
        n_features = int(head["max_feature_idx"]) + 1

        def table(key: str, at: int, fill: float) -> FloatArray:
            """The key's numbers of each tree at its nodes from `at` on (`fill` where a tree has fewer)."""
            out = np.full((n_trees, width), fill)
            for t, line in enumerate(f[key]):
                if line:
                    row = np.array(line.split(), dtype=np.float64)
                    out[t, at : at + row.size] = row
            return out

        base = np.arange(n_trees)[:, None] * width
        own = base + np.arange(width)[None, :]
        leaf = np.broadcast_to(np.arange(width)[None, :] >= m, own.shape)
        rule = table("decision_type", 0, 0).astype(np.int64)
        missing, default_left = (rule >> 2) & 3, (rule & _DEFAULT_LEFT) > 0
        threshold = np.where(leaf, np.inf, table("threshold", 0, np.inf))
        # Which variant of the feature a node compares (see `_variants`): where NaN (and, for "zero is
        # missing", 0) must go. A node without a missing rule reads NaN as 0.
        left = np.where(missing == _MISSING_NONE, threshold >= 0.0, default_left)
        variant = np.where(missing == _MISSING_ZERO, 2, 0) + np.where(left, 0, 1)
        column = np.where(leaf, 0, variant * n_features + table("split_feature", 0, 0).astype(np.int64))

        def node(key: str) -> np.ndarray:
            c = table(key, 0, 0).astype(np.int64)
            return 2 * np.where(leaf, own, base + np.where(c >= 0, c, m + ~c))

        objective = head.get("objective", "").split()
        sigmoid = 0.0
        if objective[:1] == ["multiclassova"]:
            sigmoid = float(next((o.split(":")[1] for o in objective if o.startswith("sigmoid:")), "1"))
        def twice(a: np.ndarray) -> np.ndarray:  # each node's entry at 2i and 2i + 1
            return np.repeat(a.ravel(), 2)

        return cls(
            column=twice(column),
            threshold=twice(threshold),
            child=np.stack([node("right_child"), node("left_child")], axis=-1).ravel(),
            value=twice(table("leaf_value", m, 0.0)),
            root=2 * (np.arange(n_trees) * width + np.where(leaves > 1, 0, m)),
            depth=m,  # no path has more splits than its tree has internal nodes
            sigmoid=sigmoid,
            average="\naverage_output\n" in text[:start],  # a line of its own, without "="
        )

    def raw(self, x: FloatArray) -> FloatArray:
        """Raw scores (n_rows, n_classes): each class's trees summed in LightGBM's order."""
        n_trees, k = self.root.size, len(PHASES)
        out = np.empty((x.shape[0], k))
        for b in range(0, x.shape[0], _ROWS_PER_BLOCK):
            xv = _variants(x[b : b + _ROWS_PER_BLOCK])
            n = xv.shape[0]
            at = (np.arange(n) * xv.shape[1])[:, None]  # each row's start in the flattened variants
            flat = xv.ravel()
            node = np.broadcast_to(self.root, (n, n_trees)).copy()
            for _ in range(self.depth):
                v = flat.take(at + self.column.take(node))
                node = self.child.take(node + (v <= self.threshold.take(node)))
            values = self.value.take(node).reshape(n, n_trees // k, k)
            # Summed iteration by iteration from 0, as LightGBM sums (cumsum adds in order; sum need not).
            out[b : b + n] = np.cumsum(values, axis=1)[:, -1]
        if self.average:
            out /= n_trees // k
        return out

    def predict(self, x: FloatArray) -> FloatArray:
        """Probabilities (n_rows, n_classes), converted from raw scores as LightGBM converts them."""
        raw = self.raw(x)
        if self.sigmoid > 0:
            return np.asarray(1.0 / (1.0 + np.exp(-self.sigmoid * raw)), dtype=np.float64)
        e = np.exp(raw - raw.max(axis=1, keepdims=True))
        total = e[:, 0].copy()
        for c in range(1, e.shape[1]):  # in order, as LightGBM adds them
            total += e[:, c]
        return np.asarray(e / total[:, None], dtype=np.float64)


def _variants(x: FloatArray) -> FloatArray:
    """Each row's features four ways, side by side, so that one comparison `v <= threshold` sends a
    missing value where the node's rule says: NaN as -inf (goes left) or as NaN (goes right, every
    comparison being false); then the same with 0 also missing (LightGBM's "zero is missing").
    LightGBM reads |v| <= 1e-35 as 0 first."""
    x = np.where(np.abs(x) <= _ZERO, 0.0, x)
    nan = np.isnan(x)
    gone = nan | (x == 0.0)
    return np.ascontiguousarray(
        np.concatenate([np.where(nan, -np.inf, x), x, np.where(gone, -np.inf, x), np.where(gone, np.nan, x)],
                       axis=1)
    )


@dataclass
class Submodel:
    name: str
    signals: tuple[str, ...]
    features: tuple[str, ...]
    _booster: Any = None  # lightgbm.Booster, parsed from `booster_text` on first use (evidence, training)
    booster_text: str = ""
    calibration: Calibration | None = None
    _forest: Forest | None = None  # the same trees for numpy, parsed on first prediction

    @property
    def forest(self) -> Forest:
        if self._forest is None:
            text = self.booster_text or self.booster.model_to_string()
            self._forest = Forest.from_text(text, sub=self.name)
        return self._forest

    @property
    def booster(self) -> Any:
        if self._booster is None:
            try:
                self._booster = _booster_from_text(self.booster_text)
            except Exception as exc:  # lightgbm raises its own error type on a damaged booster
                raise InputError(
                    "model", f"submodel {self.name}", "a LightGBM model in text format", str(exc)[:80]
                ) from None
        return self._booster

    def predict_raw(self, values: FloatArray) -> FloatArray:
        """The booster's own probabilities, before calibration."""
        x = values[:, _columns(self.features)]
        if x.shape[0] == 0:
            return np.zeros((0, len(PHASES)))
        if self._booster is not None or x.shape[0] > FOREST_MAX_ROWS:  # LightGBM there, or worth its import
            return np.asarray(self.booster.predict(x, num_threads=1), dtype=np.float64).reshape(
                x.shape[0], len(PHASES)
            )
        return self.forest.predict(x)

    def predict(self, values: FloatArray) -> FloatArray:
        """Calibrated probabilities (the raw ones for a model fitted without calibration): a window
        entirely inside the training ranges takes the familiar temperature, any other the new-source one."""
        raw = self.predict_raw(values)
        cal = self.calibration
        if cal is None:
            return raw
        out = calibrate(raw, cal.temperature)
        if cal.familiar_temperature is not None and raw.shape[0]:
            x = values[:, _columns(self.features)]
            inside = ~outside_ranges(x, np.asarray(cal.low), np.asarray(cal.high)).any(axis=1)
            if inside.any():
                out[inside] = calibrate(raw[inside], cal.familiar_temperature)
        return out

    def judge(self, values: FloatArray, min_proba: float) -> tuple[FloatArray, np.ndarray, list[str]]:
        """Calibrated probabilities, the called class per window (-1: unknown) and why unknown.

        A window is unknown when its features lie outside what the training windows spanned (see
        `unfamiliar`; never a window in which no kernel ran), or when its best probability is below
        `min_proba`; the reason then names the phases within half the best probability."""
        p = self.predict(values)
        n = p.shape[0]
        best = p.argmax(axis=1) if n else np.zeros(0, dtype=np.int64)
        conf = p.max(axis=1) if n else np.zeros(0)
        called = np.full(n, -1, dtype=np.int64)
        reasons = [""] * n
        cal = self.calibration
        ood: list[str] = [""] * n
        if cal is not None and n:
            ood = self._outside(values, cal)
            if "util_max" in self.features:
                # No kernel ran in the whole window: that GPU is idle whatever its model, power floor or
                # memory held, so the range check has nothing to guard (the booster still decides).
                still = values[:, FEATURE_NAMES.index("util_max")] <= NO_KERNEL_UTIL
                ood = ["" if s else o for o, s in zip(ood, still.tolist(), strict=True)]
        for i in range(n):
            if ood[i]:
                reasons[i] = ood[i]
            elif conf[i] < min_proba:
                order = np.argsort(-p[i])
                near = [PHASES[c] for c in order if p[i, c] >= 0.5 * conf[i]][:3]
                reasons[i] = f"best probability {conf[i]:.2f} < {min_proba}"
                if len(near) > 1:
                    reasons[i] = f"could be {' or '.join(near)}: {reasons[i]}"
            else:
                called[i] = int(best[i])
        return p, called, reasons

    def _outside(self, values: FloatArray, cal: Calibration) -> list[str]:
        """Per window, a reason when a quarter or more of its features lie outside the training range
        (widened by a tenth of its width), naming the signals involved; "" otherwise."""
        x = values[:, _columns(self.features)]
        flag, out = unfamiliar(x, self.features, np.asarray(cal.low), np.asarray(cal.high))
        res = [""] * x.shape[0]
        for i in np.flatnonzero(flag):
            groups = sorted({_feature_group(self.features[j]) for j in np.flatnonzero(out[i])})
            res[int(i)] = f"{', '.join(groups)} unlike any training example"
        if "power_frac_p90" in self.features:
            # Above the board's limit: the limit (or the GPU model it came from) is wrong for this trace.
            over = x[:, self.features.index("power_frac_p90")] > POWER_OVER_LIMIT
            for i in np.flatnonzero(over):
                res[int(i)] = "power above this GPU's limit: is the GPU model right?"
        return res

    def contributions(self, values: FloatArray, classes: np.ndarray, top: int = 3) -> list[dict[str, float]]:
        """Top feature contributions (LightGBM SHAP, log-odds) towards each window's class."""
        if values.shape[0] == 0:
            return []
        x = values[:, _columns(self.features)]
        contrib = np.asarray(self.booster.predict(x, pred_contrib=True, num_threads=1))
        nf = len(self.features) + 1
        contrib = contrib.reshape(values.shape[0], len(PHASES), nf)[:, :, :-1]
        picked = contrib[np.arange(values.shape[0]), classes]
        order = np.argsort(-np.abs(picked), axis=1)[:, :top]
        return [
            {self.features[j]: round(float(picked[i, j]), 4) for j in order[i]}
            for i in range(values.shape[0])
        ]


@functools.lru_cache(maxsize=64)
def _columns(features: tuple[str, ...]) -> list[int]:
    """Positions of a submodel's features in `FEATURE_NAMES` (looked up once per feature list)."""
    return [FEATURE_NAMES.index(f) for f in features]


def _booster_from_text(text: str) -> Any:
    import lightgbm as lgb

    return lgb.Booster(model_str=text)


# (sha256, features) of the boosters check_booster passed: loading the same model again skips the walk.
_CHECKED_BOOSTERS: set[tuple[str, tuple[str, ...]]] = set()


def booster_digest(text: str) -> str:
    """The sha256 stored beside each booster in a model file."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Each window / unknown_rules field: its type, and the range of values that make sense.
_Field = tuple[type, Any]
_WINDOW_FIELDS: dict[str, _Field] = {
    "window_s": (float, lambda v: v > 0),
    "stride_s": (float, lambda v: v > 0),
    "min_samples": (int, lambda v: v >= 1),
    "min_coverage": (float, lambda v: 0 < v <= 1),
    "adapt_to_rate": (bool, None),
    "plateau_cap_s": (float, lambda v: v > 0),
    "min_grid_s": (float, lambda v: v >= 0),
}
_RULE_FIELDS: dict[str, _Field] = {
    "min_proba": (float, lambda v: 0 <= v <= 1),
    "max_interval_s": (float, lambda v: v > 0),
    "min_interval_s": (float, lambda v: v > 0),
    "min_signals": (int, lambda v: 1 <= v <= len(PAPER_SIGNALS)),
}
_RANGE_WORDS = {
    "window_s": "> 0", "stride_s": "> 0", "min_samples": ">= 1", "min_coverage": "in (0, 1]",
    "plateau_cap_s": "> 0", "min_grid_s": ">= 0", "min_proba": "in [0, 1]", "max_interval_s": "> 0",
    "min_interval_s": "> 0", "min_signals": f"in 1..{len(PAPER_SIGNALS)}",
}


def _checked(where: str, section: str, obj: Any, fields: dict[str, _Field]) -> dict[str, Any]:
    """`obj` as keyword arguments, each field of the right type (an int is a float; a bool is neither)
    and range; InputError naming the field otherwise."""
    if not isinstance(obj, dict):
        raise InputError(where, section, "an object", obj)
    for key, value in obj.items():
        if key not in fields:
            raise InputError(where, f"{section}.{key}", f"one of {sorted(fields)}", key)
        typ, ok = fields[key]
        if typ is bool:
            good = isinstance(value, bool)
        elif typ is int:
            good = isinstance(value, int) and not isinstance(value, bool)
        else:
            good = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not good or (ok is not None and not ok(value)):
            words = "true or false" if typ is bool else f"a finite {typ.__name__} {_RANGE_WORDS[key]}"
            raise InputError(where, f"{section}.{key}", words, value)
    return dict(obj)


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# Every array LightGBM's tree parser reads: (name, length relative to num_leaves, whole numbers). It
# aborts the process (a check inside a parallel loop) on a wrong count. LightGBM writes every line in
# every tree, empty ones included (a single-leaf tree has no splits).
_TREE_ARRAYS = (
    ("split_feature", -1, True),
    ("split_gain", -1, False),
    ("threshold", -1, False),
    ("decision_type", -1, True),
    ("left_child", -1, True),
    ("right_child", -1, True),
    ("leaf_value", 0, False),
    ("leaf_weight", 0, False),
    ("leaf_count", 0, True),
    ("internal_value", -1, False),
    ("internal_weight", -1, False),
    ("internal_count", -1, True),
    ("shrinkage", None, False),  # one number per tree
)


_INT = r"-?\d+"
_FLOAT = r"-?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|inf|nan)"


def check_booster(text: str, features: tuple[str, ...], where: str, sub: str) -> None:
    """Refuse, as an InputError, a LightGBM text booster that is not exactly the structure LightGBM's
    parser trusts it to be. The parser reads trees at the byte offsets `tree_sizes` gives and follows
    child indices unchecked, so a cut or edited booster crashes the process (SIGSEGV, heap corruption)
    instead of raising: nothing reaches it unchecked."""
    what = f"submodel {sub} booster"

    def bad(part: str, expected: str, got: object) -> InputError:
        return InputError(where, f"{what}: {part}", expected, got)

    if not text.isascii():  # tree_sizes count bytes, the checks below count characters
        raise bad("text", "ASCII only", next(c for c in text if not c.isascii()))
    start = text.find("\nTree=") + 1
    end = text.find("\nend of trees\n") + 1
    if start <= 0 or end <= start:
        raise bad("trees", "a LightGBM text model with 'Tree=' blocks and 'end of trees'",
                  "no 'Tree=' block" if start <= 0 else "no 'end of trees' after them (cut short?)")
    # LightGBM raises on a header line that is not one key=value, after logging it on stderr: refused here,
    # in one line, instead.
    head: dict[str, str] = {}
    for line in text[:start].split("\n")[1:]:
        if line and not re.fullmatch(r"[a-z_]+=[^=]*", line):
            raise bad("header", "'key=value' lines", line[:40])
        key, _, value = line.partition("=")
        head[key] = value
    if not re.fullmatch(r"\d+", head.get("label_index", "")):
        raise bad("label_index", "a whole number", head.get("label_index"))
    info = r"none|\[[-+0-9.eEinfa]+:[-+0-9.eEinfa]+\]|-?\d+(?::-?\d+)*"
    infos = head.get("feature_infos", "")
    if not re.fullmatch(rf"(?:{info})(?: (?:{info}))*", infos):
        raise bad("feature_infos", "one '[min:max]' (or 'none') per feature", infos[:40])
    n_class = len(PHASES)
    for key, want in (
        ("num_class", str(n_class)),
        ("num_tree_per_iteration", str(n_class)),
        ("max_feature_idx", str(len(features) - 1)),
        ("feature_names", " ".join(features)),
    ):
        if head.get(key) != want:
            raise bad(key, repr(want) if key != "feature_names" else "the submodel's features, in order",
                      head.get(key))
    if head.get("version") not in BOOSTER_VERSIONS:
        raise bad("version", f"one of {list(BOOSTER_VERSIONS)}", head.get("version"))
    objective = head.get("objective", "").split()
    if objective[:1] not in (["multiclass"], ["multiclassova"]) or f"num_class:{n_class}" not in objective:
        raise bad("objective", f"multiclass with num_class:{n_class}", head.get("objective"))
    if len(head.get("feature_infos", "").split()) != len(features):
        raise bad("feature_infos", f"{len(features)} entries", len(head.get("feature_infos", "").split()))
    if not re.fullmatch(r"\d+( \d+)*", head.get("tree_sizes", "")):  # int() would take "9_8" or "+9"
        raise bad("tree_sizes", "whole numbers separated by single spaces", head.get("tree_sizes", "")[:40])
    sizes = [int(v) for v in head["tree_sizes"].split()]
    if not sizes or len(sizes) % n_class or min(sizes) <= 0 or sum(sizes) != end - start:
        raise bad("tree_sizes", f"a multiple of {n_class} sizes adding up to the trees' {end - start} bytes",
                  f"{len(sizes)} sizes adding up to {sum(sizes)}")
    starts = np.concatenate([[0], np.cumsum(sizes)]) + start
    headers = [m.start() for m in re.finditer(r"^Tree=(\d+)$", text[start:end], re.M)]
    if headers != (starts[:-1] - start).tolist() or any(
        not text.startswith(f"Tree={i}\n", int(at)) for i, at in enumerate(starts[:-1])
    ):
        raise bad("Tree= blocks", f"{len(sizes)} blocks Tree=0..{len(sizes) - 1} where tree_sizes puts them",
                  f"{len(headers)} blocks")
    _check_trees(text, starts, len(features), bad)
    # LightGBM keeps the parameters section and splits each line at ':' when asked for it (Booster()
    # does): a line not of that shape crashes it (SIGSEGV).
    params_at, params_end = text.find("\nparameters:\n", end), text.find("\nend of parameters\n", end)
    if params_at >= 0:
        if params_end < params_at:
            raise bad("parameters", "a section closed by 'end of parameters'", "none")
        for line in text[params_at + len("\nparameters:\n") : params_end].split("\n"):
            if line and not re.fullmatch(r"\[\w+: [^\n]*\]", line):
                raise bad("parameters", "lines like '[name: value]'", line[:40])


def _tree_fields(region: str, n_trees: int, bad: Any) -> dict[str, list[str]]:
    """Per key this checker reads, its value in each tree: exactly one line per tree. `region` holds
    exactly the `n_trees` Tree= blocks (checked by the caller)."""
    keys = ("num_leaves", "num_cat", "is_linear", *(k for k, _, _ in _TREE_ARRAYS))
    values: dict[str, list[str]] = {k: [] for k in keys}
    owners: dict[str, list[int]] = {k: [] for k in keys}
    tree, ended = -1, False
    for line in region.split("\n"):
        key, eq, value = line.partition("=")
        if key == "Tree":
            tree, ended = tree + 1, False
        elif not line:
            ended = True  # a tree's lines end at its first blank line; only blank lines follow
        elif ended or not eq or not re.fullmatch(r"[a-z_]+", key):
            raise bad(f"tree {tree}", "'key=value' lines up to a blank line", line[:40])
        elif key in values:
            values[key].append(value)
            owners[key].append(tree)
    for key in keys:
        if owners[key] != list(range(n_trees)):
            first = next((i for i, t in enumerate(owners[key]) if t != i), len(owners[key]))
            raise bad(f"tree {first} {key}", "one line per tree", f"{len(owners[key])} in {n_trees} trees")
    return values


def _check_trees(text: str, starts: np.ndarray, n_features: int, bad: Any) -> None:
    """Every tree's shape, vectorised over the trees (a model holds thousands)."""
    n_trees = len(starts) - 1
    tree_id = np.arange(n_trees)
    fields = _tree_fields(text[starts[0] : starts[-1]], n_trees, bad)
    if not all(v.isascii() and v.isdigit() for v in fields["num_leaves"]):
        raise bad("num_leaves", "whole numbers", next(v for v in fields["num_leaves"] if not v.isdigit()))
    leaves = np.array([int(v) for v in fields["num_leaves"]], dtype=np.int64)
    if np.any(leaves < 1):
        raise bad(f"tree {int(np.argmax(leaves < 1))} num_leaves", ">= 1", int(leaves.min()))
    for key in ("num_cat", "is_linear"):
        got = fields[key]
        if any(v != "0" for v in got):
            raise bad(key, "0 (this version reads no categorical or linear trees)", set(got) - {"0"})
    arrays: dict[str, FloatArray] = {}
    for key, rel, whole in _TREE_ARRAYS:
        lines = fields[key]
        counts = np.array([len(v.split()) for v in lines])
        want = np.ones_like(leaves) if rel is None else leaves + rel
        wrong = np.flatnonzero(counts != want)
        if wrong.size:
            i = int(wrong[0])
            raise bad(f"tree {i} {key}", f"{want[i]} numbers", int(counts[i]))
        joined = " ".join(v for v in lines if v)
        # Tokens as LightGBM writes them (its parser reads a prefix of anything else, numpy the whole)
        token = _INT if whole else _FLOAT
        if not re.fullmatch(rf"(?:{token})(?: (?:{token}))*|", joined):
            raise bad(key, "whole numbers" if whole else "numbers", "another token")
        values = np.fromstring(joined, dtype=np.float64, sep=" ") if joined else np.zeros(0)
        if values.size != counts.sum():
            raise bad(key, "numbers separated by single spaces", joined[:40])
        # LightGBM writes an `inf` threshold itself (a split that sends every finite value left); NaN
        # in any array, or an infinite leaf value, is an edit.
        wrong_value = np.isnan(values) if key == "threshold" else ~np.isfinite(values)
        if np.any(wrong_value):
            i = int(np.repeat(tree_id, counts)[np.argmax(wrong_value)])
            expected = "numbers (no NaN)" if key == "threshold" else "finite numbers"
            raise bad(f"tree {i} {key}", expected, f"{values[np.argmax(wrong_value)]}")
        if whole and np.any(values != np.round(values)):
            raise bad(key, "whole numbers", None)
        arrays[key] = values
    owner = np.repeat(tree_id, leaves - 1)  # the tree of each internal node
    n_of = (leaves - 1)[owner]
    if np.any((arrays["split_feature"] < 0) | (arrays["split_feature"] >= n_features)):
        raise bad("split_feature", f"feature indices 0..{n_features - 1}", None)
    # bit 0: categorical (refused), bit 1: default left, bits 2-3: missing type 0..2
    dt = arrays["decision_type"].astype(np.int64)
    if np.any((dt < 0) | (dt > 11) | (dt & 1 == 1)):
        raise bad("decision_type", "numerical splits (even numbers 0..10)", None)
    # Children: an internal node k >= 0 or a leaf ~k < 0. Every node but the root and every leaf reached
    # exactly once: prediction walks down from the root and always ends at a leaf.
    child = np.concatenate([arrays["left_child"], arrays["right_child"]]).astype(np.int64)
    tree = np.concatenate([owner, owner])
    n_int = np.concatenate([n_of, n_of])
    node, leaf = child >= 0, child < 0
    ok = (
        np.all(child[node] >= 1) and np.all(child[node] < n_int[node])
        and np.all(~child[leaf] <= n_int[leaf])
        and int(node.sum()) == int(np.sum(np.maximum(leaves - 2, 0)))
        and int(leaf.sum()) == int(np.sum(leaves[leaves > 1]))
        and np.unique(tree[node] * (1 << 32) + child[node]).size == int(node.sum())
        and np.unique(tree[leaf] * (1 << 32) + ~child[leaf]).size == int(leaf.sum())
    )
    if not ok:
        raise bad("left_child/right_child", "each node but the root and each leaf reached exactly once", None)


class PhaseModel:
    """A loaded phase model."""

    def __init__(
        self,
        version: str,
        config: WindowConfig,
        rules: UnknownRules,
        submodels: list[Submodel],
        card: dict[str, Any] | None = None,
        coarse: PhaseModel | None = None,
    ) -> None:
        self.version = version
        self.config = config
        self.rules = rules
        self.submodels = sorted(submodels, key=lambda s: -len(s.signals))
        self.card: dict[str, Any] = dict(card or {})
        # Judges traces sampled more coarsely than `rules.max_interval_s` (a Prometheus scrape every
        # 15-60 s): fitted on snapshots of the same traces, with longer windows. None: such traces
        # stay unknown.
        self.coarse = coarse

    def with_rules(self, **changes: Any) -> PhaseModel:
        """A copy whose unknown rules differ by `changes` (e.g. `min_proba` from the config's
        `min_confidence`); it shares the submodels, so boosters are parsed once for both. The coarse
        model takes the same `min_proba`; its own rate range stays."""
        rules = replace(self.rules, **changes)
        coarse = self.coarse
        if coarse is not None and "min_proba" in changes:
            coarse = coarse.with_rules(min_proba=changes["min_proba"])
        return type(self)(self.version, self.config, rules, self.submodels, self.card, coarse)

    def with_config(self, config: WindowConfig) -> PhaseModel:
        """A copy that cuts windows as `config` says (the coarse model keeps its own)."""
        return type(self)(self.version, config, self.rules, self.submodels, self.card, self.coarse)

    def for_interval(self, interval_s: float) -> PhaseModel:
        """The model that judges a trace sampled every `interval_s` seconds (from its own timestamps):
        the coarse one beyond this one's validated range, where there is one."""
        if self.coarse is not None and np.isfinite(interval_s) and interval_s > self.rules.max_interval_s:
            return self.coarse
        return self

    def warm_up(self) -> None:
        """Parse every submodel's booster now (LightGBM's first parse takes seconds), not on first use: for a
        process that runs long (serve, the fleet), which then predicts with LightGBM's faster walk. A
        one-shot command (`classify`) skips this and LightGBM's import with it."""
        for sub in self.submodels:
            _ = sub.booster
        if self.coarse is not None:
            self.coarse.warm_up()

    # -- persistence --------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | None = None) -> PhaseModel:
        """Load a model file; None loads the model shipped in the package."""
        if path is None:
            text = resources.files("phasescope.models").joinpath(SHIPPED_MODEL).read_text(encoding="utf-8")
            where = f"phasescope/models/{SHIPPED_MODEL}"
        else:
            p = Path(path)
            if not p.exists():
                raise InputError(path, "model", "a phasescope model file (JSON)", "no such file")
            from phasescope.sources.replay import check_file

            check_file(p)  # a FIFO or device would block the read forever
            text = p.read_text(encoding="utf-8", errors="replace")
            where = str(p)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(where, f"line {exc.lineno}", "a JSON model file", exc.msg) from None
        return cls.from_dict(doc, where, packaged=path is None)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "model", *, packaged: bool = False) -> PhaseModel:
        """A model from its JSON document. `packaged`: a file installed with phasescope itself, whose boosters
        are skipped by the structure walk where their stored digest matches (they are as trusted as the code
        beside them, and the walk costs most of a second: the start-up of every command)."""
        if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise InputError(where, "format", f"{MODEL_FORMAT!r}", got)
        if doc.get("classes") != list(PHASES):
            raise InputError(where, "classes", f"{list(PHASES)}", doc.get("classes"))
        version = doc.get("version", "unversioned")
        if not isinstance(version, str) or not re.fullmatch(r"[\w.+-]{1,64}", version):
            raise InputError(where, "version", "a version string such as '0.3.0'", version)
        trust = os.environ.get(TRUST_MODEL_ENV, "") == "1"
        try:
            config = WindowConfig(**_checked(where, "window", doc["window"], _WINDOW_FIELDS))
            rules = UnknownRules(**_checked(where, "unknown_rules", doc["unknown_rules"], _RULE_FIELDS))
            if rules.max_interval_s <= rules.min_interval_s:
                raise InputError(where, "unknown_rules.max_interval_s", "more than min_interval_s",
                                 rules.max_interval_s)
            if not isinstance(doc["submodels"], list) or not doc["submodels"]:
                raise InputError(where, "submodels", "a non-empty list", doc["submodels"])
            subs = []
            for i, s in enumerate(doc["submodels"]):
                if not isinstance(s, dict) or not isinstance(s.get("name"), str):
                    raise InputError(where, f"submodels[{i}]", "an object with a 'name' string", s)
                if not _str_list(s["signals"]) or not set(s["signals"]) <= set(SIGNAL_NAMES):
                    raise InputError(where, f"submodel {s['name']} signals", "signal names of the schema",
                                     s["signals"])
                if not _str_list(s["features"]):
                    raise InputError(where, f"submodel {s['name']} features", "a list of feature names",
                                     s["features"])
                unknown = [f for f in s["features"] if f not in FEATURE_NAMES]
                if unknown:
                    raise InputError(
                        where, f"submodel {s['name']}", "features this version computes", unknown
                    )
                text = s["booster"]
                if not isinstance(text, str) or not text.startswith("tree\n"):
                    raise InputError(
                        where, f"submodel {s['name']}", "a LightGBM model in text format", str(text)[:40]
                    )
                digest = booster_digest(text)
                shipped = packaged and s.get("booster_sha256") == digest
                # The walk runs once per process per booster.
                if not shipped and (digest, tuple(s["features"])) not in _CHECKED_BOOSTERS:
                    check_booster(text, tuple(s["features"]), where, s["name"])
                    _CHECKED_BOOSTERS.add((digest, tuple(s["features"])))
                if s.get("booster_sha256") != digest and not trust:
                    raise InputError(
                        where, f"submodel {s['name']} booster_sha256",
                        f"the sha256 of its booster (the model was edited or damaged; to load it anyway, "
                        f"set {TRUST_MODEL_ENV}=1)", s.get("booster_sha256"),
                    )
                cal = None
                if s.get("calibration") is not None:
                    try:
                        cal = Calibration.from_dict(s["calibration"], len(s["features"]))
                    except (ValueError, KeyError, TypeError) as exc:
                        raise InputError(
                            where, f"submodel {s['name']} calibration", "temperatures and feature ranges",
                            str(exc)[:80],
                        ) from None
                subs.append(
                    Submodel(s["name"], tuple(s["signals"]), tuple(s["features"]), None, text, cal)
                )
        except (KeyError, TypeError) as exc:
            raise InputError(
                where, "model document", "window, unknown_rules and submodels", repr(exc)
            ) from None
        coarse = None
        if doc.get("coarse") is not None:
            coarse = cls.from_dict(doc["coarse"], f"{where} (coarse model)", packaged=packaged)
            if coarse.coarse is not None:
                raise InputError(where, "coarse", "one coarse model, not a chain", "a coarse model in it")
        return cls(version, config, rules, subs, doc.get("card"), coarse)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MODEL_FORMAT,
            "version": self.version,
            "classes": list(PHASES),
            "window": self.config.__dict__,
            "unknown_rules": self.rules.__dict__,
            "card": self.card,
            "submodels": [
                {
                    "name": s.name,
                    "signals": list(s.signals),
                    "features": list(s.features),
                    "booster": text,
                    "booster_sha256": booster_digest(text),
                    "calibration": s.calibration.to_dict() if s.calibration else None,
                }
                for s in self.submodels
                for text in [s.booster_text or s.booster.model_to_string()]
            ],
            "coarse": None if self.coarse is None else self.coarse.to_dict(),
        }

    def save(self, path: str | Path) -> None:
        """Written to a temp name, fsync'd and renamed: a kill mid-save never leaves a cut model file."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(self.to_dict(), indent=1))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)

    # -- prediction ---------------------------------------------------------------------------

    def choose(self, present: set[str]) -> Submodel | None:
        """The submodel with the most signals, all of which the trace has."""
        for s in self.submodels:
            if set(s.signals) <= present:
                return s
        return None

    def predict_features(
        self, wf: WindowFeatures, present: set[str], evidence: bool = False
    ) -> tuple[FloatArray, list[str], list[dict[str, float]], str, list[str]]:
        """Probabilities, labels, evidence, the submodel's name and unknown reasons per window of `wf`.
        `evidence`: each window's top feature contributions (SHAP: about half the prediction's cost), only
        for a view that shows them (the report, verify); else every window's evidence is {}."""
        n = wf.values.shape[0]
        proba = np.full((n, len(PHASES)), np.nan)
        labels = ["unknown"] * n
        reasons = [""] * n
        ev: list[dict[str, float]] = [{} for _ in range(n)]
        paper_present = present & set(PAPER_SIGNALS)
        sub = self.choose(paper_present)
        r = self.rules
        if sub is None or len(paper_present) < r.min_signals:
            return proba, labels, ev, "", ["too few signals"] * n
        # The trace's own rate, not the grid's: a 100 Hz log averaged onto 1 s bins is still 100 Hz data.
        interval = wf.sample_interval_s if np.isfinite(wf.sample_interval_s) else wf.interval_s
        if not (r.min_interval_s <= interval <= r.max_interval_s):
            rate = f"sample interval {interval:.3g}s outside {r.min_interval_s}-{r.max_interval_s}s"
            if interval > r.max_interval_s and self.coarse is None:
                rate += " (no coarse model in this model file: phasescope train-model --coarse fits one)"
            return proba, labels, ev, sub.name, [rate] * n
        judged = wf.sufficient
        idx = np.flatnonzero(judged)
        if idx.size:
            p, called, why = sub.judge(wf.values[idx], r.min_proba)
            proba[idx] = p
            for k, (i, c) in enumerate(zip(idx.tolist(), called.tolist(), strict=True)):
                if c >= 0:
                    labels[i] = PHASES[c]
                else:
                    reasons[i] = why[k]
            if evidence:
                for j, e in zip(idx, sub.contributions(wf.values[idx], p.argmax(axis=1)), strict=True):
                    ev[int(j)] = e
        for i in np.flatnonzero(~judged).tolist():
            reasons[i] = "too little data in window"
        return proba, labels, ev, sub.name, reasons

    def predict_trace(self, trace: Trace, evidence: bool = False) -> WindowPredictions:
        model = self.for_interval(sample_interval(trace.time))
        wf = window_features(trace, model.config)
        present = set(trace.present_signals())
        proba, labels, ev, sub, reasons = model.predict_features(wf, present, evidence)
        return WindowPredictions(
            start=wf.start,
            end=wf.end,
            proba=proba,
            labels=labels,
            missing_signals=trace.missing_signals(),
            model_version=model.version,
            evidence=ev,
            subset=sub,
            reasons=reasons,
        )
