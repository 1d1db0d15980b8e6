"""Energy per device and per phase, from the energy counter where there is one, else from integrated power.

Two methods, chosen per device and always reported (`method`):

- ``counter``: differences of the `energy` counter (joules since the driver loaded). A counter keeps counting
  through a telemetry gap, so the energy across a NaN gap is exact. A decrease is a reset (driver reload) or a
  wrap: that one interval between two counter readings (missing readings between them do not split it)
  falls back to integrated power if both readings' rows have power and it passes the gap rule below, else
  it is left uncovered.
- ``integrated_power``: trapezoids of `power` over time. An interval is integrated only when it is no longer
  than `gap_factor` sample periods (one missing sample at 1 Hz is bridged, a minute of silence is not);
  longer gaps stay uncovered and are reported, never guessed.

`coverage` is the fraction of the span the energy figure actually covers. Energy is split between phase
segments through the cumulative energy curve, interpolated linearly inside a sample interval (the interval's
mean power is taken as constant), so per-phase energies always sum to the device total.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from phasescope.classify.decide import UNKNOWN, finite_or_none
from phasescope.features import sample_interval
from phasescope.schema import SIGNAL_NAMES, FloatArray, Trace

Method = Literal["counter", "integrated_power", "none"]

DEFAULT_GAP_FACTOR = 3.0
# Live meters without a given interval learn the sample period from this many most recent tick spacings.
PERIOD_TICKS = 600
# Time no phase segment claims, when segments are given: not judged, so "unknown", the one word every view
# uses for it (views/palette.py); it adds to the time the classifier itself called unknown.
UNSEGMENTED = UNKNOWN
J_PER_KWH = 3.6e6


# ---------------------------------------------------------------- segments


def as_segments(segments: Iterable[Any]) -> list[tuple[float, float, str]]:
    """(start, end, label) triples, sorted by start, from objects with `.start/.end/.label` or plain tuples.

    Raises ValueError for an end before its start or for overlapping segments (they would count energy twice).
    """
    out: list[tuple[float, float, str]] = []
    for seg in segments:
        if hasattr(seg, "start") and hasattr(seg, "end") and hasattr(seg, "label"):
            start, end, label = seg.start, seg.end, seg.label
        else:
            start, end, label = seg
        start_f, end_f = float(start), float(end)
        if not (math.isfinite(start_f) and math.isfinite(end_f)) or end_f < start_f:
            raise ValueError(
                f"segment {label!r} has start {start_f} and end {end_f}; expected finite start <= end"
            )
        out.append((start_f, end_f, str(label)))
    out.sort(key=lambda s: s[0])
    for (_, end_a, label_a), (start_b, _, label_b) in itertools.pairwise(out):
        if start_b < end_a - 1e-9:
            raise ValueError(
                f"segments {label_a!r} (ends {end_a}) and {label_b!r} (starts {start_b}) overlap"
            )
    return out


# ---------------------------------------------------------------- results


class _EnergyFigures:
    """kWh and mean power from `joules` over `covered_s` (the seconds that have energy data)."""

    joules: float
    covered_s: float

    @property
    def kwh(self) -> float:
        return self.joules / J_PER_KWH

    @property
    def mean_power_w(self) -> float:
        return self.joules / self.covered_s if self.covered_s > 0 else float("nan")

    @property
    def measured(self) -> bool:
        """Whether any second had a power or energy reading: without one the energy (and its cost) is
        unknown, not 0 J, also on a metered GPU whose readings all fell in a dropout."""
        return self.covered_s > 0

    @property
    def measured_joules(self) -> float | None:
        """`joules`, or None where it is not `measured`."""
        return self.joules if self.measured else None

    @property
    def measured_kwh(self) -> float | None:
        return self.kwh if self.measured else None


@dataclass(frozen=True)
class PhaseEnergy(_EnergyFigures):
    """Energy over the time one label's segments span on one device."""

    label: str
    joules: float
    seconds: float  # wall time of the segments (clipped to the trace)
    covered_s: float  # part of `seconds` that has energy data

    @property
    def coverage(self) -> float:
        return self.covered_s / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "joules": self.measured_joules,
            "kwh": self.measured_kwh,
            "seconds": self.seconds,
            "covered_s": self.covered_s,
            "coverage": finite_or_none(self.coverage),
            "mean_power_w": finite_or_none(self.mean_power_w),
        }


