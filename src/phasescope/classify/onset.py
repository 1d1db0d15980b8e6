"""The "training started" alarm at run time: its onset model, live windows and streaming decision.

The onset model is fitted by `classify.lab.onset_fit` (why it exists and how it is fitted is told there); this
module holds only what the live agent runs, so loading the alarm never loads the training code.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from phasescope.classify import decide
from phasescope.classify.model import PhaseModel, UnknownRules, WindowPredictions
from phasescope.features import (
    FEATURE_NAMES,
    WindowConfig,
    WindowFeatures,
    sample_interval,
    window_features,
)
from phasescope.schema import PHASES, FloatArray, Trace

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


def load_alarm_model(path: str | None = None) -> PhaseModel:
    """The shipped alarm model (or one at `path`)."""
    if path is not None:
        return PhaseModel.load(path)
    text = resources.files("phasescope.models").joinpath(ALARM_MODEL_FILE).read_text(encoding="utf-8")
    return PhaseModel.from_dict(json.loads(text), f"phasescope/models/{ALARM_MODEL_FILE}", packaged=True)


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
        return self.feed(wf, self.model.predict_features(wf, set(wf.present_signals), evidence=False)[0])

    def feed(self, wf: WindowFeatures, proba: FloatArray) -> bool:
        """The second half of `update`: the model's probabilities `proba` for the windows `wf` (what
        `windows` gave), fed in order; True when the alarm fires. The live classifier predicts the windows
        of all its devices in one model call and feeds each its rows."""
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


