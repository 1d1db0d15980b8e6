"""Live phase classification: the verdict's windows and segment rule, run on each device as ticks arrive.

`LiveClassifier.update(state)` is cheap to call every tick: every `every_s` seconds (on the data's own clock,
so a replay at speed N runs N times as often in real time) it judges the windows that fell due since its
last run, cut where the offline verdict cuts them (`classify.verdict`, which `fleet` and `classify` use):
on the device's grid from its first sample, each with the `plateau_cap_s` of context before it and the
grid's power and memory floors since the first sample (`features.Floors`). The phase is the last segment of
the kept windows as `verdict.phase_segments` cuts them, so the agent's phase and the fleet's verdict agree
on the same samples except for a bounded lag at changes (docs/design/live-classifier.md, "One verdict").
At coarse rates windows widen as the model's do (`WindowConfig.adapt_to_rate`); `read_span` is what a run
reads. Before two full windows exist the reading is the newest window of what there is (warm-up).

`since` is when the phase was first shown. A window the model does not judge is bridged by the decoder:
the phase stays, with the probabilities of the newest judged window and `held` set (views mark it). A device
that has gone dark reads "unknown" at once.

Two config thresholds (`[thresholds]`, see `config.py`) change this only when set. `min_segment_s` is the
verdict's: segments shorter than it merge into a neighbour, so a new phase shows once its segment is that
long. A reading whose newest judged window's confidence is below `min_confidence` reads "unknown", with
`unknown_reason` saying which phase at what confidence (the decoder still runs on the phase underneath, so
the badge returns at once); set below the model's own bar (0.5), it also lowers that bar.

The "training started" alarm runs beside it on its own model (`classify.onset`: 15 s windows fitted on
windows that straddle a run's start, so it fires sooner than the badge turns): every `onset.ONSET_STRIDE_S`
of data time each GPU's last `onset.HISTORY_S` seconds go to its `OnsetAlarm`. The reading carries
`training_alarm` (latched until the training evidence is gone) and `alarm_at` (data time it fired).

Devices whose phase comes from hooks only (`live.state.phase_from_hooks`: the host pseudo-device, CPU load
and RAM, which neither model was fitted on) are skipped: no window is judged, no alarm kept, no reading.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from phasescope.classify import onset, verdict
from phasescope.classify.decide import finite_or_none
from phasescope.classify.model import PhaseModel, UnknownRules, WindowPredictions
from phasescope.features import (
    Floors,
    WindowConfig,
    WindowFeatures,
    resample,
    sample_interval,
    window_features,
)
from phasescope.live.state import LiveState, phase_from_hooks
from phasescope.schema import PHASES, SIGNAL_NAMES, FloatArray, Trace

UNKNOWN = "unknown"
MAX_BANDS = 500  # phase bands kept per device (the dashboard's coloured stretches)
# Judged windows the segment decoder reads per device: 16 min at the 15 s stride, far more than the few
# windows one phase change takes to decode (`decide.SegmentParams`), so the cap never moves a change.
KEEP_WINDOWS = 64


@dataclass(frozen=True)
class PhaseReading:
    """The current phase of one device."""

    phase: str  # a PHASES member or "unknown"
    confidence: float  # probability of `phase` in the newest judged window; NaN when unknown
    proba: dict[str, float]  # per PHASES member, newest judged window; empty when none was judged
    since: float  # Unix s (data clock) the current phase began, as first seen
    t: float  # data time of the run that produced this reading
    held: bool = False  # this run judged no window: phase, confidence and proba are the last judged ones
    training_alarm: bool = False  # the onset alarm holds: training has started (latched until it ends)
    alarm_at: float | None = None  # data time the holding alarm fired; None while it does not hold
    # Why a reading with a phase underneath says "unknown" (the config's min_confidence); "" otherwise.
    unknown_reason: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "confidence": finite_or_none(self.confidence),
            "proba": {k: finite_or_none(v) for k, v in self.proba.items()},
            "since": finite_or_none(self.since),
            "t": finite_or_none(self.t),
            "held": self.held,
            "training_alarm": self.training_alarm,
            "alarm_at": None if self.alarm_at is None else finite_or_none(self.alarm_at),
            "unknown_reason": self.unknown_reason or None,
        }


@dataclass(frozen=True)
class PhaseBand:
    """A stretch of data time one device spent in one phase (as the live classifier called it)."""

    start: float
    end: float
    phase: str


@dataclass(frozen=True)
class _Window:
    """One judged window, kept for the segment decoder."""

    start: float
    end: float
    proba: FloatArray  # (len(PHASES),), NaN when the window was not judged
    label: str  # a phase or "unknown"


class _Kept:
    """A device's kept windows, as the segment decoder reads them (`decide.WindowProbs`)."""

    def __init__(self, windows: Sequence[_Window]) -> None:
        self.start = np.array([w.start for w in windows], dtype=np.float64)
        self.end = np.array([w.end for w in windows], dtype=np.float64)
        self.proba = np.array([w.proba for w in windows], dtype=np.float64).reshape(len(windows), len(PHASES))
        self.labels = [w.label for w in windows]


