"""FLOP accounting from telemetry: how much arithmetic a device can have done over a window.

Telemetry never counts FLOP; it bounds them. For each sample step of length dt:

- with a tensor-activity counter (DCGM `PIPE_TENSOR_ACTIVE` / NVML GPM, schema `tensor_active`):
  FLOP ~ tensor_active x clock_ratio x peak(precision) x dt. The precision is not observable, so the band
  runs from the slowest dense tensor precision (TF32) to the fastest (FP8 where the GPU has it); the
  estimate uses FP16/BF16, what training uses. Work on the non-tensor pipes (FP32 CUDA cores) is
  below the FP32 rate and is added to the upper bound as `gpu_util x fp32 peak`.
- with only utilisation (`gpu_util`: the fraction of time some kernel ran): the upper bound assumes
  every busy moment ran at the fastest dense tensor rate; the lower bound is 0 (a kernel may do no
  arithmetic, e.g. a copy); the estimate assumes `ASSUMED_MFU` of the FP16/BF16 peak while busy.

`clock_ratio` = SM clock / the clock the vendor peak is quoted at (1 where the SM clock is missing, except
for the upper bound, which then uses the device's maximum clock). Sparsity peaks are never used: the
upper bound is for dense arithmetic, which is what 2:4 sparse kernels report half of anyway.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from phasescope.features import lookup_gpu
from phasescope.schema import FloatArray, Trace

# Reporting thresholds named by compute-governance rules (total training compute, FLOP).
THRESHOLDS: tuple[float, ...] = (1e25, 1e26)
# Model FLOP utilisation assumed for the util-only estimate (typical large dense training: 0.3-0.5).
ASSUMED_MFU = 0.4


@dataclass(frozen=True)
class Peaks:
    """Dense peaks in FLOP/s at `clock_hz` (vendor datasheets, no sparsity)."""

    clock_hz: float
    fp32: float  # CUDA cores, no tensor
    tensor_low: float  # slowest dense tensor precision (TF32, or FP16 where there is no TF32)
    tensor_16: float  # FP16/BF16 with FP32 accumulate
    tensor_high: float  # fastest dense floating-point tensor precision (FP8 where supported)


T = 1e12
# Order matters: the first matching pattern wins (same convention as features.KNOWN_GPUS).
_PEAKS: list[tuple[str, Peaks]] = [
    (r"h200", Peaks(1980e6, 67 * T, 494.7 * T, 989.4 * T, 1978.9 * T)),
    (r"h100.*pcie", Peaks(1755e6, 51 * T, 378 * T, 756 * T, 1513 * T)),
    (r"h100", Peaks(1980e6, 67 * T, 494.7 * T, 989.4 * T, 1978.9 * T)),
    (r"a100", Peaks(1410e6, 19.5 * T, 156 * T, 312 * T, 312 * T)),
    (r"l40s", Peaks(2520e6, 91.6 * T, 183 * T, 362 * T, 733 * T)),
    (r"\bl4\b", Peaks(2040e6, 30.3 * T, 60 * T, 121 * T, 242 * T)),
    (r"\ba10g?\b", Peaks(1695e6, 31.2 * T, 62.5 * T, 125 * T, 125 * T)),
    (r"\bt4\b", Peaks(1590e6, 8.1 * T, 65 * T, 65 * T, 65 * T)),
    (r"v100", Peaks(1530e6, 15.7 * T, 125 * T, 125 * T, 125 * T)),
    (r"(rtx ?)?4090", Peaks(2520e6, 82.6 * T, 82.6 * T, 165.2 * T, 330.3 * T)),
    (r"(rtx ?)?3090", Peaks(1695e6, 35.6 * T, 35.6 * T, 35.6 * T, 71 * T)),
]


def lookup_peaks(name: str) -> Peaks | None:
    key = name.lower().replace("-", " ").replace("_", " ")
    for pattern, peaks in _PEAKS:
        if re.search(pattern, key):
            return peaks
    return None


def device_name(trace: Trace) -> str:
    return trace.device.name or str(trace.meta.get("gpu_model", ""))


@dataclass(frozen=True)
class FlopEstimate:
    """FLOP executed by one device over one window, with its band and how it was derived."""

    estimate: float
    lower: float
    upper: float
    method: str  # "tensor_active", "gpu_util" or "none"
    seconds: float  # seconds of telemetry the sum covers
    note: str

    @classmethod
    def unknown(cls, note: str) -> FlopEstimate:
        """No estimate (method "none"): the band is NaN and every threshold undetermined."""
        return cls(float("nan"), float("nan"), float("nan"), "none", 0.0, note)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def versus(self, budget: float) -> str:
        """'below' when even the upper bound is under `budget`, 'above' when the lower bound exceeds it."""
        if self.method == "none":
            return "undetermined"
        if self.upper <= budget:
            return "below"
        if self.lower > budget:
            return "above"
        return "undetermined"


def _dt(time: FloatArray) -> FloatArray:
    """Seconds each sample stands for: the step to the next one; a step over 3 median steps is a gap (0)."""
    if time.size < 2:
        return np.zeros(time.size)
    d = np.diff(time)
    med = float(np.median(d[d > 0])) if (d > 0).any() else 0.0
    d = np.where(d > 3 * med, 0.0, d)
    return np.append(d, med if time.size else 0.0)


def _coverage(dt: FloatArray, ok: np.ndarray, gap_s: float) -> tuple[float, float]:
    """Seconds with a reading, and seconds without one (window gaps included): those count at full peak."""
    return float(np.sum(dt[ok])), gap_s + float(np.sum(dt[~ok]))


def estimate_flop(trace: Trace, span: tuple[float, float] | None = None) -> FlopEstimate:
    """FLOP over the trace (cut it to the window first). See the module doc for the method.

    With `span` (the window's [start, end]), seconds of the window that no sample covers are added to
    the upper bound at the device's full peak: a gap in the telemetry could hide any amount of work.
    """
    name = device_name(trace)
    peaks = lookup_peaks(name) if name else None
    if peaks is None:
        return FlopEstimate.unknown(f"no peak-FLOP entry for device model {name or '(unnamed)'}")
    dt = _dt(trace.time)
    gap_s = max((span[1] - span[0]) - float(dt.sum()), 0.0) if span is not None else 0.0
    max_clock = lookup_gpu(name).max_sm_clock
    clock = trace["sm_clock"]
    ratio = np.where(np.isfinite(clock), clock / peaks.clock_hz, 1.0)
    worst_clock = max_clock / peaks.clock_hz if np.isfinite(max_clock) else 1.25
    ratio_hi = np.where(np.isfinite(clock), clock / peaks.clock_hz, worst_clock)
    util = trace["gpu_util"]
    tensor = trace["tensor_active"]
    if trace.has("tensor_active"):
        ok = np.isfinite(tensor)
        u = np.where(np.isfinite(util), util, 1.0)
        base = np.where(ok, tensor, 0.0) * dt
        est = float(np.sum(base * ratio) * peaks.tensor_16)
        lower = float(np.sum(base * ratio) * peaks.tensor_low)
        upper = float(
            np.sum(base * ratio_hi) * peaks.tensor_high + np.sum(u * ratio_hi * dt * ok) * peaks.fp32
        )
        secs, blind_s = _coverage(dt, ok, gap_s)
        upper += blind_s * worst_clock * (peaks.tensor_high + peaks.fp32)
        note = (
            f"tensor_active x SM clock/{peaks.clock_hz / 1e6:.0f} MHz x dense peak; band = TF32..FP8 "
            "precision (not observable) plus FP32 CUDA-core work up to gpu_util"
        )
        return FlopEstimate(est, lower, upper, "tensor_active", secs, note)
    if trace.has("gpu_util"):
        ok = np.isfinite(util)
        base = np.where(ok, util, 0.0) * dt
        est = float(np.sum(base * ratio) * peaks.tensor_16 * ASSUMED_MFU)
        upper = float(np.sum(base * ratio_hi) * peaks.tensor_high)
        secs, blind_s = _coverage(dt, ok, gap_s)
        upper += blind_s * worst_clock * peaks.tensor_high
        note = (
            f"gpu_util only: upper = busy time x fastest dense tensor peak; lower = 0 (busy kernels may do "
            f"no arithmetic); estimate assumes {ASSUMED_MFU:.0%} of the FP16/BF16 peak while busy"
        )
        return FlopEstimate(est, 0.0, upper, "gpu_util", secs, note)
    return FlopEstimate.unknown("neither tensor_active nor gpu_util in the telemetry")


def thresholds(est: FlopEstimate) -> dict[str, str]:
    """The estimate against each reporting threshold: below / above / undetermined."""
    return {f"{t:.0e}": est.versus(t) for t in THRESHOLDS}
