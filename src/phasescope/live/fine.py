"""NVML's own sub-second samples (`TickBatch.fine`), kept per device for the live telemetry KPIs.

A 1 Hz agent's rows cannot show a step rhythm under two seconds; the driver's sample buffers (read each tick
by sources/nvml.py) can, down to their own refresh. `FineSamples` keeps the newest `capacity` samples of
each device and signal (bounded: at a driver's 50 samples/s, about five minutes, the KPI window), and
`FineSamples.span` lines them up as the (time, gpu_util, power) arrays `kpi.rhythm.trace_kpis` reads.

Only the KPIs read them: the classifier keeps its 1 Hz features (docs/design/nvml-samples.md says why).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

import numpy as np

from phasescope.kpi.rhythm import MIN_SAMPLES
from phasescope.schema import FloatArray, TickBatch

# Samples kept per device and signal: 300 s (annotate.KPI_WINDOW_S) at 50/s, a fast driver's power rate.
FINE_CAPACITY = 16384
# A sample of the other signal further than this many of its own median intervals from a time is not
# used for it: no line drawn across a gap in the driver's samples.
MAX_GAP_INTERVALS = 3.0


class _Series:
    """One signal's samples: a ring of (time, value), oldest first on read."""

    __slots__ = ("_head", "_n", "_t", "_v")

    def __init__(self, capacity: int) -> None:
        self._t = np.empty(capacity)
        self._v = np.empty(capacity)
        self._head = 0
        self._n = 0

    def extend(self, t: FloatArray, v: FloatArray) -> None:
        cap = self._t.size
        t, v = t[-cap:], v[-cap:]
        slots = (self._head + np.arange(t.size)) % cap
        self._t[slots] = t
        self._v[slots] = v
        self._head = (self._head + t.size) % cap
        self._n = min(self._n + t.size, cap)

    def since(self, start: float) -> tuple[FloatArray, FloatArray]:
        order = np.arange(self._head - self._n, self._head) % self._t.size
        t, v = self._t[order], self._v[order]
        keep = t >= start
        return t[keep], v[keep]


class FineSamples:
    """Per device uuid and signal, the newest `capacity` fine samples of the batches ingested."""

    def __init__(self, capacity: int = FINE_CAPACITY) -> None:
        self.capacity = capacity
        self._series: dict[tuple[str, str], _Series] = {}
        self._lock = threading.Lock()  # written by the sampler thread; read by whoever computes KPIs

    def ingest(self, batch: TickBatch) -> None:
        if not batch.fine:
            return
        with self._lock:
            for uuid, signals in batch.fine.items():
                for signal, (t, v) in signals.items():
                    key = (uuid, signal)
                    series = self._series.get(key)
                    if series is None:
                        series = self._series[key] = _Series(self.capacity)
                    series.extend(np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64))

    def signal(self, uuid: str, signal: str, start: float = -math.inf) -> tuple[FloatArray, FloatArray]:
        """One device's samples of `signal` at or after `start`, oldest first (empty when none)."""
        with self._lock:
            series = self._series.get((uuid, signal))
            return series.since(start) if series is not None else (np.empty(0), np.empty(0))

    def span(
        self, uuid: str, start: float, coarse: Mapping[str, tuple[FloatArray, FloatArray]] | None = None
    ) -> tuple[FloatArray, FloatArray, FloatArray] | None:
        """(time, gpu_util, power) of one device since `start` on the times of its denser fine signal, the
        other one (fine, else `coarse`: signal -> (times, values), e.g. the 1 Hz ring) interpolated onto
        them; None when neither fine signal has MIN_SAMPLES samples."""
        fine = {s: self.signal(uuid, s, start) for s in ("gpu_util", "power")}
        base = max(fine, key=lambda s: fine[s][0].size)
        t, x = fine[base]
        if t.size < MIN_SAMPLES:
            return None
        other = "power" if base == "gpu_util" else "gpu_util"
        empty = (np.empty(0), np.empty(0))
        src = fine[other] if fine[other][0].size >= 2 else (coarse or {}).get(other, empty)
        y = near(t, *src)
        return (t, x, y) if base == "gpu_util" else (t, y, x)


def near(t: FloatArray, src_t: FloatArray, src_v: FloatArray) -> FloatArray:
    """`src` linearly interpolated at times `t`; NaN outside its span and inside its gaps (over
    MAX_GAP_INTERVALS of its median interval), so nothing is invented where it has no samples."""
    ok = np.isfinite(src_t) & np.isfinite(src_v)
    src_t, src_v = src_t[ok], src_v[ok]
    out = np.full(t.size, np.nan)
    if src_t.size < 2:
        return out
    order = np.argsort(src_t, kind="stable")
    src_t, src_v = src_t[order], src_v[order]
    gap = MAX_GAP_INTERVALS * float(np.median(np.diff(src_t)))
    right = np.searchsorted(src_t, t, side="left").clip(1, src_t.size - 1)
    inside = (t >= src_t[0]) & (t <= src_t[-1]) & (src_t[right] - src_t[right - 1] <= gap)
    out[inside] = np.interp(t[inside], src_t, src_v)
    return out