@dataclass(frozen=True)
class DeviceEnergy(_EnergyFigures):
    """Energy of one device over one trace, with the method used and how much of the span it covers."""

    device: str  # uuid
    name: str
    method: Method
    joules: float
    span_s: float  # first to last sample of the trace
    covered_s: float
    resets: int = 0  # counter decreases seen (each one interval bridged by power or left uncovered)
    phases: dict[str, PhaseEnergy] = field(default_factory=dict)

    @property
    def coverage(self) -> float:
        return self.covered_s / self.span_s if self.span_s > 0 else float("nan")

    @property
    def uncovered_s(self) -> float:
        return max(self.span_s - self.covered_s, 0.0)

    def phases_or_whole(self) -> dict[str, PhaseEnergy]:
        """`phases`, or the whole trace under ``unknown`` when no segments were given."""
        return self.phases or {
            UNSEGMENTED: PhaseEnergy(UNSEGMENTED, self.joules, self.span_s, self.covered_s)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "name": self.name,
            "method": self.method,
            "joules": self.measured_joules,
            "kwh": self.measured_kwh,
            "span_s": self.span_s,
            "covered_s": self.covered_s,
            "uncovered_s": self.uncovered_s,
            "coverage": finite_or_none(self.coverage),
            "mean_power_w": finite_or_none(self.mean_power_w),
            "resets": self.resets,
            "phases": {k: v.to_dict() for k, v in self.phases.items()},
        }


# ---------------------------------------------------------------- the cumulative curve


@dataclass(frozen=True)
class EnergyCurve:
    """Cumulative energy and covered time at each knot (sample time), both starting at 0."""

    time: FloatArray
    energy_j: FloatArray
    covered_s: FloatArray
    method: Method
    resets: int

    def at(self, t: Any) -> tuple[FloatArray, FloatArray]:
        """Cumulative (joules, covered seconds) at times `t`; flat outside the knots."""
        x = np.asarray(t, dtype=np.float64)
        if self.time.size == 0:
            zero = np.zeros_like(x)
            return zero, zero
        return np.interp(x, self.time, self.energy_j), np.interp(x, self.time, self.covered_s)

    def between(self, start: Any, end: Any) -> tuple[FloatArray, FloatArray]:
        """(joules, covered seconds) within each [start, end]."""
        e0, c0 = self.at(start)
        e1, c1 = self.at(end)
        return e1 - e0, c1 - c0


def _clean(time: FloatArray, values: FloatArray) -> tuple[FloatArray, FloatArray, npt.NDArray[np.intp]]:
    """Rows with finite time and value, sorted, one per distinct time. Returns (time, value, row index)."""
    rows = np.flatnonzero(np.isfinite(time) & np.isfinite(values))
    rows = rows[np.argsort(time[rows], kind="stable")]
    t = time[rows]
    keep = np.ones(t.size, dtype=bool)
    keep[1:] = np.diff(t) > 0
    rows = rows[keep]
    return time[rows], values[rows], rows


def _curve_from_intervals(
    t: FloatArray, de: FloatArray, dc: FloatArray, method: Method, resets: int
) -> EnergyCurve:
    energy = np.concatenate(([0.0], np.cumsum(de)))
    covered = np.concatenate(([0.0], np.cumsum(dc)))
    return EnergyCurve(t, energy, covered, method, resets)


def _bridge(p0: Any, p1: Any, dt: Any, max_gap_s: float) -> tuple[FloatArray, FloatArray]:
    """(joules, covered seconds) of power trapezoids over intervals `dt` with power `p0`, `p1` at their ends:
    an interval counts when both ends have power and it is no longer than `max_gap_s`, else it gives (0, 0).
    Arrays or scalars, so the batch curve and the live meter share one rule."""
    ok = np.isfinite(p0) & np.isfinite(p1) & (dt <= max_gap_s)
    return np.where(ok, 0.5 * (p0 + p1) * dt, 0.0), np.where(ok, dt, 0.0)


def _trapezoids(t: FloatArray, p: FloatArray, max_gap_s: float) -> tuple[FloatArray, FloatArray]:
    return _bridge(p[:-1], p[1:], np.diff(t), max_gap_s)


