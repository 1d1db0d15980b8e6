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