@dataclass
class _DeviceTrack:
    last_run: float = -math.inf
    reading: PhaseReading | None = None  # the decoded phase, before min_confidence
    shown: PhaseReading | None = None  # what readers get: `reading`, or unknown under min_confidence
    gated_since: float = math.nan  # data time `shown` last turned unknown under min_confidence
    anchor: float = math.nan  # data time of the device's first sample: its windows start on this grid
    stride: float = math.nan  # seconds between window starts (learned from the model's first windows)
    length: float = math.nan  # a full window's first-to-last grid point, seconds
    next_start: float = math.nan  # where the next window to judge starts
    floors: Floors = field(default_factory=Floors)  # the grid's lowest power and memory before `folded_to`
    folded_to: float = math.nan
    windows: deque[_Window] = field(default_factory=lambda: deque(maxlen=KEEP_WINDOWS))
    kept: int = 0  # windows ever appended to `windows`: the decoded phase changes only when this does
    decoded: tuple[int, tuple[str, dict[str, float], bool]] | None = None  # (kept, `_decode`'s answer)
    bands: deque[PhaseBand] = field(default_factory=lambda: deque(maxlen=MAX_BANDS))
    alarm: onset.OnsetAlarm | None = None  # None: the alarm is off
    alarm_run: float = -math.inf  # data time of the alarm's last update
    alarm_at: float | None = None


DEFAULT_WINDOW_S = 60.0  # the recent span the telemetry KPIs read (`annotate`), and the least a run reads
DEFAULT_EVERY_S = 5.0  # data seconds between classifier runs


def read_span(
    interval_s: float,
    window_s: float = DEFAULT_WINDOW_S,
    config: WindowConfig | None = None,
    rules: UnknownRules | None = None,
    every_s: float = DEFAULT_EVERY_S,
) -> float:
    """Seconds of data a classifier run reads at `interval_s`: the windows that fell due since the last run
    (a window, a stride and a run's period), and before them the `plateau_cap_s` of context (rounded up to
    whole strides) that the same windows have in an offline verdict (`mem_plateau_s` looks that far back);
    at least `window_s`. At coarse rates windows widen to hold `config.min_samples` points, as
    `window_features` widens them; intervals past the model's range (`rules.max_interval_s`) are judged
    unknown whatever is read, so the span stops growing there. `config` and `rules` default to the shipped
    model's (the features' defaults)."""
    cfg = config or WindowConfig()
    r = rules or UnknownRules()
    length, stride = cfg.window_s, cfg.stride_s
    if cfg.adapt_to_rate and math.isfinite(interval_s) and interval_s > 0:
        dt = min(max(interval_s, cfg.min_grid_s), r.max_interval_s)
        if length / dt < cfg.min_samples:
            length = cfg.min_samples * dt
            stride = max(1, round(cfg.min_samples * cfg.stride_s / cfg.window_s)) * dt
    lookback = math.ceil(cfg.plateau_cap_s / stride) * stride
    return max(window_s, lookback + length + stride + every_s)


