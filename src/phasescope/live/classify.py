"""Live phase classification: the phase model run over each device's recent history as ticks arrive.

`LiveClassifier.update(state)` is cheap to call every tick: it re-classifies a device only when `every_s`
seconds (on the data's own clock, so a replay at speed N re-classifies N times as often in real time) have
passed since its last run. Each run judges the last `window_s` seconds with `PhaseModel.predict_trace` and
takes the newest window the model judged. At coarse rates the span widens as the model's windows do
(`WindowConfig.adapt_to_rate`) to hold `min_samples` points at the data's spacing (`read_span`): 60 s at
0.1 Hz holds 6 samples, and a window under 8 is never judged (offline `classify` answers on such data).

A new phase replaces the current one only after `confirm` consecutive runs agree on it, so one odd window
does not flip the badge; `since` is the time of the first of those runs (when phasescope first saw it).
Runs that cannot judge (too little history, too few signals) say "unknown" only when no phase is held yet
or the device has gone dark; otherwise the held phase stays until evidence for another one arrives, with
the confidence of the last window that was judged and `held` set (views mark it rather than show no %).

Two config thresholds (`[thresholds]`, see `config.py`) change this only when set. A reading whose
confidence is below `min_confidence` reads "unknown", with `unknown_reason` saying which phase at what
confidence (the hysteresis still runs on the phase underneath, so the badge returns without a fresh
confirmation); set below the model's own bar (0.5), it also lowers that bar, so windows between are
called. `min_segment_s` raises `confirm` so that a new phase shows only after it has been seen for that
long: ceil(min_segment_s / every_s) + 1 runs.

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
from dataclasses import dataclass, field, replace

import numpy as np

from phasescope.classify import onset
from phasescope.classify.decide import finite_or_none
from phasescope.classify.model import PhaseModel, UnknownRules
from phasescope.features import WindowConfig, sample_interval
from phasescope.live.state import LiveState, phase_from_hooks
from phasescope.schema import PHASES, SIGNAL_NAMES, Trace

UNKNOWN = "unknown"
MAX_BANDS = 500  # phase bands kept per device (the dashboard's coloured stretches)


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


@dataclass
class _DeviceTrack:
    last_run: float = -math.inf
    reading: PhaseReading | None = None  # the hysteresis' phase, before min_confidence
    shown: PhaseReading | None = None  # what readers get: `reading`, or unknown under min_confidence
    gated_since: float = math.nan  # data time `shown` last turned unknown under min_confidence
    candidate: str = ""  # a phase seen but not yet confirmed
    candidate_since: float = math.nan
    candidate_runs: int = 0
    bands: deque[PhaseBand] = field(default_factory=lambda: deque(maxlen=MAX_BANDS))
    alarm: onset.OnsetAlarm | None = None  # None: the alarm is off
    alarm_run: float = -math.inf  # data time of the alarm's last update
    alarm_at: float | None = None


DEFAULT_WINDOW_S = 60.0  # the data each classifier run judges


def read_span(
    interval_s: float,
    window_s: float = DEFAULT_WINDOW_S,
    config: WindowConfig | None = None,
    rules: UnknownRules | None = None,
) -> float:
    """Seconds of data each classifier run reads at `interval_s`: `window_s`, or at coarse rates enough for
    `config.min_samples` points (how `window_features` widens a window when `adapt_to_rate`). Intervals
    past the model's range (`rules.max_interval_s`) are judged unknown whatever is read, so the span stops
    growing there. `config` and `rules` default to the shipped model's (the features' defaults)."""
    cfg = config or WindowConfig()
    r = rules or UnknownRules()
    if not (cfg.adapt_to_rate and math.isfinite(interval_s) and interval_s > 0):
        return window_s  # an interval not known yet (one sample): nothing to widen for
    # (t - span, t] at spacing dt holds span/dt points: min_samples * dt holds min_samples.
    return max(window_s, cfg.min_samples * min(interval_s, r.max_interval_s))


def ring_ticks(
    interval_s: float,
    window_s: float = DEFAULT_WINDOW_S,
    alarm: bool = True,
    config: WindowConfig | None = None,
    rules: UnknownRules | None = None,
) -> int:
    """Ticks a device's ring must hold at `interval_s` so that every run sees all it reads: the classifier's
    `read_span` and, with the alarm on, `onset.HISTORY_S` (the history the alarm was evaluated on). At 10 Hz
    the rings' defaults (300 ticks in `top`) would hold only 30 s."""
    span = max(read_span(interval_s, window_s, config, rules), onset.HISTORY_S if alarm else 0.0)
    return math.ceil(span / max(interval_s, 1e-3)) + 1