def energy_curve(
    trace: Trace,
    *,
    gap_factor: float = DEFAULT_GAP_FACTOR,
    max_gap_s: float | None = None,
    method: Method | None = None,
) -> EnergyCurve:
    """The cumulative energy curve of one trace: from the counter if it has one, else from integrated power.

    `max_gap_s` (default `gap_factor` x the median sample period) is the longest interval power is
    integrated over. `method` forces one method (for comparisons); by default the counter wins when present.
    """
    time = trace.time
    period = sample_interval(time)
    gap = max_gap_s if max_gap_s is not None else gap_factor * period
    if not math.isfinite(gap):
        gap = 0.0
    power = trace["power"]
    counter = trace["energy"]
    use_counter = method == "counter" or (method is None and int(np.isfinite(counter).sum()) >= 2)
    if use_counter:
        t, e, rows = _clean(time, counter)
        if t.size < 2:
            return EnergyCurve(t, np.zeros(t.size), np.zeros(t.size), "counter", 0)
        de = np.diff(e)
        dc = np.diff(t)
        reset = de < 0
        if reset.any():
            # The counter restarted inside these intervals (between two counter readings, whatever NaN
            # readings lie between): bridge them with the power at those two readings where both have it.
            bridge_j, bridge_s = _bridge(power[rows[:-1]], power[rows[1:]], dc, gap)
            de = np.where(reset, bridge_j, de)
            dc = np.where(reset, bridge_s, dc)
        return _curve_from_intervals(t, de, dc, "counter", int(reset.sum()))
    t, p, _ = _clean(time, power)
    if t.size < 2:
        return EnergyCurve(t, np.zeros(t.size), np.zeros(t.size), "integrated_power" if t.size else "none", 0)
    de, dc = _trapezoids(t, p, gap)
    return _curve_from_intervals(t, de, dc, "integrated_power", 0)


# ---------------------------------------------------------------- per device, per phase


def device_energy(
    trace: Trace,
    segments: Iterable[Any] | None = None,
    *,
    gap_factor: float = DEFAULT_GAP_FACTOR,
    max_gap_s: float | None = None,
    method: Method | None = None,
) -> DeviceEnergy:
    """Energy of one trace, and per phase label when `segments` ((start, end, label) or Segments) are given.

    Time no segment claims goes under the label ``unknown``, so phases always sum to the total.
    """
    curve = energy_curve(trace, gap_factor=gap_factor, max_gap_s=max_gap_s, method=method)
    span_s = trace.duration()
    total_j = float(curve.energy_j[-1]) if curve.energy_j.size else 0.0
    covered = float(curve.covered_s[-1]) if curve.covered_s.size else 0.0
    phases: dict[str, PhaseEnergy] = {}
    if segments is not None and len(trace) > 0:
        segs = as_segments(segments)
        lo, hi = float(np.nanmin(trace.time)), float(np.nanmax(trace.time))
        if segs:
            starts = np.clip(np.array([s[0] for s in segs]), lo, hi)
            ends = np.clip(np.array([s[1] for s in segs]), lo, hi)
            joules, cov = curve.between(starts, ends)
            acc: dict[str, list[float]] = {}
            for (_, _, label), j, c, secs in zip(segs, joules, cov, ends - starts, strict=True):
                row = acc.setdefault(label, [0.0, 0.0, 0.0])
                row[0] += float(j)
                row[1] += float(secs)
                row[2] += float(c)
            phases = {k: PhaseEnergy(k, v[0], v[1], v[2]) for k, v in acc.items()}
        claimed = [
            sum(p.joules for p in phases.values()),
            sum(p.seconds for p in phases.values()),
            sum(p.covered_s for p in phases.values()),
        ]
        rest = PhaseEnergy(
            UNSEGMENTED, total_j - claimed[0], max(span_s - claimed[1], 0.0), covered - claimed[2]
        )
        if rest.seconds > 1e-9 or abs(rest.joules) > 1e-6:
            judged = phases.get(UNSEGMENTED)
            if judged is not None:  # segments the classifier called unknown: one row with the rest
                rest = PhaseEnergy(UNSEGMENTED, judged.joules + rest.joules, judged.seconds + rest.seconds,
                                   judged.covered_s + rest.covered_s)
            phases[UNSEGMENTED] = rest
    return DeviceEnergy(
        trace.device.uuid, trace.device.name, curve.method, total_j, span_s, covered, curve.resets, phases
    )


def energy_per_device(
    traces: Sequence[Trace],
    segments: Mapping[str, Iterable[Any]] | Sequence[Iterable[Any] | None] | None = None,
    **kwargs: Any,
) -> list[DeviceEnergy]:
    """`device_energy` for each trace; `segments` is keyed by device uuid, or a list parallel to `traces`."""
    out = []
    for i, trace in enumerate(traces):
        if segments is None:
            segs = None
        elif isinstance(segments, Mapping):
            segs = segments.get(trace.device.uuid)
        else:
            segs = segments[i]
        out.append(device_energy(trace, segs, **kwargs))
    return out


