"""Window features a mutation audit found unchecked, each against a plain per-window reference on a real
trace (RTX 3090 training ResNet on CIFAR-10, sensorguard, 1 Hz, every signal present), plus window coverage
and where the device limits come from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.features import (
    GIB_BYTES,
    DeviceLimits,
    WindowConfig,
    device_limits,
    lookup_gpu,
    resample,
    sample_interval,
    window_features,
)
from phasescope.schema import Trace
from phasescope.sources.replay import read
from tests.test_features import RUN, SPAN

# RTX 3090 board limits (datasheet), passed explicitly: the trace names no model.
LIMITS = DeviceLimits(power_limit=350.0, mem_total=24 * GIB_BYTES, max_sm_clock=2100e6, max_mem_clock=9751e6)
SIGNALS = ["gpu_util", "power", "mem_used", "temperature", "pcie_rx", "pcie_tx"]


@pytest.fixture(scope="module")
def trace(shared_data: Path) -> Trace:
    traces = read(str(shared_data / RUN))
    return next(x for x in traces if x.meta.get("gpu_index", x.device.index) == 0).slice_time(*SPAN)


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    return float(np.corrcoef(a, b)[0, 1]) if np.std(a) * np.std(b) > 0 else 0.0


def _reference(trace: Trace, cfg: WindowConfig) -> dict[str, list[float]]:
    """One window at a time with plain 1-D numpy (polyfit for slopes, explicit run counting)."""
    dt = sample_interval(trace.time)
    _, grid = resample(trace, dt, SIGNALS)
    n = len(grid["gpu_util"])
    w, step = round(cfg.window_s / dt), round(cfg.stride_s / dt)
    lag5 = round(5.0 / dt)
    t = np.arange(w) * dt
    mem = grid["mem_used"]
    thr = 0.01 * LIMITS.mem_total
    out: dict[str, list[float]] = {k: [] for k in (
        "util_high", "util_transitions_per_min", "util_ac_5s", "util_burst_len_s", "mem_slope_gib_per_min",
        "temp_slope_per_min", "power_frac_p90", "power_above_floor", "pcie_rx_tx_log_ratio", "mem_plateau_s")}
    for s in range(0, n - w + 1, step):
        e = s + w - 1  # last grid point of the window
        u, p = grid["gpu_util"][s : e + 1], grid["power"][s : e + 1]
        out["util_high"].append(float(np.mean(u > 0.9)))
        out["util_ac_5s"].append(_corr(u[:-lag5], u[lag5:]))
        busy = u > 0.05
        changes = sum(1 for i in range(1, w) if busy[i] != busy[i - 1])
        out["util_transitions_per_min"].append(changes / (w * dt / 60.0))
        runs = sum(1 for i in range(w) if busy[i] and (i == 0 or not busy[i - 1]))
        out["util_burst_len_s"].append(busy.sum() * dt / runs if runs else 0.0)
        out["mem_slope_gib_per_min"].append(np.polyfit(t, mem[s : e + 1], 1)[0] * 60 / GIB_BYTES)
        out["temp_slope_per_min"].append(np.polyfit(t, grid["temperature"][s : e + 1], 1)[0] * 60)
        out["power_frac_p90"].append(float(np.percentile(p, 90)) / LIMITS.power_limit)
        out["power_above_floor"].append(float(np.mean(p) / np.min(grid["power"][: e + 1])))
        rx, tx = np.mean(grid["pcie_rx"][s : e + 1]), np.mean(grid["pcie_tx"][s : e + 1])
        out["pcie_rx_tx_log_ratio"].append(float(np.log10(1 + rx) - np.log10(1 + tx)))
        last_move = max([0] + [j for j in range(1, e + 1) if abs(mem[j] - mem[j - 1]) > thr])
        out["mem_plateau_s"].append(min((e - last_move) * dt, cfg.plateau_cap_s))
    return out


def test_more_features_equal_the_per_window_reference(trace: Trace) -> None:
    assert np.isfinite(np.column_stack([trace[s] for s in SIGNALS])).all()  # dense: no empty bins
    cfg = WindowConfig()
    wf = window_features(trace, cfg, limits=LIMITS)
    ref = _reference(trace, cfg)
    assert wf.values.shape[0] == len(ref["util_high"]) > 30
    for name, values in ref.items():
        np.testing.assert_allclose(wf.column(name), values, rtol=1e-7, atol=1e-9, err_msg=name)
    # The reference is not trivially constant where it matters: the memory ramp is seen, the cap is reached.
    plateau = np.array(ref["mem_plateau_s"])
    assert plateau.min() < cfg.plateau_cap_s and plateau.max() == cfg.plateau_cap_s
    assert max(abs(v) for v in ref["mem_slope_gib_per_min"]) > 0.01


def test_windows_with_too_little_coverage_are_not_judged(trace: Trace) -> None:
    """Samples kept 10 of every 30 seconds: each 30 s window holds 10 points, enough by count (8) but a third
    of the window (below half); kept 16 of every 30, each holds 16 and is judged."""
    i = np.arange(len(trace))
    sparse = window_features(trace.take(i % 30 < 10))
    assert sparse.window_samples == 30 and sparse.values.shape[0] > 30
    assert set(sparse.n_samples.tolist()) == {10} and not sparse.sufficient.any()
    half = window_features(trace.take(i % 30 < 16))
    assert set(half.n_samples.tolist()) == {16} and half.sufficient.all()


def test_the_traces_own_power_limit_wins_over_the_table(trace: Trace) -> None:
    """A power-capped RTX 3090 (250 W set, 350 W board default) is judged against its 250 W."""
    capped = Trace(trace.device, trace.time, {**trace.columns, "power_limit": np.full(len(trace), 250.0)},
                   {**trace.meta, "gpu_model": "NVIDIA GeForce RTX 3090"})
    lim = device_limits(capped)
    assert lim.power_limit == 250.0
    assert lim.mem_total == 24 * GIB_BYTES  # not in the trace: from the table
    wf = window_features(capped)
    _, grid = resample(capped, sample_interval(capped.time), ["power"])
    np.testing.assert_allclose(wf.column("power_frac_mean")[0], np.mean(grid["power"][:30]) / 250.0)


def test_a100_80gb_is_told_from_the_40gb_model() -> None:
    assert lookup_gpu("NVIDIA A100-SXM4-80GB").mem_total == 80 * GIB_BYTES
    assert lookup_gpu("NVIDIA A100-SXM4-40GB").mem_total == 40 * GIB_BYTES