def ring_ticks(
    interval_s: float,
    window_s: float = DEFAULT_WINDOW_S,
    alarm: bool = True,
    config: WindowConfig | None = None,
    rules: UnknownRules | None = None,
    every_s: float = DEFAULT_EVERY_S,
) -> int:
    """Ticks a device's ring must hold at `interval_s` so that every run sees all it reads: the classifier's
    `read_span` and, with the alarm on, `onset.HISTORY_S` (the history the alarm was evaluated on). At 10 Hz
    the rings' defaults (300 ticks in `top`) would hold only 30 s."""
    span = max(read_span(interval_s, window_s, config, rules, every_s), onset.HISTORY_S if alarm else 0.0)
    return math.ceil(span / max(interval_s, 1e-3)) + 1


class LiveClassifier:
    """Current phase per device, from a `LiveState`'s ring buffers. Thread-safe: one updater, many readers."""

    def __init__(
        self,
        model: PhaseModel | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        every_s: float = DEFAULT_EVERY_S,
        alarm: bool = True,
        alarm_model: PhaseModel | None = None,
        min_confidence: float | None = None,
        min_segment_s: float | None = None,
    ) -> None:
        if not (window_s > 0 and every_s > 0):
            raise ValueError(f"need window_s > 0, every_s > 0; got {window_s}, {every_s}")
        if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"need min_confidence between 0 and 1; got {min_confidence}")
        if min_segment_s is not None and not min_segment_s >= 0.0:
            raise ValueError(f"need min_segment_s >= 0; got {min_segment_s}")
        self.model = model if model is not None else PhaseModel.load()
        self.min_confidence = min_confidence  # None: the model's own bar, readings never gated
        if min_confidence is not None and min_confidence < self.model.rules.min_proba:
            # Lower: call the windows between. Higher stays the model's bar: a window it calls below
            # min_confidence then reads unknown with the reason (`_gate`), where an uncalled one would
            # keep the held phase as if nothing had been judged.
            self.model = self.model.with_rules(min_proba=min_confidence)
        self.window_s = float(window_s)
        self.every_s = float(every_s)
        self.min_segment_s = min_segment_s  # as the verdict's: shorter segments merge, unknowns bridge
        self.runs = 0  # classifier runs so far, all devices (for tests and the status line)
        self.alarm_enabled = bool(alarm)
        self._alarm_model = alarm_model  # loaded on first use (or in warm_up) when None
        self._alarm_load = threading.Lock()  # warm_up may run in a thread beside the first updates
        self.alarm_runs = 0  # onset alarm updates so far, all devices
        self._tracks: dict[str, _DeviceTrack] = {}
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Parse every submodel's booster now (LightGBM's first parse takes seconds), not in a tick."""
        models = [self.model, self.alarm_model()] if self.alarm_enabled else [self.model]
        for m in models:
            m.warm_up()

    def alarm_model(self) -> PhaseModel:
        """The onset model the alarm runs on (the shipped one unless given), loaded on first call."""
        with self._alarm_load:  # one load, so the model warm_up parses is the one the tracks use
            if self._alarm_model is None:
                self._alarm_model = onset.load_alarm_model()
            return self._alarm_model

    def ring_ticks(self, interval_s: float) -> int:
        """`ring_ticks` for this classifier's window, model and alarm setting."""
        m = self.model.for_interval(interval_s)
        return ring_ticks(interval_s, self.window_s, self.alarm_enabled, m.config, m.rules, self.every_s)

    def read_span(self, interval_s: float) -> float:
        """`read_span` for this classifier's window, run period and model (the coarse one past its range)."""
        m = self.model.for_interval(interval_s)
        return read_span(interval_s, self.window_s, m.config, m.rules, self.every_s)

    # ---- writer ----

    def update(self, state: LiveState, now: float | None = None) -> None:
        """Re-classify every device of `state` whose last run is `every_s` or more before `now`, except
        those whose phase comes from hooks (`phase_from_hooks`).

        `now` is on the data clock (TickBatch.time); None takes the state's latest tick time. The windows
        that fell due on all devices go to each model in one call (`_predict_batched`), not one per device.
        """
        t_now = state.last_tick_time if now is None else float(now)
        if not math.isfinite(t_now):
            return  # no tick yet
        alarms: list[tuple[_DeviceTrack, onset.OnsetAlarm, Trace | None]] = []  # trace None: dark
        judges: list[tuple[_DeviceTrack, Trace, bool, float]] = []  # (track, recent, dark, interval)
        for uuid in state.device_uuids():
            with self._lock:
                track = self._tracks.get(uuid)
            if track is None:
                if phase_from_hooks(state.device_info(uuid)):
                    continue  # the host: its hooks say its phase, the models cannot judge CPU load
                track = self._new_track()
            with self._lock:
                track = self._tracks.setdefault(uuid, track)
                due = t_now - track.last_run >= self.every_s
            alarm = track.alarm if t_now - track.alarm_run >= onset.ONSET_STRIDE_S else None
            if alarm is None and not due:
                continue
            interval = span = math.nan
            if due:
                # The spacing of the newest samples only: over the whole ring, a rate that changed
                # mid-session (a 1 s recording turning 10 s) kept the old median for half a ring, and the
                # span too short.
                newest = state.history_times(uuid)[-(self.model.config.min_samples + 1):]
                interval = sample_interval(newest)
                span = self.read_span(interval)
            # One read of the ring for both: each takes its own span's tail of it.
            wide = self._recent(state, uuid, t_now, max(span if due else 0.0,
                                                        onset.HISTORY_S if alarm is not None else 0.0))
            if alarm is not None:
                trace = _tail(wide, t_now - onset.HISTORY_S)
                alarms.append((track, alarm, None if self._dark(state, uuid, trace, t_now) else trace))
            if due:
                recent = _tail(wide, t_now - span)
                judges.append((track, recent, self._dark(state, uuid, recent, t_now), interval))
        self._alarm_steps(alarms, t_now)
        plans = [None if dark else self._plan(track, recent, t_now, interval)
                 for track, recent, dark, interval in judges]
        asked = [(i, plan) for i, plan in enumerate(plans) if plan is not None]
        preds = self._predict_batched([plan for _, plan in asked])
        done = {i: (pred, plan[2]) for (i, plan), pred in zip(asked, preds, strict=True)}
        for i, (track, _, dark, _) in enumerate(judges):
            pred, first = done.get(i, (None, False))
            judged = None if dark else self._finish(track, pred, first)
            with self._lock:
                track.last_run = t_now
                self.runs += 1
                self._advance(track, t_now, judged, dark=dark)

    def _new_track(self) -> _DeviceTrack:
        track = _DeviceTrack()
        if self.alarm_enabled:
            model = self.alarm_model()
            track.alarm = onset.OnsetAlarm(model, onset.alarm_params(model))
        return track

    def _alarm_steps(
        self, steps: Sequence[tuple[_DeviceTrack, onset.OnsetAlarm, Trace | None]], t_now: float
    ) -> None:
        """Feed each device's last HISTORY_S seconds (None: dark) to its onset alarm, the windows of all
        devices predicted in one call per model; each reading follows its alarm's state."""
        windows = [None if trace is None else alarm.windows(trace) for _, alarm, trace in steps]
        asked = [(k, wf) for k, wf in enumerate(windows) if wf is not None]
        probas = _predict_rows([(steps[k][1].model, wf, set(wf.present_signals)) for k, wf in asked])
        proba_of = {k: pr[0] for (k, _), pr in zip(asked, probas, strict=True)}
        for k, (track, alarm, trace) in enumerate(steps):
            if trace is None:  # dark: whatever held has ended; start afresh when data returns
                alarm = track.alarm = onset.OnsetAlarm(alarm.model, alarm.params)
            wf = windows[k]
            fired = False if wf is None else alarm.feed(wf, proba_of[k])
            with self._lock:
                track.alarm_run = t_now
                self.alarm_runs += 1
                if fired:
                    track.alarm_at = t_now
                elif not alarm.active:
                    track.alarm_at = None
                held, at = alarm.active, track.alarm_at
                if track.reading is not None:
                    track.reading = replace(track.reading, training_alarm=held, alarm_at=at)
                if track.shown is not None:
                    track.shown = replace(track.shown, training_alarm=held, alarm_at=at)

    def _dark(self, state: LiveState, uuid: str, recent: Trace, t_now: float) -> bool:
        """Whether a device is dark now, so nothing is judged from the older samples in its window (judging
        them kept a lost GPU's phase, or gave it a new one, for a whole window, with its time metered under
        that phase): no longer listed, nothing in its recent window, or all-NaN ticks (`LiveState.is_dark`:
        NVML keeps a GPU off the bus as such a row) since its last data for at least `every_s` and two
        sample intervals. One failed read (an all-NaN tick, then data again) is not dark: it must not reset
        the training alarm or flip the badge to unknown and back."""
        if state.is_lost(uuid) or not len(recent):
            return True
        if not state.is_dark(uuid):
            return False
        step = sample_interval(recent.time)  # NaN with one sample: every_s alone
        return t_now - float(recent.time[-1]) >= max(self.every_s, 2.0 * step if math.isfinite(step) else 0.0)

    def _recent(self, state: LiveState, uuid: str, t_now: float, span: float) -> Trace:
        """The device's samples in (t_now - span, t_now] that hold some data."""
        times, columns = state.history_columns(uuid, SIGNAL_NAMES)  # one read, under one lock
        keep = (times > t_now - span) & (times <= t_now)
        cols = {s: v[keep] for s, v in columns.items()}
        recent = Trace(state.device_info(uuid), times[keep], cols)
        # Only rows with some data: a lost device's NaN rows would otherwise read as a sampled gap.
        return recent.take(recent.rows_with_data())

    def _plan(
        self, track: _DeviceTrack, recent: Trace, t_now: float, interval: float
    ) -> tuple[Trace, Floors, bool] | None:
        """What to predict for the windows that fell due since the last run, cut where the offline verdict
        cuts them (on the device's own grid from its first sample, with the context before them that the
        verdict's windows have): (samples, the floors before them, whether the grid is still unknown); None
        when no window fell due. `_finish` keeps and decodes the prediction."""
        if len(recent) < 2:
            return None
        if math.isnan(track.anchor):
            track.anchor = float(recent.time[0])
        half = 0.5 * interval if math.isfinite(interval) else 0.0  # a sample's offset from its grid point
        if math.isnan(track.stride):
            track.folded_to = track.anchor
            return recent.take(np.flatnonzero(recent.time >= track.anchor - half)), Floors(), True
        if t_now >= track.next_start + track.length:
            # The verdict's windows read `plateau_cap_s` before them (`mem_plateau_s`) and the floors of
            # all before (`Floors`): the first as samples, the rest folded into the device's floors.
            lookback = math.ceil(self.model.config.plateau_cap_s / track.stride) * track.stride
            cut = max(track.anchor, track.next_start - lookback) - half
            self._fold(track, recent, cut)
            return recent.take(np.flatnonzero(recent.time >= cut)), track.floors, False
        return None

    def _finish(
        self, track: _DeviceTrack, pred: WindowPredictions | None, first: bool
    ) -> tuple[str, dict[str, float], bool]:
        """Keep the newly judged windows `pred` (None: none fell due) and decode the kept windows as the
        verdict does (`verdict.phase_segments`).

        Returns (phase, probabilities of the newest judged window, whether the newest window went unjudged
        and the decoder bridged it). Before two full windows exist (warm-up) the phase is the newest window
        of what there is, not kept: the first reading comes after a few samples, not after 45 s."""
        if pred is not None:
            if first and len(pred) < 2:  # warm-up: less than two windows' worth since the first sample
                return _newest(pred)
            self._keep(track, pred)
        return self._decode(track) if track.windows else (UNKNOWN, {}, False)

    def _predict_batched(self, asked: Sequence[tuple[Trace, Floors, bool]]) -> list[WindowPredictions]:
        """`PhaseModel.predict_trace` of each (trace, floors before it), the windows of all in one model call
        per model and signal set (`_predict_rows`)."""
        jobs = []
        for trace, floors, _ in asked:
            model = self.model.for_interval(sample_interval(trace.time))
            jobs.append((model, window_features(trace, model.config, floors=floors),
                         set(trace.present_signals())))
        out = []
        for (trace, _, _), (model, wf, _), (proba, labels, sub, reasons) in zip(
                asked, jobs, _predict_rows(jobs), strict=True):
            out.append(WindowPredictions(wf.start, wf.end, proba, labels, trace.missing_signals(),
                                         model.version, [], sub, reasons))
        return out

    def _fold(self, track: _DeviceTrack, recent: Trace, cut: float) -> None:
        """Fold the samples from `track.folded_to` up to `cut` into the device's floors, on the grid the
        model's windows use (`resample`: bin means, as `window_features` takes its minima over)."""
        part = recent.take(np.flatnonzero((recent.time >= track.folded_to) & (recent.time < cut)))
        track.folded_to = max(track.folded_to, cut)
        if len(part) == 0:
            return
        config = self.model.for_interval(sample_interval(recent.time)).config
        step = sample_interval(recent.time)
        dt = max(step if math.isfinite(step) else 1.0, config.min_grid_s)
        _, grid = resample(part, dt, [s for s in ("power", "mem_used") if part.has(s)])

        def low(signal: str, before: float) -> float:
            values = grid.get(signal)
            if values is None or not np.isfinite(values).any():
                return before
            return min(before, float(np.nanmin(values)))

        track.floors = Floors(low("power", track.floors.power), low("mem_used", track.floors.mem_used))

    def _keep(self, track: _DeviceTrack, pred: WindowPredictions) -> None:
        """Keep the full windows of `pred` from the next one due on (the rest were context, judged before)."""
        if len(pred) >= 2:  # the grid of this prediction (it moves only when the rate does)
            track.stride = float(pred.start[1] - pred.start[0])
            track.length = float(pred.end[0] - pred.start[0])
        for k in range(len(pred)):
            start, end = float(pred.start[k]), float(pred.end[k])
            if end - start < track.length * (1 - 1e-9):
                continue  # a trace shorter than one window gives one short window: not the verdict's
            if math.isfinite(track.next_start) and start < track.next_start - 0.5 * track.stride:
                continue  # judged already (context for the new ones)
            track.windows.append(_Window(start, end, pred.proba[k].copy(), pred.labels[k]))
            track.kept += 1
            track.next_start = start + track.stride

    def _decode(self, track: _DeviceTrack) -> tuple[str, dict[str, float], bool]:
        """The kept windows' phase now: the last of their segments, as the verdict cuts them."""
        if track.decoded is None or track.decoded[0] != track.kept:  # else none kept since (2 runs in 3)
            segs = verdict.phase_segments(_Kept(track.windows), self.min_segment_s)
            judged = [w for w in reversed(track.windows) if np.isfinite(w.proba).all()]
            proba = {p: float(v) for p, v in zip(PHASES, judged[0].proba, strict=True)} if judged else {}
            last = segs[-1].label if segs else UNKNOWN
            held = bool(segs) and last != UNKNOWN and track.windows[-1].label == UNKNOWN
            track.decoded = (track.kept, (last, proba, held))
        phase, proba, held = track.decoded[1]
        return phase, dict(proba), held

    def _advance(
        self, track: _DeviceTrack, t: float, judged: tuple[str, dict[str, float], bool] | None, dark: bool
    ) -> None:
        prev = track.reading
        phase, proba, held = (UNKNOWN, {}, False) if dark or judged is None else judged
        # `since` is when this phase was first shown (the decoder may place its start a little earlier).
        since = prev.since if prev is not None and prev.phase == phase else t
        conf = proba.get(phase, math.nan)
        prev_t = track.shown.t if track.shown else t
        alarm = track.alarm is not None and track.alarm.active
        track.reading = PhaseReading(
            phase, conf, proba, since, t, held=held, training_alarm=alarm, alarm_at=track.alarm_at
        )
        track.shown = shown = self._gate(track, track.reading)
        if track.bands and track.bands[-1].phase == shown.phase:
            last = track.bands[-1]
            track.bands[-1] = PhaseBand(last.start, t, shown.phase)
        else:
            track.bands.append(PhaseBand(prev_t, t, shown.phase))

    def _gate(self, track: _DeviceTrack, r: PhaseReading) -> PhaseReading:
        """`r`, or "unknown" with the reason when its confidence is below min_confidence (when set)."""
        m = self.min_confidence
        # The newest judged window's own confidence (its best phase's). It is r.confidence while the reading
        # agrees with its window; while the hysteresis holds the old phase against a new one, r.confidence
        # is the old phase's share of a window that called another, low by construction, and gating on it
        # blanked every confident transition for the whole confirm.
        best = max(r.proba, key=lambda ph: r.proba[ph], default=UNKNOWN)
        conf = r.proba.get(best, math.nan)
        if m is None or r.phase == UNKNOWN or not conf < m:  # NaN: nothing to compare
            track.gated_since = math.nan
            return r
        if math.isnan(track.gated_since):
            track.gated_since = r.t
        why = f"{best} at confidence {conf:.3g} < min_confidence {m:g}"
        return replace(r, phase=UNKNOWN, confidence=math.nan, since=track.gated_since, held=False,
                       unknown_reason=why)

    # ---- readers ----

    def reading(self, uuid: str) -> PhaseReading | None:
        """The current reading of a device; None before its first run."""
        with self._lock:
            track = self._tracks.get(uuid)
            return track.shown if track else None

    def bands(self, uuid: str, since: float = -math.inf) -> list[PhaseBand]:
        """Phase stretches of a device ending after `since`, oldest first."""
        with self._lock:
            track = self._tracks.get(uuid)
            return [b for b in track.bands if b.end >= since] if track else []

    def phases(self) -> dict[str, str]:
        """uuid -> current phase, for every device with a reading (what the energy meter attributes to)."""
        with self._lock:
            return {u: t.shown.phase for u, t in self._tracks.items() if t.shown}