def totals_by_phase(results: Iterable[DeviceEnergy]) -> dict[str, PhaseEnergy]:
    """Phase energies summed over devices (seconds are device-seconds); a device without segments counts
    whole under ``unknown``, so the labels always sum to the fleet total."""
    acc: dict[str, list[float]] = {}
    for r in results:
        for label, p in r.phases_or_whole().items():
            row = acc.setdefault(label, [0.0, 0.0, 0.0])
            row[0] += p.joules
            row[1] += p.seconds
            row[2] += p.covered_s
    return {k: PhaseEnergy(k, v[0], v[1], v[2]) for k, v in acc.items()}


# ---------------------------------------------------------------- live


class EnergyMeter:
    """Energy so far for one device, fed one tick at a time (for the TUI and the dashboard).

    `update(t, power_w, energy_j, phase)` attributes the interval since the previous tick to `phase` (the
    phase current at this tick; None -> "unknown"). Once the device has shown a counter reading, the counter
    is used; until then, power is integrated with the batch method's gap rule: `gap_factor` x the sample
    period, where the period is `interval_s` when given, else learnt like the batch method's, the median tick
    spacing of the last `PERIOD_TICKS` ticks, so ticks 5 or 10 s apart are metered as the batch figure meters
    the same samples. An interval is judged by the spacings before it (the first by itself, as the batch rule
    judges two samples): with few ticks known a median that counted the interval itself let one hiccup
    (ticks 0, 1, 30 s) vouch for itself and be bridged. `update(period_s=...)` gives the period from outside
    (`FleetEnergyMeter`: the source's tick clock). `max_gap_s` fixes the allowance outright.
    A counter that returns after a gap covers the gap exactly; its energy goes to the phase at its return.
    A reset is bridged like the batch curve's: from the last counter reading, with the power at both readings.
    """

    def __init__(
        self,
        interval_s: float | None = None,
        gap_factor: float = DEFAULT_GAP_FACTOR,
        max_gap_s: float | None = None,
    ) -> None:
        self.gap_factor = gap_factor
        self._fixed_gap_s = (
            max_gap_s if max_gap_s is not None else None if interval_s is None else gap_factor * interval_s
        )
        # Recent tick spacings (data clock) the period is learnt from when no interval is given; bounded, so
        # a long session costs constant memory. Live ticks are meant to be regular: the median settles soon.
        self._spacings: deque[float] = deque(maxlen=PERIOD_TICKS)
        self.first_time = float("nan")
        self.last_time = float("nan")
        self.resets = 0
        self._last_power = (float("nan"), float("nan"))  # (time, watts) of the last finite power
        # (time, joules, watts) at the last finite counter reading; the watts (NaN if missing there) bridge a
        # reset from that reading, as `energy_curve` bridges the interval between two counter readings.
        self._last_counter = (float("nan"), float("nan"), float("nan"))
        self._by_method: dict[str, float] = {"counter": 0.0, "integrated_power": 0.0}  # covered seconds
        self._phases: dict[str, list[float]] = {}  # label -> [joules, seconds, covered_s]

    def update(
        self,
        tick_time: float,
        power_w: float,
        energy_j: float = float("nan"),
        phase: str | None = None,
        period_s: float | None = None,
    ) -> float:
        """Take one tick; returns the joules it added. Ticks come in time order; older ones are ignored.
        `period_s`: the sample period to judge this tick's interval by, when the caller knows it."""
        t = float(tick_time)
        if not math.isfinite(t) or (math.isfinite(self.last_time) and t <= self.last_time):
            return 0.0
        label = phase or "unknown"
        spacing = t - self.last_time  # NaN at the first tick
        max_gap_s = self._gap(spacing if period_s is None else float("nan"), period_s)
        if math.isfinite(spacing):
            self._spacings.append(spacing)
        added_j, added_cov, via = 0.0, 0.0, ""
        p, e = float(power_w), float(energy_j)
        t0, e0, p_at_e0 = self._last_counter
        if math.isfinite(e) and math.isfinite(e0):
            if e >= e0:
                added_j, added_cov, via = e - e0, t - t0, "counter"
            else:
                # Reset or wrap since the last counter reading (NaN readings may lie between): bridge that
                # interval with the power at its two readings, as the batch curve does.
                self.resets += 1
                bridge_j, bridge_s = _bridge(p_at_e0, p, t - t0, max_gap_s)
                added_j, added_cov, via = float(bridge_j), float(bridge_s), "counter"
        elif not math.isfinite(e0) and math.isfinite(p):
            # No counter seen yet (this tick's reading, if any, is its first): integrate power.
            # (`_bridge`'s rule, written out: this runs every tick, where numpy on scalars costs ~8x.)
            tp, p0 = self._last_power
            if math.isfinite(p0) and t - tp <= max_gap_s:
                added_j, added_cov, via = 0.5 * (p + p0) * (t - tp), t - tp, "integrated_power"
        if math.isfinite(e):
            self._last_counter = (t, e, p)
        if math.isfinite(p):
            self._last_power = (t, p)
        if via:
            self._by_method[via] += added_cov
        if math.isfinite(self.last_time):
            row = self._phases.setdefault(label, [0.0, 0.0, 0.0])
            row[0] += added_j
            row[1] += t - self.last_time
            row[2] += added_cov
        else:
            self.first_time = t
        self.last_time = t
        return added_j

    def _gap(self, first: float = float("nan"), period_s: float | None = None) -> float:
        """The allowance: fixed, else `gap_factor` x `period_s` when given, else x the median of the spacings
        known, else x `first` (the one interval there is)."""
        if self._fixed_gap_s is not None:
            return self._fixed_gap_s
        if period_s is None:
            period_s = median_spacing(self._spacings, first)
        gap = self.gap_factor * period_s
        return gap if math.isfinite(gap) else 0.0  # as `energy_curve`: no period known, nothing bridged

    @property
    def max_gap_s(self) -> float:
        """The longest interval power is integrated (or a counter reset bridged) over, as of the last tick."""
        return self._gap()

    @property
    def joules(self) -> float:
        return sum(v[0] for v in self._phases.values())

    @property
    def covered_s(self) -> float:
        return sum(v[2] for v in self._phases.values())

    @property
    def span_s(self) -> float:
        return self.last_time - self.first_time if math.isfinite(self.first_time) else 0.0

    @property
    def method(self) -> Method:
        by = self._by_method
        if by["counter"] == 0.0 and by["integrated_power"] == 0.0:
            return "none"
        return "counter" if by["counter"] >= by["integrated_power"] else "integrated_power"

    def phases(self) -> dict[str, PhaseEnergy]:
        return {k: PhaseEnergy(k, v[0], v[1], v[2]) for k, v in self._phases.items()}

    def result(self, device: str = "", name: str = "") -> DeviceEnergy:
        return DeviceEnergy(
            device, name, self.method, self.joules, self.span_s, self.covered_s, self.resets, self.phases()
        )


