"""Window features on real traces: vectorised result equals a naive per-window reference; rates and gaps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.features import (
    FEATURE_NAMES,
    FEATURE_SIGNALS,
    WindowConfig,
    device_limits,
    lookup_gpu,
    resample,
    sample_interval,
    window_features,
)
from phasescope.schema import Trace
from phasescope.sources.replay import read

RUN = "sensorguard-rtx3090/20260825_train_resnet_cifar10_verifier-gpu0_s2_r03/nvml.csv"
SPAN = (75602.026, 76197.084)


@pytest.fixture(scope="module")
def trace(shared_data: Path) -> Trace:
    t = read(str(shared_data / RUN))
    tr = next(x for x in t if x.meta.get("gpu_index", x.device.index) == 0)
    return tr.slice_time(*SPAN)


def _naive(trace: Trace, cfg: WindowConfig) -> dict[str, list[float]]:
    """Per-window loop with plain 1-D numpy: the definitions the vectorised code must match."""
    dt = sample_interval(trace.time)
    _, grid = resample(trace, dt, ["gpu_util", "power", "mem_util", "mem_used"])
    n = len(grid["gpu_util"])
    w, step = round(cfg.window_s / dt), round(cfg.stride_s / dt)
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "util_mean",
            "util_std",
            "util_p10",
            "util_p90",
            "util_duty",
            "util_ac_1s",
            "corr_power_memutil",
            "mem_gib",
            "power_cv",
        )
    }
    for s in range(0, n - w + 1, step):
        u = grid["gpu_util"][s : s + w]
        p = grid["power"][s : s + w]
        mu = grid["mem_util"][s : s + w]
        m = grid["mem_used"][s : s + w]
        uu = u[np.isfinite(u)]
        out["util_mean"].append(float(np.mean(uu)))
        out["util_std"].append(float(np.std(uu)))
        out["util_p10"].append(float(np.percentile(uu, 10)))
        out["util_p90"].append(float(np.percentile(uu, 90)))
        out["util_duty"].append(float(np.mean(uu > 0.05)))
        a, b = u[:-1], u[1:]
        ok = np.isfinite(a) & np.isfinite(b)
        out["util_ac_1s"].append(
            float(np.corrcoef(a[ok], b[ok])[0, 1]) if np.std(a[ok]) * np.std(b[ok]) > 0 else 0.0
        )
        ok = np.isfinite(p) & np.isfinite(mu)
        c = np.corrcoef(p[ok], mu[ok])[0, 1] if np.std(p[ok]) * np.std(mu[ok]) > 0 else 0.0
        out["corr_power_memutil"].append(float(c))
        out["mem_gib"].append(float(np.nanmean(m) / 1024**3))
        out["power_cv"].append(float(np.nanstd(p) / np.nanmean(p)))
    return out


def test_vectorised_equals_naive_reference(trace: Trace) -> None:
    cfg = WindowConfig()
    wf = window_features(trace, cfg)
    ref = _naive(trace, cfg)
    assert wf.values.shape == (len(ref["util_mean"]), len(FEATURE_NAMES))
    assert wf.values.shape[0] > 30
    for name, values in ref.items():
        np.testing.assert_allclose(wf.column(name), values, rtol=1e-9, atol=1e-9, err_msg=name)


def test_windows_follow_config(trace: Trace) -> None:
    wf = window_features(trace, WindowConfig(window_s=60, stride_s=30))
    assert np.allclose(np.diff(wf.start), 30, atol=0.1)
    assert np.allclose(wf.end - wf.start, 59, atol=0.1)
    assert wf.sufficient.all()


def test_gaps_mark_windows_and_keep_grid(trace: Trace) -> None:
    keep = np.ones(len(trace), dtype=bool)
    keep[100:160] = False  # a one-minute hole
    wf = window_features(trace.take(keep))
    full = window_features(trace)
    assert wf.values.shape == full.values.shape  # same grid: the gap is NaN, not squeezed out
    hole = (wf.start >= trace.time[100] - 1) & (wf.end <= trace.time[159] + 1)
    assert hole.any() and not wf.sufficient[hole].any()
    assert wf.sufficient[~hole].sum() >= 0.8 * (~hole).sum()


def _resampled(trace: Trace, interval: float) -> Trace:
    """Re-time a real trace to another rate (values repeat or thin out; the physics is kept)."""
    t = np.arange(trace.time[0], trace.time[-1], interval)
    idx = np.searchsorted(trace.time, t).clip(0, len(trace) - 1)
    return Trace(trace.device, t, {k: v[idx] for k, v in trace.columns.items()}, trace.meta)


def test_ten_hz_gives_the_same_windows_as_one_hz(trace: Trace) -> None:
    fast = window_features(_resampled(trace, 0.1))
    slow = window_features(trace)
    assert fast.window_samples == 300 and abs(fast.interval_s - 0.1) < 1e-6
    assert abs(fast.values.shape[0] - slow.values.shape[0]) <= 1
    np.testing.assert_allclose(
        np.nanmean(fast.column("util_mean")), np.nanmean(slow.column("util_mean")), rtol=0.05
    )


def test_one_per_minute_widens_windows(trace: Trace) -> None:
    wf = window_features(_resampled(trace, 60.0))
    assert wf.window_samples == WindowConfig().min_samples
    assert wf.values.shape[0] >= 1
    assert wf.sufficient.all()


def test_missing_signals_give_nan_features(trace: Trace) -> None:
    wf = window_features(trace.without("pcie_tx", "pcie_rx", "sm_clock"))
    for name, deps in FEATURE_SIGNALS.items():
        col = wf.column(name)
        if {"pcie_tx", "pcie_rx", "sm_clock"} & set(deps):
            assert np.isnan(col).all(), name
    assert np.isfinite(wf.column("util_mean")).all()


def test_limits_from_table_and_trace(trace: Trace) -> None:
    assert lookup_gpu("NVIDIA GeForce RTX 3090").power_limit == 350.0
    assert lookup_gpu("A100-SXM4-40GB").mem_total == 40 * 1024**3
    assert np.isnan(lookup_gpu("mystery board").power_limit)
    assert np.isnan(device_limits(trace, use_table=False).power_limit)
    wf = window_features(trace, use_table=False)
    assert np.isnan(wf.column("power_frac_mean")).all()
    hinted = Trace(trace.device, trace.time, trace.columns, {**trace.meta, "gpu_model": "RTX3090"})
    assert np.isfinite(window_features(hinted).column("power_frac_mean")).all()


def test_empty_and_tiny_traces() -> None:
    from phasescope.schema import DeviceInfo

    empty = Trace(DeviceInfo("x"), np.zeros(0), {"gpu_util": np.zeros(0)})
    assert window_features(empty).values.shape == (0, len(FEATURE_NAMES))
    one = Trace(DeviceInfo("x"), np.array([5.0]), {"gpu_util": np.array([0.5])})
    wf = window_features(one)
    assert wf.values.shape[0] == 1 and not wf.sufficient[0]


# --------------------------------------------------------------------------------------------
# The fast paths (shared per-signal statistics, partition for quantiles, one FFT per signal for both
# autocorrelation and spectrum, strided windows) must give the values of the plain definitions.


def _jittered(trace: Trace) -> Trace:
    """10 Hz with timing jitter, so that some grid bins are empty and others hold two samples."""
    fast = _resampled(trace, 0.1)
    rng = np.random.default_rng(1)
    t = fast.time + rng.uniform(-0.06, 0.06, len(fast))
    order = np.argsort(t)
    return Trace(fast.device, t[order], {k: v[order] for k, v in fast.columns.items()}, fast.meta)


def _holed(trace: Trace) -> Trace:
    keep = np.random.default_rng(2).random(len(trace)) > 0.2
    keep[200:240] = False
    return trace.take(keep)


def _periodicity_reference(x: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pre-optimisation definition: separate FFTs for the autocorrelation and the spectrum."""
    w = x.shape[1]
    m = np.nanmean(x, axis=1)
    d = np.where(np.isfinite(x), x - m[:, None], 0.0)
    f = np.fft.rfft(d, n=2 * w, axis=1)
    ac = np.fft.irfft(f * np.conj(f), n=2 * w, axis=1)[:, :w]
    acf = np.where(ac[:, :1] > 1e-12, ac / np.where(ac[:, :1] > 0, ac[:, :1], 1.0), 0.0)[:, 2 : w // 2 + 1]
    p = np.abs(np.fft.rfft(d, axis=1))[:, 1:] ** 2
    tot = p.sum(axis=1, keepdims=True)
    pn = np.where(tot > 1e-18, p / np.where(tot > 0, tot, 1.0), 0.0)
    ent = -(pn * np.log(np.where(pn > 0, pn, 1.0))).sum(axis=1) / np.log(max(p.shape[1], 2))
    flat = tot[:, 0] <= 1e-18
    valid = np.isfinite(x).sum(axis=1) >= 6
    return (
        np.where(valid & ~flat, acf.max(axis=1), np.where(valid, 0.0, np.nan)),
        np.where(valid & ~flat, (acf.argmax(axis=1) + 2) * dt, np.nan),
        np.where(valid, np.where(flat, 0.0, ent), np.nan),
    )


@pytest.mark.filterwarnings("ignore:.*slice:RuntimeWarning")  # numpy's nan-reductions on empty windows
@pytest.mark.parametrize("variant", ["1hz", "holes", "10hz_jitter"])
def test_fast_paths_equal_plain_definitions(trace: Trace, variant: str) -> None:
    from numpy.lib.stride_tricks import sliding_window_view

    from phasescope import features as F

    tr = {"1hz": trace, "holes": _holed(trace), "10hz_jitter": _jittered(trace)}[variant]
    dt = sample_interval(tr.time)
    signals = ["gpu_util", "power", "mem_used", "mem_util", "sm_clock", "pcie_rx"]
    _, grid = resample(tr, dt, signals)
    for s in signals:  # resampling: bin means of the finite samples, NaN for empty bins
        v = tr[s]
        idx = np.floor((tr.time - tr.time[0]) / dt + 0.5).astype(np.int64)
        total = np.bincount(idx, weights=v, minlength=grid[s].size)
        count = np.bincount(idx, minlength=grid[s].size)
        np.testing.assert_array_equal(grid[s], np.where(count > 0, total / np.maximum(count, 1), np.nan))
    w, step = round(30 / dt), round(15 / dt)
    wins = {}
    for s in signals:
        x = F._windows(grid[s], w, step)
        np.testing.assert_array_equal(x, sliding_window_view(grid[s], w)[::step])
        ws = wins[s] = F._Win(x)
        assert ws.dense == bool(np.isfinite(x).all())
        np.testing.assert_array_equal(ws.n, np.isfinite(x).sum(axis=1))
        np.testing.assert_allclose(ws.mean, np.nanmean(x, axis=1), rtol=1e-12)
        np.testing.assert_allclose(ws.std, np.nanstd(x, axis=1), rtol=1e-9, atol=1e-12)
        qs = [0.0, 0.1, 0.5, 0.9]
        np.testing.assert_allclose(
            np.array(F._quantiles(x, qs, ws.n)),
            np.nanpercentile(x, [100 * q for q in qs], axis=1).reshape(4, -1),
        )
        busy = x > np.nanmedian(x)
        np.testing.assert_array_equal(F._frac(busy, x, ws.dense), F._frac(busy, x, None))
        np.testing.assert_array_equal(F._transitions(busy, x, ws.dense), F._transitions(busy, x))
    if variant == "1hz":
        assert all(ws.dense for ws in wins.values())
    else:
        assert not wins["gpu_util"].dense  # the masked paths are the ones under test here
    for a, b in [("power", "gpu_util"), ("power", "mem_util"), ("gpu_util", "mem_used")]:
        np.testing.assert_allclose(
            F._pair_corr(wins[a], wins[b]), F._corr(wins[a].x, wins[b].x), rtol=1e-9, atol=1e-12
        )
    got = F._periodicity([wins["gpu_util"], wins["power"]], dt)
    for s, g in zip(["gpu_util", "power"], got, strict=True):
        for new, ref in zip(g, _periodicity_reference(wins[s].x, dt), strict=True):
            np.testing.assert_allclose(new, ref, rtol=1e-6, atol=1e-9, err_msg=s)


def test_a_gap_of_days_is_shortened_not_gridded(trace: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log resumed after a long silence: the grid no longer holds a point per interval of the silence
    (a year at 10 Hz was a MemoryError), and every window that holds data is exactly the uncut one."""
    import phasescope.features as features

    n = len(trace)
    gap_s = 400_000.0  # 4.6 days at 1 Hz: over MAX_GAP_INTERVALS, still small enough to grid in full
    resumed = Trace(trace.device, np.concatenate([trace.time, trace.time + gap_s]),
                    {k: np.concatenate([v, v]) for k, v in trace.columns.items()}, trace.meta)
    short = window_features(resumed)
    monkeypatch.setattr(features, "MAX_GAP_INTERVALS", 10**9)
    full = window_features(resumed)
    assert len(full.start) > 20_000 and len(short.start) < 200  # the silence's empty windows are gone
    assert not (short.n_samples == 0).any()
    held = full.n_samples > 0
    np.testing.assert_allclose(short.start, full.start[held], rtol=0, atol=1e-6)  # float rounding only
    np.testing.assert_allclose(short.end, full.end[held], rtol=0, atol=1e-6)
    np.testing.assert_allclose(short.values, full.values[held], rtol=1e-9, atol=1e-12)  # FFT sizes differ
    np.testing.assert_array_equal(short.sufficient, full.sufficient[held])
    assert short.start[-1] > trace.time[-1] + gap_s - 60 and n == len(trace)