def _newest(pred: WindowPredictions) -> tuple[str, dict[str, float], bool]:
    """The warm-up reading: the newest window the model judged (none: unknown)."""
    judged = np.flatnonzero(np.isfinite(pred.proba).all(axis=1))
    if not judged.size:
        return UNKNOWN, {}, False
    i = int(judged[np.argmax(pred.end[judged])])
    return pred.labels[i], {p: float(pred.proba[i, k]) for k, p in enumerate(PHASES)}, False


def _tail(trace: Trace, after: float) -> Trace:
    """The samples of `trace` after `after`: a shorter span's read of the same ring."""
    return trace.take(np.flatnonzero(trace.time > after))


Prediction = tuple[FloatArray, list[str], str, list[str]]  # proba, labels, submodel, unknown reasons


def _predict_rows(jobs: Sequence[tuple[PhaseModel, WindowFeatures, set[str]]]) -> list[Prediction]:
    """`PhaseModel.predict_features` (no evidence) of each (model, windows, signals present), the jobs that
    share a model, a signal set and a sample interval stacked into one call: a window's prediction reads
    only its own row, so stacking changes no figure, and the model's fixed cost per call is paid once per
    tick instead of once per device."""
    groups: dict[tuple[int, frozenset[str], float, float], list[int]] = {}
    for k, (model, wf, present) in enumerate(jobs):
        groups.setdefault((id(model), frozenset(present), wf.interval_s, wf.sample_interval_s), []).append(k)
    out: list[Prediction | None] = [None] * len(jobs)
    for ks in groups.values():
        model, first, present = jobs[ks[0]]
        parts = [jobs[k][1] for k in ks]
        both = first if len(parts) == 1 else WindowFeatures(
            np.concatenate([w.start for w in parts]), np.concatenate([w.end for w in parts]),
            np.concatenate([w.values for w in parts]), first.names,
            np.concatenate([w.n_samples for w in parts]), np.concatenate([w.sufficient for w in parts]),
            first.interval_s, first.window_samples, first.present_signals, first.sample_interval_s)
        proba, labels, _, sub, reasons = model.predict_features(both, present, False)
        at = 0
        for k, w in zip(ks, parts, strict=True):
            n = len(w.start)
            out[k] = (proba[at:at + n], labels[at:at + n], sub, reasons[at:at + n])
            at += n
    return [o for o in out if o is not None]

