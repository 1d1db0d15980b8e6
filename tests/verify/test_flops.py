from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay import read
from phasescope.verify.flops import estimate_flop, lookup_peaks, thresholds
from tests.verify._data import A100_TRAIN, T4_SCRAPE


def _held(reading: Trace, seconds: int) -> Trace:
    """One real scrape held for `seconds` at 1 Hz (what a 1 Hz scraper of a steady GPU would see)."""
    cols = {s: np.full(seconds, reading[s][0]) for s in reading.present_signals()}
    return Trace(reading.device, np.arange(seconds, dtype=float), cols)


def test_tensor_active_counter_gives_a_band_around_the_bf16_figure(shared_data: Path) -> None:
    t4 = next(t for t in read(shared_data / T4_SCRAPE) if t.has("tensor_active"))
    assert "T4" in t4.device.name
    est = estimate_flop(_held(t4, 60))
    assert est.method == "tensor_active"
    # 60 s x tensor_active x clock / 1590 MHz x 65 TFLOP/s (T4 dense FP16), from the scrape's own values.
    expect = 60 * t4["tensor_active"][0] * t4["sm_clock"][0] / 1590e6 * 65e12
    assert est.estimate == pytest.approx(expect, rel=1e-9)
    assert est.lower <= est.estimate < est.upper
    # The upper bound adds the CUDA-core work up to gpu_util (0.91 here): much more than the tensor work.
    assert est.upper > 5 * est.estimate


def test_util_only_training_run_on_a100(shared_data: Path) -> None:
    (t,) = read(shared_data / A100_TRAIN)
    est = estimate_flop(t)
    assert est.method == "gpu_util" and est.lower == 0.0
    assert 0 < est.estimate < est.upper
    # No A100 can beat 312 TFLOP/s dense over the run's span.
    assert est.upper <= 312e12 * (t.time[-1] - t.time[0] + 2) * 1.0
    assert thresholds(est) == {"1e+25": "below", "1e+26": "below"}
    assert est.versus(est.upper * 2) == "below" and est.versus(est.upper / 2) == "undetermined"


def test_a_gap_in_the_telemetry_raises_the_upper_bound_to_full_peak(shared_data: Path) -> None:
    (t,) = read(shared_data / A100_TRAIN)
    span = (float(t.time[0]), float(t.time[-1]))
    full = estimate_flop(t, span)
    t0 = span[0]
    holed = t.take(~((t.time > t0 + 10) & (t.time < t0 + 30)))
    gap = estimate_flop(holed, span)
    assert gap.upper > full.upper
    # The ~20 uncovered seconds count at the A100's 312 TFLOP/s (at up to its maximum clock) on top of
    # what the samples that are there allow.
    assert gap.upper - estimate_flop(holed).upper == pytest.approx(20 * 312e12, rel=0.1)


def test_unknown_device_model_cannot_be_bounded() -> None:
    t = Trace(DeviceInfo("GPU-x", "Mystery Accelerator 9000"), np.arange(10.0), {"gpu_util": np.ones(10)})
    est = estimate_flop(t)
    assert est.method == "none" and "Mystery" in est.note
    assert est.versus(1e30) == "undetermined"
    assert lookup_peaks("NVIDIA H100 80GB HBM3") is not None and lookup_peaks("NVIDIA H100 PCIe") is not None
    assert lookup_peaks("NVIDIA H100 PCIe").tensor_16 < lookup_peaks("NVIDIA H100 80GB HBM3").tensor_16  # type: ignore[union-attr]
