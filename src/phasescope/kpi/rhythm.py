"""Phase KPIs from telemetry alone (no hooks, no code change in the job): columnar numpy over one device.

- training: the step period, from the rhythm of utilisation and power (their autocorrelation on a uniform
  grid; the confidence is the peak's prominence), steps per hour, and the share of time stalled;
- inference: the busy fraction, the rate and mean length of busy bursts, and saturation;
- every phase: SM, tensor and DRAM activity (GPM / DCGM) where the trace has them, the *measured proxy* for
  MFU (the share of cycles a unit was busy, not the share of peak FLOPs).

Each figure carries its method and a confidence. NVML's `gpu_util` is the share of its sample period in which
a kernel ran, so 1 - gpu_util is the share in which none did: the stall and busy figures read it as that.

A rhythm is only seen when it is slower than the signal changes: NVML refreshes utilisation every 1/6 to 1 s
and averages power over up to 1 s, so a step period under two refresh intervals (measured from the trace: how
often the values change) cannot be told and the step period is None, with the reason. The constants below
were fixed from these reasons before any run was scored; docs/EVALUATION.md ("Telemetry-only KPIs") gives
the figures and what changed after the first scoring.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from phasescope.errors import InputError
from phasescope.schema import FloatArray, Trace

F64 = npt.NDArray[np.float64]

BUSY = 0.5  # a sample is busy when a kernel ran in at least half of its period (gpu_util is that share)
ACTIVE = 0.05  # a burst sample: kernels ran in over 5 % of it (an idle GPU reads 0; 1 % is the quantum)
MIN_PERIODS = 3  # a rhythm must repeat at least 3 times inside one unbroken stretch to be called one
MIN_PROMINENCE = 0.3  # an autocorrelation peak must stand this far above the troughs beside it ...
NOISE_SIGMAS = 4.0  # ... and 4 standard errors of white noise's autocorrelation (1 / sqrt(samples))
SUBHARMONIC = 0.6  # the period's peak and multiples stand at least this high relative to the highest
# (grid rounding lowers a short period's own peak: a square wave of 3.7 grid steps peaks at 0.64 at lag 4,
# 0.87 at lag 11)
HARMONIC = 0.5  # multiples of the period used to refine it must keep half the first peak's height
MAX_GAP = 3.0  # a gap over 3 median sample intervals splits a trace into stretches (no rhythm across it)
SATURATED_BUSY = 0.95  # saturated: kernels ran in 95 % of the time ...
PLATEAU = 0.9  # ... and power never dips: its 10th percentile is within 10 % of its 95th
MIN_SAMPLES = 8  # fewer samples in the span: no figure at all


@dataclass(frozen=True)
class Figure:
    """One KPI: its value (None when it cannot be told, with the reason), unit, method and confidence (0-1:
    for an estimate, how clearly the data carried it; for a direct reading, the share of the span's samples
    that had the signal; None where there is no value or nothing to doubt)."""

    value: float | bool | None
    unit: str
    method: str
    confidence: float | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        value = self.value
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out: dict[str, Any] = {"value": value, "unit": self.unit, "method": self.method,
                               "confidence": None if self.confidence is None else round(self.confidence, 3)}
        if self.reason:
            out["reason"] = self.reason
        return out


# ----- inputs ------------------------------------------------------------------------------------------


def _check(t: F64, x: F64, name: str) -> None:
    if t.ndim != 1 or x.shape != t.shape:
        raise InputError("telemetry", f"signal {name!r}", f"a 1-D array as long as the time column "
                         f"({t.shape[0] if t.ndim == 1 else t.shape})", x.shape)
    if t.size > 1 and not bool(np.all(np.diff(t) > 0)):
        i = int(np.flatnonzero(~(np.diff(t) > 0))[0])
        raise InputError("telemetry", f"time column at sample {i + 1}", "strictly increasing times (s)",
                         float(t[i + 1]))


def _median_dt(t: F64) -> float:
    dt = np.diff(t)
    return float(np.median(dt)) if dt.size else math.nan


def _stretches(t: F64, dt: float) -> list[tuple[int, int]]:
    """[i0, i1) index ranges of t with no gap over MAX_GAP sample intervals."""
    if not t.size:
        return []
    cut = np.flatnonzero(np.diff(t) > MAX_GAP * dt) + 1
    edges = np.concatenate(([0], cut, [t.size]))
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges.tolist()) if b > a]


def update_interval(t: F64, x: F64) -> float:
    """How often the signal really changes, in seconds: the span over the number of value changes (a 10 Hz
    poll of a utilisation NVML refreshes at 5 Hz repeats each value twice). NaN when it never changes."""
    ok = np.isfinite(x)
    t, x = t[ok], x[ok]
    if t.size < 2:
        return math.nan
    changes = int(np.count_nonzero(np.diff(x) != 0))
    return float((t[-1] - t[0]) / changes) if changes else math.nan


# ----- the step rhythm ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rhythm:
    """The autocorrelation's best period (s), its prominence and height, and the signals and grid used."""

    period_s: float | None
    prominence: float
    height: float
    signals: tuple[str, ...]
    grid_s: float
    min_period_s: float
    reason: str | None = None