class LiveClassifier:
    """Current phase per device, from a `LiveState`'s ring buffers. Thread-safe: one updater, many readers."""

    def __init__(
        self,
        model: PhaseModel | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        every_s: float = 5.0,
        confirm: int = 2,
        alarm: bool = True,
        alarm_model: PhaseModel | None = None,
        min_confidence: float | None = None,
        min_segment_s: float | None = None,
    ) -> None:
        if not (window_s > 0 and every_s > 0 and confirm >= 1):
            raise ValueError(
                f"need window_s > 0, every_s > 0, confirm >= 1; got {window_s}, {every_s}, {confirm}"
            )
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
        self.confirm = int(confirm)
        if min_segment_s is not None:  # the candidate's first run and the confirming one span min_segment_s
            self.confirm = max(self.confirm, math.ceil(min_segment_s / self.every_s) + 1)
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
        return ring_ticks(interval_s, self.window_s, self.alarm_enabled, self.model.config, self.model.rules)

    def read_span(self, interval_s: float) -> float:
        """`read_span` for this classifier's window and model."""
        return read_span(interval_s, self.window_s, self.model.config, self.model.rules)

    # ---- writer ----

    def update(self, state: LiveState, now: float | None = None) -> None:
        """Re-classify every device of `state` whose last run is `every_s` or more before `now`, except
        those whose phase comes from hooks (`phase_from_hooks`).

        `now` is on the data clock (TickBatch.time); None takes the state's latest tick time.
        """
        t_now = state.last_tick_time if now is None else float(now)
        if not math.isfinite(t_now):
            return  # no tick yet
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
            if track.alarm is not None and t_now - track.alarm_run >= onset.ONSET_STRIDE_S:
                self._alarm_step(state, uuid, track, track.alarm, t_now)
            if not due:
                continue
            # The spacing of the newest samples only: over the whole ring, a rate that changed mid-session
            # (a 1 s recording turning 10 s) kept the old median for half a ring, and the span too short.
            newest = state.history_times(uuid)[-(self.model.config.min_samples + 1):]
            span = self.read_span(sample_interval(newest))
            trace = self._recent(state, uuid, t_now, span)
            dark = self._dark(state, uuid, trace, t_now)
            phase, proba = (UNKNOWN, {}) if dark else self._judge(trace)
            with self._lock:
                track.last_run = t_now
                self.runs += 1
                self._advance(track, t_now, phase, proba, dark=dark)

    def _new_track(self) -> _DeviceTrack:
        track = _DeviceTrack()
        if self.alarm_enabled:
            model = self.alarm_model()
            track.alarm = onset.OnsetAlarm(model, onset.alarm_params(model))
        return track

    def _alarm_step(
        self, state: LiveState, uuid: str, track: _DeviceTrack, alarm: onset.OnsetAlarm, t_now: float
    ) -> None:
        """Feed the device's last HISTORY_S seconds to its onset alarm; the reading follows its state."""
        trace = self._recent(state, uuid, t_now, onset.HISTORY_S)
        dark = self._dark(state, uuid, trace, t_now)
        if dark:  # whatever held has ended; start afresh when data returns
            alarm = track.alarm = onset.OnsetAlarm(alarm.model, alarm.params)
        fired = False if dark else alarm.update(trace)
        with self._lock:
            track.alarm_run = t_now
            self.alarm_runs += 1
            if fired:
                track.alarm_at = t_now
            elif not alarm.active:
                track.alarm_at = None
            if track.reading is not None:
                track.reading = replace(track.reading, training_alarm=alarm.active, alarm_at=track.alarm_at)
            if track.shown is not None:
                track.shown = replace(track.shown, training_alarm=alarm.active, alarm_at=track.alarm_at)

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
        times = state.history_times(uuid)
        keep = (times > t_now - span) & (times <= t_now)
        cols = {s: state.history(uuid, s)[keep] for s in SIGNAL_NAMES}
        recent = Trace(state.device_info(uuid), times[keep], cols)
        # Only rows with some data: a lost device's NaN rows would otherwise read as a sampled gap.
        return recent.take(recent.rows_with_data())

    def _judge(self, trace: Trace) -> tuple[str, dict[str, float]]:
        """(label of the newest judged window, its probabilities); ("unknown", {}) when none was judged."""
        if len(trace) < 2:
            return UNKNOWN, {}
        pred = self.model.predict_trace(trace, evidence=False)
        judged = np.flatnonzero(np.isfinite(pred.proba).all(axis=1))
        if not judged.size:
            return UNKNOWN, {}
        i = int(judged[np.argmax(pred.end[judged])])
        return pred.labels[i], {p: float(pred.proba[i, k]) for k, p in enumerate(PHASES)}

    def _advance(
        self, track: _DeviceTrack, t: float, phase: str, proba: dict[str, float], dark: bool
    ) -> None:
        prev = track.reading
        held = prev.phase if prev else UNKNOWN
        no_evidence = phase == UNKNOWN and not dark and held != UNKNOWN
        if no_evidence and prev is not None:
            # Keep the held phase rather than flicker to unknown, with the last judged window's figures.
            phase, proba = held, prev.proba
        if phase == held:
            track.candidate, track.candidate_runs = "", 0
            new_phase, since = held, (track.reading.since if track.reading else t)
        else:
            if phase != track.candidate:
                track.candidate, track.candidate_since, track.candidate_runs = phase, t, 0
            track.candidate_runs += 1
            # Going to unknown needs no confirmation from a dark device; neither does the very first call.
            if track.candidate_runs >= self.confirm or held == UNKNOWN or dark:
                new_phase, since = phase, track.candidate_since
                track.candidate, track.candidate_runs = "", 0
            else:
                new_phase, since = held, (track.reading.since if track.reading else t)
        conf = proba.get(new_phase, math.nan)
        prev_t = track.shown.t if track.shown else t
        alarm = track.alarm is not None and track.alarm.active
        track.reading = PhaseReading(
            new_phase, conf, proba, since, t, held=no_evidence, training_alarm=alarm, alarm_at=track.alarm_at
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
