"""Window features for the phase classifier, computed for all windows of a trace at once.

Pipeline: resample the trace onto a regular grid (NaN where there was no sample), cut the grid into
overlapping windows (a strided view, no copy), then reduce every window with array operations along
axis 1. There is no per-window Python loop. What several features share per signal (count, mean,
centred values, standard deviation, one FFT) is computed once per trace (`_Win`, `_periodicity`).

Every feature depends on a known set of signals (`FEATURE_SIGNALS`); a feature whose signals are
missing is NaN, so callers can tell "absent" from "zero". Features that need the device's limits
(power limit, total memory, maximum clocks) take them from the trace, else from `KNOWN_GPUS`, else
they are NaN.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from phasescope.schema import FloatArray, Trace

GIB_BYTES = 1024.0**3

# name pattern -> (power limit W, memory bytes, max SM clock Hz, max memory clock Hz).
# Board defaults from vendor datasheets; used only when the trace itself lacks the limit.
_KNOWN: list[tuple[str, tuple[float, float, float, float]]] = [
    (r"h200", (700.0, 141 * GIB_BYTES, 1980e6, 3201e6)),  # NVML on our H200: 150.75e9 B (140.4 GiB)
    (r"h100.*pcie", (350.0, 80 * GIB_BYTES, 1755e6, 1593e6)),
    (r"h100", (700.0, 80 * GIB_BYTES, 1980e6, 2619e6)),
    (r"a100.*80", (400.0, 80 * GIB_BYTES, 1410e6, 1593e6)),
    (r"a100.*pcie", (250.0, 40 * GIB_BYTES, 1410e6, 1215e6)),
    (r"a100", (400.0, 40 * GIB_BYTES, 1410e6, 1215e6)),
    (r"l40s", (350.0, 48 * GIB_BYTES, 2520e6, 9001e6)),
    (r"\bl4\b", (72.0, 24 * GIB_BYTES, 2040e6, 6251e6)),
    (r"\ba10g\b", (300.0, 24 * GIB_BYTES, 1710e6, 6251e6)),
    (r"\ba10\b", (150.0, 24 * GIB_BYTES, 1695e6, 6251e6)),
    (r"\bt4\b", (70.0, 16 * GIB_BYTES, 1590e6, 5001e6)),
    (r"v100.*32", (300.0, 32 * GIB_BYTES, 1530e6, 877e6)),
    (r"v100", (300.0, 16 * GIB_BYTES, 1530e6, 877e6)),
    (r"(rtx ?)?4090", (450.0, 24 * GIB_BYTES, 3105e6, 10501e6)),
    (r"(rtx ?)?3090", (350.0, 24 * GIB_BYTES, 2100e6, 9751e6)),
]
KNOWN_GPUS: dict[str, tuple[float, float, float, float]] = dict(_KNOWN)


@dataclass(frozen=True)
class DeviceLimits:
    power_limit: float = float("nan")  # watts
    mem_total: float = float("nan")  # bytes
    max_sm_clock: float = float("nan")  # hertz
    max_mem_clock: float = float("nan")  # hertz


def lookup_gpu(name: str) -> DeviceLimits:
    """Limits of a known GPU model by (loose) name, e.g. "NVIDIA GeForce RTX 3090" or "A100-SXM4-40GB"."""
    key = name.lower().replace("-", " ").replace("_", " ")
    for pattern, (pw, mem, sm, mc) in _KNOWN:
        if re.search(pattern, key):
            return DeviceLimits(pw, mem, sm, mc)
    return DeviceLimits()


def device_limits(trace: Trace, use_table: bool = True) -> DeviceLimits:
    """Limits from the trace's own columns first, then the known-model table (by name or meta hint)."""
    table = DeviceLimits()
    if use_table:
        name = trace.device.name or str(trace.meta.get("gpu_model", ""))
        table = lookup_gpu(name) if name else DeviceLimits()

    def col(name: str) -> float:
        if trace.has(name):
            return float(np.nanmedian(trace.columns[name]))
        return float("nan")

    power = col("power_limit")
    mem = col("mem_total")
    return DeviceLimits(
        power_limit=power if np.isfinite(power) and power > 0 else table.power_limit,
        mem_total=mem if np.isfinite(mem) and mem > 0 else table.mem_total,
        max_sm_clock=table.max_sm_clock,
        max_mem_clock=table.max_mem_clock,
    )


@dataclass(frozen=True)
class WindowConfig:
    window_s: float = 30.0
    stride_s: float = 15.0
    # A window needs this many grid points holding data (of the core signals) to be judged at all.
    min_samples: int = 8
    # ... and this share of its grid points holding data.
    min_coverage: float = 0.5
    # At coarse rates, widen the window (and stride) so that it can hold `min_samples` points.
    adapt_to_rate: bool = True
    # Caps on "seconds since" features, so that a long live trace looks like the runs the model saw.
    plateau_cap_s: float = 120.0
    # Finer samples are averaged onto a grid this coarse, so a 10 Hz log and a 1 Hz poll of the same
    # workload give the same features (NVML's own utilisation counter averages over up to 1 s anyway).
    min_grid_s: float = 0.0