def _pooled_acf(t: F64, x: F64, dt: float, max_lag: int) -> tuple[F64, int]:
    """Autocorrelation at lags 0..max_lag (grid steps of dt) of a signal, pooled over its unbroken
    stretches (each resampled onto a uniform grid and linearly detrended), and the grid samples used."""
    ok = np.isfinite(x)
    t, x = t[ok], x[ok]
    num = np.zeros(max_lag + 1)
    cnt = np.zeros(max_lag + 1)
    var = 0.0
    n_all = 0
    for a, b in _stretches(t, dt):
        if t[b - 1] - t[a] < 2 * dt:
            continue
        grid = np.arange(t[a], t[b - 1] + dt / 2, dt)
        y = np.interp(grid, t[a:b], x[a:b])
        y = y - np.polyval(np.polyfit(np.arange(y.size), y, 1), np.arange(y.size))
        n = y.size
        size = 1 << int(2 * n - 1).bit_length()
        spec = np.fft.rfft(y, size)
        ac = np.fft.irfft(spec * np.conj(spec), size)[: min(n, max_lag + 1)]
        num[: ac.size] += ac
        cnt[: ac.size] += n - np.arange(ac.size)
        var += float(ac[0])
        n_all += n
    if n_all == 0 or var <= 0:
        return np.full(max_lag + 1, np.nan), n_all
    with np.errstate(invalid="ignore", divide="ignore"):
        acf = (num / cnt) / (var / n_all)
    return acf, n_all


def _peaks(acf: F64, lo: int) -> list[tuple[int, float]]:
    """(lag, prominence) of every local maximum at lags >= lo (the troughs between it and the nearest
    higher point on each side, or the ends; lag 0 is the highest point of an autocorrelation)."""
    a = acf
    n = a.size
    out: list[tuple[int, float]] = []
    if n < 3:
        return out
    inner = np.flatnonzero((a[1:-1] > a[:-2]) & (a[1:-1] >= a[2:])) + 1
    for k in inner[inner >= lo].tolist():
        h = a[k]
        left = np.flatnonzero(a[:k] > h)
        lbase = float(np.min(a[(left[-1] if left.size else 0):k + 1]))
        right = np.flatnonzero(a[k + 1:] > h)
        rbase = float(np.min(a[k:(k + 1 + right[0]) if right.size else n]))
        out.append((k, h - max(lbase, rbase)))
    return out


def _refine(acf: F64, k: int) -> float:
    """The lag of the peak at k to a fraction of a grid step (a parabola through it and its neighbours)."""
    if k <= 0 or k >= acf.size - 1:
        return float(k)
    y0, y1, y2 = acf[k - 1], acf[k], acf[k + 1]
    den = y0 - 2 * y1 + y2
    return float(k) if den >= 0 else float(k + 0.5 * (y0 - y2) / den)


def _divides(acf: F64, k: int, k_top: int, floor: float) -> bool:
    """Whether the peak at lag k is the period of the one at k_top: every multiple of k up to k_top stands
    at least `floor` high (each the highest within a quarter period of where the period so far puts it, the
    period re-estimated from each, so rounding does not drift) and the last multiple is the top peak."""
    lag = _refine(acf, k)
    n = round(_refine(acf, k_top) / lag)
    k_j = k
    for j in range(1, n + 1):
        lo = max(0, round(j * lag - max(1.0, lag / 4)))
        hi = min(acf.size - 1, round(j * lag + max(1.0, lag / 4)))
        if lo > hi:  # the period so far puts this multiple past the last lag: it cannot be checked
            return False
        k_j = lo + int(np.argmax(acf[lo:hi + 1]))
        if acf[k_j] < floor:
            return False
        if 0 < k_j < acf.size - 1:
            lag = _refine(acf, k_j) / j
    return n >= 1 and abs(k_j - k_top) <= 1