def median_spacing(spacings: Sequence[float], first: float = float("nan")) -> float:
    """The median of `spacings` (positive tick spacings); `first` when there are none yet."""
    if not spacings:
        return first
    return float(np.median(np.fromiter(spacings, dtype=np.float64, count=len(spacings))))


class FleetEnergyMeter:
    """One `EnergyMeter` per device, fed whole `TickBatch`es (sources/base.py) as the sampler makes them.

    `interval_s` None (the default): the sample period is learnt from the batches' own spacing (the
    source's tick clock, once per tick for all devices), so a device missing from some batches (unlisted
    for an hour, then back) is not bridged across its absence by a period learnt from its few ticks."""

    def __init__(self, interval_s: float | None = None, gap_factor: float = DEFAULT_GAP_FACTOR) -> None:
        self.interval_s = interval_s
        self.gap_factor = gap_factor
        self.meters: dict[str, EnergyMeter] = {}
        self.names: dict[str, str] = {}
        self._spacings: deque[float] = deque(maxlen=PERIOD_TICKS)
        self._last_time = float("nan")
        self._power_col = SIGNAL_NAMES.index("power")
        self._energy_col = SIGNAL_NAMES.index("energy")

    def update(self, batch: Any, phases: Mapping[str, str] | None = None) -> None:
        """`batch` is a TickBatch; `phases` maps device uuid -> current phase label."""
        t = float(batch.time)
        period: float | None = None  # None: fixed by interval_s, or a batch no newer than the last
        if self.interval_s is None and math.isfinite(t) and not t <= self._last_time:
            spacing = t - self._last_time  # NaN at the first batch
            period = median_spacing(self._spacings, spacing)  # the spacings before this one, as a meter's
            if math.isfinite(spacing):
                self._spacings.append(spacing)
            self._last_time = t
        for row, dev in enumerate(batch.devices):
            meter = self.meters.get(dev.uuid)
            if meter is None:
                meter = self.meters[dev.uuid] = EnergyMeter(self.interval_s, self.gap_factor)
                self.names[dev.uuid] = dev.name
            meter.update(
                batch.time,
                batch.values[row, self._power_col],
                batch.values[row, self._energy_col],
                (phases or {}).get(dev.uuid),
                period,
            )

    def results(self) -> list[DeviceEnergy]:
        return [m.result(uuid, self.names.get(uuid, "")) for uuid, m in self.meters.items()]