# feature name -> signals it reads. "limits" features also need the device limits (else NaN).
FEATURE_SIGNALS: dict[str, tuple[str, ...]] = {}
LIMIT_FEATURES: set[str] = set()


def _reg(names: list[str], signals: tuple[str, ...], needs_limits: bool = False) -> None:
    for n in names:
        FEATURE_SIGNALS[n] = signals
        if needs_limits:
            LIMIT_FEATURES.add(n)


_reg(
    [
        "util_mean",
        "util_std",
        "util_p10",
        "util_p50",
        "util_p90",
        "util_max",
        "util_duty",
        "util_high",
        "util_transitions_per_min",
        "util_ac_1s",
        "util_ac_5s",
        "util_acf_peak",
        "util_acf_peak_lag_s",
        "util_spectral_entropy",
        "util_burst_len_s",
    ],
    ("gpu_util",),
)
_reg(["memutil_mean", "memutil_std", "memutil_p90", "memutil_ac_1s"], ("mem_util",))
_reg(["memutil_per_util"], ("mem_util", "gpu_util"))
_reg(
    [
        "power_cv",
        "power_ac_1s",
        "power_ac_5s",
        "power_acf_peak",
        "power_spectral_entropy",
        "power_rel_range",
        "power_above_floor",
    ],
    ("power",),
)
_reg(["power_frac_mean", "power_frac_p90", "power_frac_std"], ("power",), needs_limits=True)
_reg(
    ["mem_gib", "mem_cv", "mem_slope_gib_per_min", "mem_rise_gib", "mem_plateau_s", "mem_changes_per_min"],
    ("mem_used",),
)
_reg(["mem_frac", "mem_rise_frac"], ("mem_used",), needs_limits=True)
_reg(["corr_power_memutil"], ("power", "mem_util"))
_reg(["corr_power_util"], ("power", "gpu_util"))
_reg(["corr_util_memutil"], ("gpu_util", "mem_util"))
_reg(["corr_power_mem"], ("power", "mem_used"))
_reg(["corr_util_mem"], ("gpu_util", "mem_used"))
_reg(["temp_slope_per_min", "temp_std"], ("temperature",))
_reg(["sm_clock_cv", "sm_clock_ac_1s"], ("sm_clock",))
_reg(["sm_clock_frac", "sm_clock_frac_min"], ("sm_clock",), needs_limits=True)
_reg(["mem_clock_frac"], ("mem_clock",), needs_limits=True)
_reg(["mem_clock_cv"], ("mem_clock",))
_reg(
    ["pcie_rx_log", "pcie_tx_log", "pcie_rx_cv", "pcie_tx_cv", "pcie_rx_tx_log_ratio", "pcie_rx_burst"],
    ("pcie_rx", "pcie_tx"),
)

FEATURE_NAMES: tuple[str, ...] = tuple(FEATURE_SIGNALS)

# The signals whose coverage decides whether a window has enough data (any one of them suffices).
CORE_SIGNALS: tuple[str, ...] = ("gpu_util", "power", "mem_used", "mem_util")


@dataclass
class WindowFeatures:
    """Features for every window of one trace."""

    start: FloatArray  # window start, seconds (trace clock)
    end: FloatArray
    values: FloatArray  # (n_windows, n_features), NaN where a feature's signals are missing
    names: tuple[str, ...]
    n_samples: np.ndarray  # grid points with data, per window
    sufficient: np.ndarray  # bool: enough coverage to be judged
    interval_s: float  # grid spacing: the median sample interval, or the config's min_grid_s if coarser
    window_samples: int
    present_signals: list[str]
    sample_interval_s: float = float("nan")  # the trace's own median sample interval (NaN: one sample)

    def column(self, name: str) -> FloatArray:
        return self.values[:, self.names.index(name)]


# --------------------------------------------------------------------------------------------
# Resampling


def sample_interval(time: FloatArray) -> float:
    """Median positive spacing of the time column; NaN if it cannot be told."""
    if time.size < 2:
        return float("nan")
    d = np.diff(time)
    d = d[d > 0]
    return float(np.median(d)) if d.size else float("nan")