def rhythm(t: Any, signals: Mapping[str, Any]) -> Rhythm:
    """The period of the strongest repeating pattern in `signals` (name -> values on times `t`), or a
    Rhythm with period None and the reason. Signals that never change carry no rhythm and are left out."""
    t = np.asarray(t, dtype=np.float64)
    cols = {k: np.asarray(v, dtype=np.float64) for k, v in signals.items()}
    for name, x in cols.items():
        _check(t, x, name)
    dt = _median_dt(t)
    none = Rhythm(None, 0.0, 0.0, (), dt, math.nan)
    if t.size < MIN_SAMPLES or not dt > 0:
        return replace(none, reason=f"too few samples ({t.size})")
    stretches = _stretches(t, dt)
    longest = max(b - a for a, b in stretches)
    max_lag = int(longest // MIN_PERIODS)
    used: dict[str, float] = {}
    for name, x in cols.items():
        upd = update_interval(t, x)
        if math.isfinite(upd):
            used[name] = upd
    if not used:
        return replace(none, reason="utilisation and power never change")
    upd = min(used.values())
    lo = max(2, math.ceil(2 * upd / dt - 1e-6))  # a period must span two refreshes of the signal (Nyquist)
    min_period = lo * dt
    if max_lag <= lo:
        return Rhythm(None, 0.0, 0.0, tuple(used), dt, min_period,
                      f"the longest unbroken stretch ({longest * dt:.0f} s) holds fewer than {MIN_PERIODS} "
                      f"periods of the shortest period visible ({min_period:.2g} s)")
    acfs = []
    n_eff = 0.0
    for name in used:
        acf, n = _pooled_acf(t, cols[name], dt, max_lag)
        if np.isfinite(acf[lo:]).any():
            acfs.append(acf)
            n_eff = max(n_eff, n * dt / used[name])  # independent readings: one per refresh
    if not acfs:
        return Rhythm(None, 0.0, 0.0, tuple(used), dt, min_period, "no stretch long enough")
    stack = np.vstack(acfs)
    n_ok = np.isfinite(stack).sum(axis=0)
    acf = np.nansum(stack, axis=0) / np.maximum(n_ok, 1)
    acf = acf[: int(np.argmin(n_ok > 0)) if not (n_ok > 0).all() else acf.size]  # lags no stretch reaches
    threshold = max(MIN_PROMINENCE, NOISE_SIGMAS / math.sqrt(max(n_eff, 1.0)))
    peaks = [(k, p) for k, p in _peaks(acf, lo) if p >= threshold and acf[k] > 0]
    if not peaks:
        best = max((p for _, p in _peaks(acf, lo)), default=0.0)
        return Rhythm(None, best, 0.0, tuple(used), dt, min_period,
                      f"no autocorrelation peak at {min_period:.2g} s or longer stands {threshold:.2f} above "
                      f"its troughs (best {best:.2f}); a step period under {min_period:.2g} s cannot be seen "
                      f"at this refresh rate")
    # The highest peak (ties, to 0.001: the shortest lag) may be a multiple of the period: grid and refresh
    # rounding lower the period's own peak. The period is the shortest peak at least SUBHARMONIC as high
    # whose every multiple up to the highest stands as high too (a lag that only happens to divide it has
    # troughs at its multiples).
    k_top, p_top = max(peaks, key=lambda kp: (round(float(acf[kp[0]]), 3), -kp[0]))
    floor = SUBHARMONIC * float(acf[k_top])
    k_best, p_best = next(((k, p) for k, p in sorted(peaks)
                           if k <= k_top and acf[k] >= floor and _divides(acf, k, k_top, floor)),
                          (k_top, p_top))
    lag = _refine(acf, k_best)
    # Refine on the furthest multiple of the period still standing out: its lag's error is shared m ways.
    m = 2
    while m * lag + lag / 4 < acf.size - 1:
        lo_m, hi_m = int(m * lag - lag / 4), math.ceil(m * lag + lag / 4)
        k_m = lo_m + int(np.argmax(acf[lo_m:hi_m + 1]))
        if acf[k_m] < HARMONIC * acf[k_best] or k_m in (lo_m, hi_m):
            break
        lag = _refine(acf, k_m) / m
        m += 1
    return Rhythm(lag * dt, p_best, float(acf[k_best]), tuple(used), dt, min_period)


# ----- figures -----------------------------------------------------------------------------------------


def _coverage(x: F64) -> float:
    return float(np.isfinite(x).mean()) if x.size else 0.0


def _span_arrays(t: Any, util: Any, power: Any) -> tuple[FloatArray, FloatArray, FloatArray]:
    """A span's time, utilisation and power as float arrays, each checked against the time (`_check`)."""
    ta, u, p = (np.asarray(x, dtype=np.float64) for x in (t, util, power))
    _check(ta, u, "gpu_util")
    _check(ta, p, "power")
    return ta, u, p


def training_figures(t: Any, util: Any, power: Any) -> dict[str, Figure]:
    """Step period, steps per hour and stall share of a training span."""
    t, u, p = _span_arrays(t, util, power)
    r = rhythm(t, {name: x for name, x in (("gpu_util", u), ("power", p)) if np.isfinite(x).any()})
    used = " and ".join(r.signals) or "no signal"
    how = (f"autocorrelation of {used} on a {r.grid_s:.3g} s grid (linearly detrended stretches); the "
           f"shortest peak whose multiples up to the highest stand at least {SUBHARMONIC:g} as high, refined "
           f"on its multiples; the strongest rhythm, which is a checkpoint or evaluation cycle where that "
           f"outweighs the steps; confidence: the peak's prominence")
    conf = min(1.0, r.prominence) if r.period_s is not None else None
    out = {
        "step_period_s": Figure(r.period_s, "s", how, conf, r.reason),
        "steps_per_hour": Figure(3600.0 / r.period_s if r.period_s else None, "1/h",
                                 "3600 s over the step period", conf, r.reason),
        "shortest_visible_period_s": Figure(
            r.min_period_s, "s", "two refreshes of the faster-changing of gpu_util and power (measured from "
            "how often their values change): no shorter step period can be seen in this trace"),
    }
    ok = np.isfinite(u)
    busy = np.flatnonzero(ok & (u >= BUSY))
    sel = np.zeros(u.size, dtype=bool)
    if busy.size:
        sel[busy[0]:busy[-1] + 1] = True
    else:
        sel[:] = True
    sel &= ok
    stall = float(np.mean(1.0 - np.clip(u[sel], 0.0, 1.0))) if sel.any() else None
    out["stall_fraction"] = Figure(
        stall, "ratio",
        f"mean of 1 - gpu_util from the first to the last busy sample (gpu_util >= {BUSY:g}): the share of "
        f"time no kernel ran between busy stretches, gaps shorter than a sample included",
        _coverage(u), None if stall is not None else "no utilisation reading")
    return out


def _runs(mask: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Start and end (exclusive) indices of the runs of True."""
    d = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def inference_figures(t: Any, util: Any, power: Any) -> dict[str, Figure]:
    """Busy fraction, busy bursts (rate, mean length) and saturation of an inference span."""
    t, u, p = _span_arrays(t, util, power)
    ok = np.isfinite(u)
    cov = _coverage(u)
    dt = _median_dt(t)
    span = float(t[-1] - t[0] + dt) if t.size > 1 else math.nan
    busy = float(np.mean(np.clip(u[ok], 0.0, 1.0))) if ok.any() else None
    out = {"busy_fraction": Figure(busy, "ratio", "mean gpu_util: the share of time a kernel ran", cov,
                                   None if busy is not None else "no utilisation reading")}
    # Bursts: runs of samples in which kernels ran, split where the trace has a gap.
    starts: list[int] = []
    lengths: list[float] = []
    for a, b in _stretches(t[ok], dt):
        s, e = _runs(u[ok][a:b] >= ACTIVE)
        starts += s.tolist()
        lengths += ((e - s) * dt).tolist()
    have = ok.any() and math.isfinite(span) and span > 0
    burst_how = (f"runs of samples with gpu_util >= {ACTIVE:g}; bursts closer than one sample ({dt:.3g} s) "
                 f"merge, and a burst is at least one sample long")
    out["burst_rate_per_s"] = Figure(len(starts) / span if have else None, "1/s",
                                     f"bursts per second of the span; {burst_how}", cov)
    out["burst_mean_s"] = Figure(float(np.mean(lengths)) if lengths else None, "s",
                                 f"mean burst length; {burst_how}", cov,
                                 None if lengths else "no burst")
    pk = p[np.isfinite(p)]
    if busy is None or pk.size < MIN_SAMPLES:
        out["saturated"] = Figure(None, "bool", "busy all the time with power at its plateau", None,
                                  "no utilisation or power reading")
    else:
        p10, p95 = (float(v) for v in np.percentile(pk, [10, 95]))
        sat = busy >= SATURATED_BUSY and p10 >= PLATEAU * p95
        out["saturated"] = Figure(
            bool(sat), "bool",
            f"busy fraction >= {SATURATED_BUSY:g} ({busy:.2f}) and power's 10th percentile within "
            f"{1 - PLATEAU:.0%} of its 95th ({p10:.0f} of {p95:.0f} W)", min(cov, _coverage(p)))
    return out


ACTIVITY = ("sm_active", "tensor_active", "dram_active")
_ACTIVITY_HELP = {
    "sm_active": "share of SM cycles with a warp resident",
    "tensor_active": "share of cycles the tensor pipes were busy",
    "dram_active": "share of cycles the memory interface was busy",
}


def activity_figures(columns: Mapping[str, Any]) -> dict[str, Figure]:
    """Mean SM / tensor / DRAM activity where the trace has them: the measured proxy for MFU."""
    out: dict[str, Figure] = {}
    for name in ACTIVITY:
        x = columns.get(name)
        if x is None:
            continue
        x = np.asarray(x, dtype=np.float64)
        ok = np.isfinite(x)
        if not ok.any():
            continue
        out[name] = Figure(float(np.mean(x[ok])), "ratio",
                           f"mean {name} (GPM / DCGM: {_ACTIVITY_HELP[name]}); a measured proxy for MFU, "
                           f"not MFU (busy cycles, not the share of peak FLOPs)", _coverage(x))
    return out


def trace_kpis(trace: Trace, phase: str, spans: Sequence[tuple[float, float]] | None = None,
               fine: tuple[Any, Any, Any] | None = None) -> dict[str, Any]:
    """The telemetry-only KPIs of one device trace as JSON-ready dicts: the `phase`'s figures (training or
    inference) and activity for every phase, over the samples inside `spans` ((start, end) times; None:
    all). `fine`: (time, gpu_util, power) of NVML's own sub-second samples over the same span
    (live/fine.py), which the phase's figures then read instead of the trace's rows; activity stays on the
    rows (GPM has no sample buffer)."""
    t = trace.time
    sel = np.ones(t.size, dtype=bool)
    if spans is not None:
        sel[:] = False
        for a, b in spans:
            sel |= (t >= a) & (t <= b)
    idx = np.flatnonzero(sel & trace.rows_with_data())
    # A clock stepped back or a repeated timestamp: the first sample at each time, in time order.
    _, first = np.unique(t[idx], return_index=True)
    order = idx[first]
    out: dict[str, Any] = {"phase": phase, "samples": int(order.size),
                           "span_s": float(sum(b - a for a, b in spans)) if spans is not None
                           else trace.duration()}
    if order.size < MIN_SAMPLES:
        out["reason"] = f"too few samples in the {phase} span ({order.size})"
        return out
    tt, u, p = t[order], trace["gpu_util"][order], trace["power"][order]
    if fine is not None:
        tt, u, p = fine
        out["fine_samples"] = int(np.size(tt))
    figures: dict[str, Figure] = {}
    if phase == "training":
        figures.update(training_figures(tt, u, p))
    elif phase == "inference":
        figures.update(inference_figures(tt, u, p))
    figures.update(activity_figures({k: trace[k][order] for k in ACTIVITY}))
    out.update({k: f.to_dict() for k, f in figures.items()})
    return out
