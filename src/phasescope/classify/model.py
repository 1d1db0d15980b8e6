"""The phase model: load a model file and classify the windows of a trace.

A model file is JSON (no code runs on load): window settings, the a-priori rules for saying
`unknown`, a model card, and one LightGBM booster (its own text format, embedded as a string) per
signal subset. A trace is judged by the booster of the largest subset whose signals it has, so a
log with only power, utilisation and memory gets a model fitted on exactly those features.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.errors import InputError
from phasescope.features import FEATURE_NAMES, WindowConfig, WindowFeatures, window_features
from phasescope.schema import PAPER_SIGNALS, PHASES, FloatArray, Trace

MODEL_FORMAT = "phasescope-phase-model"
SHIPPED_MODEL = "phase_model.json"


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


@dataclass
class Submodel:
    name: str
    signals: tuple[str, ...]
    features: tuple[str, ...]
    _booster: Any = None  # lightgbm.Booster, parsed from `booster_text` on first use
    booster_text: str = ""

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

    def predict(self, values: FloatArray) -> FloatArray:
        x = values[:, _columns(self.features)]
        if x.shape[0] == 0:
            return np.zeros((0, len(PHASES)))
        return np.asarray(self.booster.predict(x, num_threads=1), dtype=np.float64).reshape(
            x.shape[0], len(PHASES)
        )

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


class PhaseModel:
    """A loaded phase model."""

    def __init__(
        self,
        version: str,
        config: WindowConfig,
        rules: UnknownRules,
        submodels: list[Submodel],
        card: dict[str, Any] | None = None,
    ) -> None:
        self.version = version
        self.config = config
        self.rules = rules
        self.submodels = sorted(submodels, key=lambda s: -len(s.signals))
        self.card: dict[str, Any] = dict(card or {})

    def with_rules(self, **changes: Any) -> PhaseModel:
        """A copy whose unknown rules differ by `changes` (e.g. `min_proba` from the config's
        `min_confidence`); it shares the submodels, so boosters are parsed once for both."""
        rules = replace(self.rules, **changes)
        return type(self)(self.version, self.config, rules, self.submodels, self.card)

    def warm_up(self) -> None:
        """Parse every submodel's booster now (LightGBM's first parse takes seconds), not on first use."""
        for sub in self.submodels:
            _ = sub.booster

    # -- persistence --------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | None = None) -> PhaseModel:
        """Load a model file; None loads the model shipped in the package."""
        if path is None:
            text = resources.files("phasescope.models").joinpath(SHIPPED_MODEL).read_text(encoding="utf-8")
            where = f"phasescope/models/{SHIPPED_MODEL}"
        else:
            p = Path(path)
            if not p.is_file():
                raise InputError(path, "model", "a phasescope model file (JSON)", "no such file")
            text = p.read_text(encoding="utf-8", errors="replace")
            where = str(p)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(where, f"line {exc.lineno}", "a JSON model file", exc.msg) from None
        return cls.from_dict(doc, where)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "model") -> PhaseModel:
        if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise InputError(where, "format", f"{MODEL_FORMAT!r}", got)
        if list(doc.get("classes", [])) != list(PHASES):
            raise InputError(where, "classes", f"{list(PHASES)}", doc.get("classes"))
        try:
            config = WindowConfig(**doc["window"])
            rules = UnknownRules(**doc["unknown_rules"])
            subs = []
            for s in doc["submodels"]:
                unknown = [f for f in s["features"] if f not in FEATURE_NAMES]
                if unknown:
                    raise InputError(
                        where, f"submodel {s['name']}", "features this version computes", unknown
                    )
                text = s["booster"]
                if not isinstance(text, str) or not text.startswith("tree"):
                    raise InputError(
                        where, f"submodel {s['name']}", "a LightGBM model in text format", str(text)[:40]
                    )
                subs.append(Submodel(s["name"], tuple(s["signals"]), tuple(s["features"]), None, text))
        except (KeyError, TypeError) as exc:
            raise InputError(
                where, "model document", "window, unknown_rules and submodels", repr(exc)
            ) from None
        return cls(str(doc.get("version", "unversioned")), config, rules, subs, doc.get("card"))

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
                    "booster": s.booster_text or s.booster.model_to_string(),
                }
                for s in self.submodels
            ],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")

    # -- prediction ---------------------------------------------------------------------------

    def choose(self, present: set[str]) -> Submodel | None:
        """The submodel with the most signals, all of which the trace has."""
        for s in self.submodels:
            if set(s.signals) <= present:
                return s
        return None

    def predict_features(
        self, wf: WindowFeatures, present: set[str], evidence: bool = True
    ) -> tuple[FloatArray, list[str], list[dict[str, float]], str, list[str]]:
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
        if not (r.min_interval_s <= wf.interval_s <= r.max_interval_s):
            return (
                proba,
                labels,
                ev,
                sub.name,
                [f"sample interval {wf.interval_s:.3g}s outside {r.min_interval_s}-{r.max_interval_s}s"] * n,
            )
        judged = wf.sufficient
        idx = np.flatnonzero(judged)
        if idx.size:
            p = sub.predict(wf.values[idx])
            proba[idx] = p
            best = p.argmax(axis=1)
            conf = p.max(axis=1)
            called = conf >= r.min_proba
            for i, b in zip(idx[called].tolist(), best[called].tolist(), strict=True):
                labels[i] = PHASES[b]
            for i, c in zip(idx[~called].tolist(), conf[~called].tolist(), strict=True):
                reasons[i] = f"best probability {c:.2f} < {r.min_proba}"
            if evidence:
                for j, e in zip(idx, sub.contributions(wf.values[idx], best), strict=True):
                    ev[int(j)] = e
        for i in np.flatnonzero(~judged):
            reasons[i] = "too little data in window"
        return proba, labels, ev, sub.name, reasons

    def predict_trace(self, trace: Trace, evidence: bool = True) -> WindowPredictions:
        wf = window_features(trace, self.config)
        present = set(trace.present_signals())
        proba, labels, ev, sub, reasons = self.predict_features(wf, present, evidence)
        return WindowPredictions(
            start=wf.start,
            end=wf.end,
            proba=proba,
            labels=labels,
            missing_signals=trace.missing_signals(),
            model_version=self.version,
            evidence=ev,
            subset=sub,
            reasons=reasons,
        )