def resample(trace: Trace, interval_s: float, signals: Sequence[str]) -> tuple[float, dict[str, FloatArray]]:
    """Average samples into bins of `interval_s` on a grid from the first sample; NaN for empty bins."""
    t = trace.time
    t0 = float(t[0])
    idx = np.floor((t - t0) / interval_s + 0.5).astype(np.int64)
    n = int(idx[-1]) + 1 if idx.size else 0
    out: dict[str, FloatArray] = {}
    full_count: np.ndarray | None = None  # bin counts when every sample is finite, shared by such signals
    for s in signals:
        v = trace[s]
        ok = np.isfinite(v)
        if ok.all():
            if full_count is None:
                full_count = np.bincount(idx, minlength=n)
            total = np.bincount(idx, weights=v, minlength=n)
            count = full_count
        else:
            total = np.bincount(idx[ok], weights=v[ok], minlength=n)
            count = np.bincount(idx[ok], minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[s] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return t0, out


# --------------------------------------------------------------------------------------------
# Vectorised reductions over the rows of a (n_windows, w) array holding NaN for missing points.


# Fast paths: most windows hold no gap, and then the NaN masks (a third of the cost) can be skipped.
# `_dense` is the test; results are the same either way (checked in tests/test_features.py against
# the plain definitions).


def _dense(x: FloatArray) -> bool:
    return x.size > 0 and bool(np.isfinite(x).all())


def _count(x: FloatArray) -> np.ndarray:
    if _dense(x):
        return np.full(x.shape[0], x.shape[1], dtype=np.int64)
    return np.isfinite(x).sum(axis=1)


def _quantiles(x: FloatArray, qs: list[float], n: np.ndarray | None = None) -> list[FloatArray]:
    """Linear-interpolated quantiles per row, ignoring NaN (same definition as np.nanpercentile)."""
    n = _count(x) if n is None else n
    if x.size and x.shape[0] and bool((n == x.shape[1]).all()):
        # No gap: every row has the same order statistics to pick, and one partition places exactly
        # those (the values equal a full sort's at these positions, at a fraction of its cost).
        k = x.shape[1]
        at = [int(np.floor((k - 1) * q)) for q in qs]
        kth = sorted(set(at) | {min(a + 1, k - 1) for a in at})
        s = np.partition(x, kth, axis=1)
        # The same interpolation as below, with the (row-independent) positions as scalars.
        dense_out = []
        for q, j in zip(qs, at, strict=True):
            f = (k - 1) * q - j
            dense_out.append(s[:, j] * (1 - f) + s[:, min(j + 1, k - 1)] * f)
        return dense_out
    s = np.sort(x, axis=1)  # NaN sort to the end
    out = []
    rows = np.arange(x.shape[0])
    for q in qs:
        pos = (n - 1).clip(min=0) * q
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        frac = pos - lo
        v = s[rows, lo] * (1 - frac) + s[rows, hi] * frac
        out.append(np.where(n > 0, v, np.nan))
    return out


def _frac(cond: np.ndarray, x: FloatArray, dense: bool | None = None) -> FloatArray:
    if dense if dense is not None else _dense(x):
        return np.asarray(cond.sum(axis=1) / x.shape[1], dtype=np.float64)
    n = _count(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (cond & np.isfinite(x)).sum(axis=1) / np.maximum(n, 1), np.nan)


def _lag_corr(x: FloatArray, lag: int, dense: bool | None = None) -> FloatArray:
    """Autocorrelation at `lag` grid points, over the pairs where both points exist."""
    if lag <= 0 or lag >= x.shape[1]:
        return np.full(x.shape[0], np.nan)
    return _corr(x[:, :-lag], x[:, lag:], dense)


def _corr(a: FloatArray, b: FloatArray, dense: bool | None = None) -> FloatArray:
    """Pearson correlation per row over the positions where both are finite; 0 if either is constant.

    `dense` (both without gaps) may be passed when the caller already knows it."""
    if dense if dense is not None else (_dense(a) and _dense(b)):
        if a.shape[1] < 3:
            return np.full(a.shape[0], np.nan)
        da = a - a.mean(axis=1, keepdims=True)
        db = b - b.mean(axis=1, keepdims=True)
        cov = np.einsum("ij,ij->i", da, db)
        den = np.sqrt(np.einsum("ij,ij->i", da, da) * np.einsum("ij,ij->i", db, db))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 1e-12, cov / np.where(den > 0, den, 1.0), 0.0)
    ok = np.isfinite(a) & np.isfinite(b)
    n = ok.sum(axis=1)
    a0 = np.where(ok, a, 0.0)
    b0 = np.where(ok, b, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ma = a0.sum(axis=1) / np.maximum(n, 1)
        mb = b0.sum(axis=1) / np.maximum(n, 1)
        da = np.where(ok, a - ma[:, None], 0.0)
        db = np.where(ok, b - mb[:, None], 0.0)
        cov = (da * db).sum(axis=1)
        va = (da * da).sum(axis=1)
        vb = (db * db).sum(axis=1)
        den = np.sqrt(va * vb)
        r = np.where(den > 1e-12, cov / np.where(den > 0, den, 1.0), 0.0)
    return np.where(n >= 3, r, np.nan)


def _periodicity(wins: list[_Win], dt: float) -> list[tuple[FloatArray, FloatArray, FloatArray]]:
    """Per signal: strongest autocorrelation peak (lags 2 .. half the window), its lag in seconds, and
    spectral entropy. Missing points count as the row mean. One FFT serves all signals and both uses:
    the zero-padded transform (length 2w) gives the autocorrelation, and its even bins are the plain
    length-w transform that the spectrum needs."""
    n_win, w = wins[0].x.shape
    nan = np.full(n_win, np.nan)
    if w < 6:
        return [(nan, nan, nan) for _ in wins]
    # Transformed row by row per signal: batching signals into one call changes pocketfft's rounding,
    # enough to flip the argmax between two near-equal autocorrelation peaks.
    f = np.stack([np.fft.rfft(v.d, n=2 * w, axis=1) for v in wins])
    ac = np.stack([np.fft.irfft(g * np.conj(g), n=2 * w, axis=1)[:, :w] for g in f])
    ac0 = ac[..., :1]
    with np.errstate(invalid="ignore", divide="ignore"):  # normalised only at the lags searched
        acf = np.where(ac0 > 1e-12, ac[..., 2 : w // 2 + 1] / np.where(ac0 > 0, ac0, 1.0), 0.0)
    peak = acf.max(axis=-1)
    lag_s = (acf.argmax(axis=-1) + 2) * dt
    p = np.abs(f[..., ::2])[..., 1:] ** 2
    tot = p.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        pn = np.where(tot > 1e-18, p / np.where(tot > 0, tot, 1.0), 0.0)
        ent = -(pn * np.log(np.where(pn > 0, pn, 1.0))).sum(axis=-1) / np.log(max(p.shape[-1], 2))
    flat = tot[..., 0] <= 1e-18
    out = []
    for i, v in enumerate(wins):
        valid = v.n >= 6
        out.append(
            (
                np.where(valid & ~flat[i], peak[i], np.where(valid, 0.0, np.nan)),
                np.where(valid & ~flat[i], lag_s[i], np.nan),
                np.where(valid, np.where(flat[i], 0.0, ent[i]), np.nan),
            )
        )
    return out


def _slope(x: FloatArray, dt: float) -> FloatArray:
    """Least-squares slope per row, in units per second."""
    w = x.shape[1]
    t = np.arange(w, dtype=np.float64) * dt
    ok = np.isfinite(x)
    n = ok.sum(axis=1)
    tt = np.where(ok, t[None, :], 0.0)
    xx = np.where(ok, x, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mt = tt.sum(axis=1) / np.maximum(n, 1)
        mx = xx.sum(axis=1) / np.maximum(n, 1)
        dtm = np.where(ok, t[None, :] - mt[:, None], 0.0)
        num = (dtm * np.where(ok, x - mx[:, None], 0.0)).sum(axis=1)
        den = (dtm * dtm).sum(axis=1)
        return np.where((n >= 2) & (den > 0), num / np.where(den > 0, den, 1.0), np.nan)


def _transitions(busy: np.ndarray, x: FloatArray, dense: bool = False) -> FloatArray:
    """Count of busy/not-busy changes between consecutive existing points."""
    if dense:
        return (busy[:, 1:] != busy[:, :-1]).sum(axis=1).astype(np.float64)
    ok = np.isfinite(x)
    pair = ok[:, 1:] & ok[:, :-1]
    return ((busy[:, 1:] != busy[:, :-1]) & pair).sum(axis=1).astype(np.float64)


# --------------------------------------------------------------------------------------------


def _windows(grid: FloatArray, w: int, step: int) -> FloatArray:
    """Rows `grid[i*step : i*step + w]`: the same read-only view `sliding_window_view(grid, w)[::step]`
    gives, built directly (that helper's argument checks cost more than the view on short traces)."""
    if grid.ndim != 1 or not 0 < w <= grid.shape[0] or step < 1:
        return sliding_window_view(grid, w)[::step]
    (stride,) = grid.strides
    n = (grid.shape[0] - w) // step + 1
    return as_strided(grid, shape=(n, w), strides=(stride * step, stride), writeable=False)


class _Win:
    """One signal's windows with what several features share (count, mean, centred values, std),
    each computed once per trace rather than once per feature."""

    def __init__(self, x: FloatArray, dense: bool | None = None) -> None:
        """`dense`: whether the whole trace's windows of this signal hold no gap, where `x` is one chunk
        of them (the chunk then takes the whole trace's code path); None: told from `x`."""
        self.x = x
        self._ss: FloatArray | None = None
        self.ok = np.isfinite(x)
        self.dense = (x.size > 0 and bool(self.ok.all())) if dense is None else dense
        if self.dense:
            self.n = np.full(x.shape[0], x.shape[1], dtype=np.int64)
            self.mean: FloatArray = np.asarray(x.mean(axis=1), dtype=np.float64)
            self.d: FloatArray = x - self.mean[:, None]
            self.std: FloatArray = np.asarray(np.sqrt((self.d * self.d).mean(axis=1)), dtype=np.float64)
            return
        self.n = self.ok.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.mean = np.where(self.n > 0, np.nansum(x, axis=1) / np.maximum(self.n, 1), np.nan)
            self.d = np.where(self.ok, x - self.mean[:, None], 0.0)
            self.std = np.where(
                self.n > 0, np.sqrt((self.d * self.d).sum(axis=1) / np.maximum(self.n, 1)), np.nan
            )

    def sumsq(self) -> FloatArray:
        """Sum of squared deviations per row, shared by this signal's correlations (summed the way
        `_corr` sums it on each path, so the result is the same to the last bit)."""
        if self._ss is None:
            if self.dense:
                self._ss = np.einsum("ij,ij->i", self.d, self.d)
            else:
                self._ss = (self.d * self.d).sum(axis=1)
        assert self._ss is not None
        return self._ss


def _pair_corr(a: _Win, b: _Win, same_gaps: bool | None = None) -> FloatArray:
    """`_corr` of two signals' windows. Signals of one trace are usually missing at the same grid
    points (an empty bin is empty for all of them); then the pairwise means and centred values are
    each signal's own, already computed, and only the cross term is new. `same_gaps`: whether that holds
    over the whole trace, where `a` and `b` are one chunk of its windows (None: told from them)."""
    if a.x.shape[1] < 3 and a.dense and b.dense:
        return np.full(a.x.shape[0], np.nan)
    both = a.dense and b.dense
    if same_gaps is None:
        same_gaps = bool(np.array_equal(a.ok, b.ok))
    if not both and not same_gaps:
        return _corr(a.x, b.x, False)
    cov = np.einsum("ij,ij->i", a.d, b.d) if both else (a.d * b.d).sum(axis=1)
    den = np.sqrt(a.sumsq() * b.sumsq())
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(den > 1e-12, cov / np.where(den > 0, den, 1.0), 0.0)
    return r if both else np.where(a.n >= 3, r, np.nan)


# Grid points per chunk: window features are computed chunk by chunk (windows overlapping the seams are
# cut from both sides' samples), so the temporaries (each window's points, copied per signal several
# times) stay bounded however long the trace is. 2**15 points is 9 h at 1 s: tens of MiB.
CHUNK_POINTS = 1 << 15


@dataclass(frozen=True)
class Floors:
    """The lowest power (W) and memory used (bytes) on the grid before a trace's first sample. Windows'
    causal floors (`power_above_floor`, `mem_rise_gib`) run from the first sample; a trace cut from a
    longer stream passes what came before, so its windows match the whole stream's. inf: nothing before."""

    power: float = np.inf
    mem_used: float = np.inf


@dataclass
class _Carry:
    """What a chunk needs from the grid before it: the running power and memory minima, the last
    memory value seen (None: none yet) and the grid index where memory last moved."""

    power_floor: float = np.inf
    mem_base: float = np.inf
    mem_last: float | None = None
    mem_moved_at: int = 0


@dataclass(frozen=True)
class _Grid:
    """One trace's grid, cut once for all its chunks: spacing, window and stride in grid points, and
    the whole-trace facts that pick each reduction's code path (so every chunk takes the path the
    whole trace would, and the sums come out the same to the last bit)."""

    t0: float
    dt: float
    w: int
    step: int
    n_grid: int
    n_win: int
    dense: dict[str, bool]  # signal -> no gap in any window
    same_gaps: dict[tuple[str, str], bool]  # signal pair -> gaps at the same grid points in every window


def window_features(
    trace: Trace,
    config: WindowConfig | None = None,
    limits: DeviceLimits | None = None,
    use_table: bool = True,
    chunk_points: int | None = None,
    floors: Floors | None = None,
) -> WindowFeatures:
    """All features for all windows of `trace` (see module docstring), computed `chunk_points` grid
    points at a time (None: `CHUNK_POINTS`); the result does not depend on it. `floors`: the grid's
    lowest power and memory before the trace, for a trace cut from a longer stream (the live classifier's)."""
    cfg = config or WindowConfig()
    lim = limits or device_limits(trace, use_table=use_table)
    present = trace.present_signals()
    empty = WindowFeatures(
        np.zeros(0),
        np.zeros(0),
        np.zeros((0, len(FEATURE_NAMES))),
        FEATURE_NAMES,
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=bool),
        float("nan"),
        0,
        present,
    )
    if len(trace) == 0:
        return empty
    order = np.argsort(trace.time, kind="stable")
    if np.any(np.diff(order) < 0):
        trace = trace.take(order)
    raw_dt = dt = sample_interval(trace.time)
    if not np.isfinite(dt):
        dt = 1.0  # a single sample: any grid will do; the window will be marked insufficient
    dt = max(dt, cfg.min_grid_s)
    used = [s for s in _GRID_SIGNALS if s in present]
    w = max(1, round(cfg.window_s / dt))
    step = max(1, round(cfg.stride_s / dt))
    if cfg.adapt_to_rate and w < cfg.min_samples:
        step = max(1, round(cfg.min_samples * cfg.stride_s / cfg.window_s))
        w = cfg.min_samples
    trace, shift = _shorten_gaps(trace, dt, w, step, cfg.plateau_cap_s)
    t0 = float(trace.time[0])
    idx = np.floor((trace.time - t0) / dt + 0.5).astype(np.int64)  # each sample's grid point
    n_grid = int(idx[-1]) + 1
    w = min(w, n_grid)  # a trace shorter than one window: one (short) window over all of it
    n_win = (n_grid - w) // step + 1
    g = _Grid(t0, dt, w, step, n_grid, n_win, *_gap_facts(trace, idx, used, w, step, n_win))
    per = max(1, (chunk_points or CHUNK_POINTS) // step)  # windows per chunk
    carry = _Carry(floors.power, floors.mem_used) if floors is not None else _Carry()
    parts = [_chunk(trace, idx, used, g, k0, min(n_win, k0 + per), cfg, lim, carry)
             for k0 in range(0, n_win, per)]
    values = np.concatenate([p[0] for p in parts])
    n_samples = np.concatenate([p[1] for p in parts])
    sufficient = (n_samples >= cfg.min_samples) & (n_samples >= cfg.min_coverage * w)
    starts: FloatArray = t0 + np.arange(n_win, dtype=np.float64) * step * dt
    ends: FloatArray = starts + (w - 1) * dt
    if shift is not None:
        starts, ends, kept = _restore_gaps(starts, ends, trace.time, shift, dt)
        starts, ends, values = starts[kept], ends[kept], values[kept]
        n_samples, sufficient = n_samples[kept], sufficient[kept]
    return WindowFeatures(starts, ends, values, FEATURE_NAMES, n_samples, sufficient, dt, w, present, raw_dt)


_GRID_SIGNALS = ("gpu_util", "mem_util", "mem_used", "power", "temperature", "sm_clock", "mem_clock",
                 "pcie_tx", "pcie_rx")
_PAIRS = {
    "corr_power_memutil": ("power", "mem_util"),
    "corr_power_util": ("power", "gpu_util"),
    "corr_util_memutil": ("gpu_util", "mem_util"),
    "corr_power_mem": ("power", "mem_used"),
    "corr_util_mem": ("gpu_util", "mem_used"),
}


def _gap_facts(
    trace: Trace, idx: np.ndarray, used: Sequence[str], w: int, step: int, n_win: int
) -> tuple[dict[str, bool], dict[tuple[str, str], bool]]:
    """Per signal, whether its windows hold no gap; per correlated pair, whether both have their gaps at
    the same grid points (the facts `_Win` and `_pair_corr` would find on the whole trace's windows)."""
    pos = np.arange((n_win - 1) * step + w)
    covered = pos % step < w  # grid points some window holds (all of them unless the stride skips some)
    held = {}
    for s in used:
        v = trace[s]
        held[s] = np.zeros(pos.size, dtype=bool)
        on = idx[np.isfinite(v)]
        held[s][on[on < pos.size]] = True
    dense = {s: bool(held[s][covered].all()) for s in used}
    same = {(a, b): bool(np.array_equal(held[a][covered], held[b][covered]))
            for a, b in _PAIRS.values() if a in held and b in held}
    return dense, same


def _chunk(
    trace: Trace,
    idx: np.ndarray,
    used: Sequence[str],
    g: _Grid,
    k0: int,
    k1: int,
    cfg: WindowConfig,
    lim: DeviceLimits,
    carry: _Carry,
) -> tuple[FloatArray, np.ndarray]:
    """Feature rows and data counts of windows k0..k1-1, from the samples on their grid points; updates
    `carry` to where the next chunk (window k1) starts."""
    w, step, dt = g.w, g.step, g.dt
    g0 = k0 * step
    g1 = min(g.n_grid, max((k1 - 1) * step + w, k1 * step))
    lo, hi = np.searchsorted(idx, [g0, g1])
    local = idx[lo:hi] - g0
    n_grid = g1 - g0
    at = min(k1 * step - g0, n_grid) - 1  # the last grid point before the next chunk's first
    n_win = k1 - k0
    # Average samples into their grid points (NaN for empty ones), as `resample` does.
    grid: dict[str, FloatArray] = {}
    for s in used:
        v = trace[s][lo:hi]
        ok = np.isfinite(v)
        total = np.bincount(local[ok], weights=v[ok], minlength=n_grid)
        count = np.bincount(local[ok], minlength=n_grid)
        with np.errstate(invalid="ignore", divide="ignore"):
            grid[s] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    win = {s: _Win(_windows(grid[s], w, step)[:n_win], g.dense[s]) for s in grid}
    cols: dict[str, FloatArray] = {}
    nanv = np.full(n_win, np.nan)
    end_idx = np.minimum(np.arange(n_win) * step + w - 1, n_grid - 1)  # each window's last grid point

    # Coverage: grid points where any core signal exists.
    core = np.zeros(n_grid, dtype=bool)
    for s in CORE_SIGNALS:
        if s in grid:
            core |= np.isfinite(grid[s])
    n_samples = _windows(core.astype(np.float64), w, step)[:n_win].sum(axis=1).astype(np.int64)

    lag1 = round(1.0 / dt)
    lag5 = round(5.0 / dt)
    minutes = w * dt / 60.0
    periodic = [s for s in ("gpu_util", "power") if s in win]
    period = {}
    if periodic:
        period = dict(zip(periodic, _periodicity([win[s] for s in periodic], dt), strict=True))

    if "gpu_util" in win:
        U = win["gpu_util"]
        u = U.x
        has = U.n > 0
        cols["util_mean"] = U.mean
        cols["util_std"] = U.std
        cols["util_p10"], cols["util_p50"], cols["util_p90"] = _quantiles(u, [0.1, 0.5, 0.9], U.n)
        if U.dense:
            cols["util_max"] = np.asarray(u.max(axis=1), dtype=np.float64)
        else:
            cols["util_max"] = np.where(has, np.nanmax(np.where(U.ok, u, -np.inf), axis=1), np.nan)
        busy = u > 0.05
        cols["util_duty"] = _frac(busy, u, U.dense)
        cols["util_high"] = _frac(u > 0.9, u, U.dense)
        trans = _transitions(busy, u, U.dense)
        cols["util_transitions_per_min"] = np.where(U.n > 1, trans / minutes, np.nan)
        cols["util_ac_1s"] = _lag_corr(u, lag1, U.dense)
        cols["util_ac_5s"] = _lag_corr(u, lag5, U.dense)
        cols["util_acf_peak"], cols["util_acf_peak_lag_s"], cols["util_spectral_entropy"] = period["gpu_util"]
        # Mean length of a busy run, in seconds: busy time over number of busy starts.
        starts_busy = (busy[:, 1:] & ~busy[:, :-1]).sum(axis=1) + busy[:, 0]
        with np.errstate(invalid="ignore", divide="ignore"):
            burst = np.where(starts_busy > 0, busy.sum(axis=1) * dt / np.maximum(starts_busy, 1), 0.0)
        cols["util_burst_len_s"] = np.where(has, burst, np.nan)
    if "mem_util" in win:
        MU = win["mem_util"]
        cols["memutil_mean"] = MU.mean
        cols["memutil_std"] = MU.std
        (cols["memutil_p90"],) = _quantiles(MU.x, [0.9], MU.n)
        cols["memutil_ac_1s"] = _lag_corr(MU.x, lag1, MU.dense)
        if "gpu_util" in win:
            with np.errstate(invalid="ignore", divide="ignore"):
                cols["memutil_per_util"] = np.where(
                    cols["util_mean"] > 0.02, cols["memutil_mean"] / np.maximum(cols["util_mean"], 1e-9), 0.0
                )
            cols["memutil_per_util"] = np.where(
                np.isfinite(cols["util_mean"] + cols["memutil_mean"]), cols["memutil_per_util"], np.nan
            )
    if "power" in win:
        PW = win["power"]
        pw = PW.x
        pm = PW.mean
        ps = PW.std
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["power_cv"] = ps / np.where(pm > 0, pm, np.nan)
            p10, p90 = _quantiles(pw, [0.1, 0.9], PW.n)
            cols["power_rel_range"] = (p90 - p10) / np.where(pm > 0, pm, np.nan)
            # Power over the trace's lowest level so far (a causal floor): idle boards sit at the floor.
            floor = np.fmin.accumulate(np.where(np.isfinite(grid["power"]), grid["power"], np.inf))
            floor = np.minimum(floor, carry.power_floor)
            carry.power_floor = float(floor[at])
            floor_at = floor[end_idx]
            floor_at = np.where(np.isfinite(floor_at), floor_at, np.nan)
            cols["power_above_floor"] = pm / np.where(floor_at > 0, floor_at, np.nan)
        cols["power_ac_1s"] = _lag_corr(pw, lag1, PW.dense)
        cols["power_ac_5s"] = _lag_corr(pw, lag5, PW.dense)
        cols["power_acf_peak"], _, cols["power_spectral_entropy"] = period["power"]
        if np.isfinite(lim.power_limit):
            cols["power_frac_mean"] = pm / lim.power_limit
            cols["power_frac_p90"] = p90 / lim.power_limit
            cols["power_frac_std"] = ps / lim.power_limit
    if "mem_used" in win:
        mg = grid["mem_used"]
        MW = win["mem_used"]
        mm = MW.mean
        cols["mem_gib"] = mm / GIB_BYTES
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["mem_cv"] = MW.std / np.where(mm > 0, mm, np.nan)
        cols["mem_slope_gib_per_min"] = _slope(MW.x, dt) * 60.0 / GIB_BYTES
        # Memory above the lowest level seen since the trace (device or process) started: the ramp.
        base = np.minimum(np.fmin.accumulate(np.where(np.isfinite(mg), mg, np.inf)), carry.mem_base)
        carry.mem_base = float(base[at])
        base_at = np.where(np.isfinite(base[end_idx]), base[end_idx], np.nan)
        cols["mem_rise_gib"] = (mm - base_at) / GIB_BYTES
        # Seconds since memory last moved by more than 1% (of the total, or 0.25 GiB when unknown); the
        # first grid point of the trace counts as a move.
        thr = 0.01 * lim.mem_total if np.isfinite(lim.mem_total) else 0.25 * GIB_BYTES
        if carry.mem_last is None:  # no value before this chunk: a leading gap takes its first value
            filled = _ffill(mg)
            moved = np.empty(n_grid, dtype=bool)
            moved[0] = g0 == 0
            moved[1:] = np.abs(np.diff(filled)) > thr
        else:  # continue from the last value before this chunk, as one forward fill over the trace would
            ext = _ffill(np.concatenate([[carry.mem_last], mg]))
            moved = np.abs(np.diff(ext)) > thr
            filled = ext[1:]
        last = np.maximum.accumulate(np.where(moved, g0 + np.arange(n_grid), 0))
        last = np.maximum(last, carry.mem_moved_at)
        carry.mem_last = float(filled[at]) if np.isfinite(filled[at]) else None
        carry.mem_moved_at = int(last[at])
        cols["mem_plateau_s"] = np.minimum((end_idx + g0 - last[end_idx]) * dt, cfg.plateau_cap_s)
        changes = _windows(moved.astype(np.float64), w, step)[:n_win].sum(axis=1)
        cols["mem_changes_per_min"] = changes / minutes
        if np.isfinite(lim.mem_total):
            cols["mem_frac"] = mm / lim.mem_total
            cols["mem_rise_frac"] = cols["mem_rise_gib"] * GIB_BYTES / lim.mem_total
    for name, (a, b) in _PAIRS.items():
        if a in win and b in win:
            cols[name] = _pair_corr(win[a], win[b], g.same_gaps[(a, b)])
    if "temperature" in win:
        TW = win["temperature"]
        cols["temp_slope_per_min"] = _slope(TW.x, dt) * 60.0
        cols["temp_std"] = TW.std
    if "sm_clock" in win:
        SW = win["sm_clock"]
        sm = SW.mean
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["sm_clock_cv"] = SW.std / np.where(sm > 0, sm, np.nan)
        cols["sm_clock_ac_1s"] = _lag_corr(SW.x, lag1, SW.dense)
        if np.isfinite(lim.max_sm_clock):
            cols["sm_clock_frac"] = sm / lim.max_sm_clock
            (smin,) = _quantiles(SW.x, [0.0], SW.n)
            cols["sm_clock_frac_min"] = smin / lim.max_sm_clock
    if "mem_clock" in win:
        CW = win["mem_clock"]
        cm = CW.mean
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["mem_clock_cv"] = CW.std / np.where(cm > 0, cm, np.nan)
        if np.isfinite(lim.max_mem_clock):
            cols["mem_clock_frac"] = cm / lim.max_mem_clock
    if "pcie_rx" in win and "pcie_tx" in win:
        RX, TX = win["pcie_rx"], win["pcie_tx"]
        rm, tm = RX.mean, TX.mean
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["pcie_rx_log"] = np.log10(1.0 + np.maximum(rm, 0))
            cols["pcie_tx_log"] = np.log10(1.0 + np.maximum(tm, 0))
            cols["pcie_rx_cv"] = RX.std / np.where(rm > 0, rm, np.nan)
            cols["pcie_tx_cv"] = TX.std / np.where(tm > 0, tm, np.nan)
            cols["pcie_rx_tx_log_ratio"] = cols["pcie_rx_log"] - cols["pcie_tx_log"]
            (rx90,) = _quantiles(RX.x, [0.9], RX.n)
            cols["pcie_rx_burst"] = rx90 / np.where(rm > 0, rm, np.nan)

    values = np.column_stack([cols.get(n, nanv) for n in FEATURE_NAMES])
    return np.where(np.isfinite(values), values, np.nan), n_samples


# A silence longer than this many sample intervals (a log resumed days later, a clock that jumped) is
# shortened before the grid is built: the grid holds a point per interval, so a year-long gap at 10 Hz
# needed gigabytes. The real data's longest gap is 631 intervals, so none of it is touched.
MAX_GAP_INTERVALS = 100_000


def _shorten_gaps(
    trace: Trace, dt: float, w: int, step: int, cap_s: float
) -> tuple[Trace, FloatArray | None]:
    """The trace with each gap over MAX_GAP_INTERVALS cut down, and each sample's shift (None: no cut).

    Whole strides are cut, so windows after a gap sit where they were; enough is kept that no window
    reaches across it and "seconds since memory moved" still reaches its cap, so every window that holds
    data sees exactly what it saw on the uncut trace.
    """
    gaps = np.diff(trace.time)
    long = gaps > MAX_GAP_INTERVALS * dt
    if not long.any():
        return trace, None
    unit = step * dt
    keep = np.ceil((w + step + cap_s / dt) / step) * unit
    cut = np.where(long, np.floor((gaps - keep) / unit) * unit, 0.0)
    shift = np.concatenate([[0.0], np.cumsum(cut)])
    return Trace(trace.device, trace.time - shift, trace.columns, trace.meta), shift


def _restore_gaps(
    starts: FloatArray, ends: FloatArray, time: FloatArray, shift: FloatArray, dt: float
) -> tuple[FloatArray, FloatArray, np.ndarray]:
    """Window times back on the trace's clock, and which windows to keep: not those inside a cut gap."""
    # The first sample binned into or after each window (a sample within dt/2 of a grid point is on it).
    i = np.minimum(np.searchsorted(time, starts - 0.5 * dt), time.size - 1)
    holds = time[i] <= ends + 0.5 * dt
    after_cut = np.concatenate([[False], np.diff(shift) > 0])
    return starts + shift[i], ends + shift[i], holds | ~after_cut[i]


def _ffill(x: FloatArray) -> FloatArray:
    """Forward-fill NaN (leading NaN take the first finite value)."""
    ok = np.isfinite(x)
    if not ok.any():
        return x.copy()
    idx = np.where(ok, np.arange(x.size), 0)
    np.maximum.accumulate(idx, out=idx)
    out = x[idx]
    first = int(np.argmax(ok))
    out[:first] = x[first]
    return out


def features_for_signals(signals: set[str] | frozenset[str], with_limits: bool = True) -> list[str]:
    """Names of the features computable from `signals`."""
    return [
        n
        for n, deps in FEATURE_SIGNALS.items()
        if set(deps) <= set(signals) and (with_limits or n not in LIMIT_FEATURES)
    ]


def describe() -> dict[str, Any]:
    """Feature name -> signals it reads and whether it needs device limits (for docs and the model card)."""
    return {n: {"signals": list(s), "needs_limits": n in LIMIT_FEATURES} for n, s in FEATURE_SIGNALS.items()}
