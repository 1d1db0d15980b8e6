"""A live source that plays a recorded log as if its devices were here now.

At each `read()` the source works out where the recorded clock stands (elapsed monotonic time ×
speed past the first sample) and returns, for every device of the file, its latest sample at or
before that point: all devices of one file advance in step, sample-and-hold, like a live gauge.
`TickBatch.time` is that recorded point shifted onto the wall clock of the start, so gaps, rates
and rhythm keep their recorded spacing (at speed N they pass N times faster). A device whose last
sample is older than a few of its own intervals reads NaN, as a live source would report a gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, FloatArray, TickBatch, Trace

# A device's sample counts as current for this many of its own median intervals.
STALE_INTERVALS = 2.5


def _dedupe(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    """Distinct uuids: two traces of one file that share a uuid (two runs, one GPU) stay two devices.

    The n-th run of a MIG instance belongs to the n-th run of its GPU: its parent_uuid gets the same "#n"
    where that parent row exists, so the instances still find their GPU (MIG pricing, the MIG note)."""
    seen: dict[str, int] = {}
    runs = []
    for d in devices:
        n = seen.get(d.uuid, 0) + 1
        seen[d.uuid] = n
        runs.append(n)
    renamed = {f"{d.uuid}#{n}" for d, n in zip(devices, runs, strict=True) if n > 1}
    out = []
    for d, n in zip(devices, runs, strict=True):
        if n > 1:
            parent = d.parent_uuid
            if parent and f"{parent}#{n}" in renamed:
                parent = f"{parent}#{n}"
            d = DeviceInfo(f"{d.uuid}#{n}", d.name, d.index, d.host, parent, d.extra)
        out.append(d)
    return out


class ReplaySource:
    """LiveSource over recorded Traces; `clock`/`wall_clock` are injectable so tests need not sleep."""

    name = "replay"

    def __init__(
        self,
        traces: list[Trace],
        *,
        speed: float = 1.0,
        loop: bool = False,
        path: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        where = path or "replay"
        traces = [t for t in traces if len(t)]
        if not traces:
            raise InputError(where, "replay", "at least one device with samples", "none")
        if not (np.isfinite(speed) and speed > 0):
            raise InputError(where, "speed", "a positive number", speed)
        self.path = path
        self.speed = float(speed)
        self.loop = loop
        self._clock = clock
        self._devices = _dedupe([t.device for t in traces])
        self._times: list[FloatArray] = []
        self._values: list[FloatArray] = []
        self._stale: list[float] = []
        dts = []
        for t in traces:
            order = np.argsort(t.time, kind="stable")
            self._times.append(t.time[order])
            self._values.append(np.column_stack([t[s][order] for s in SIGNAL_NAMES]))
            diffs = np.diff(self._times[-1])
            diffs = diffs[diffs > 0]
            dt = float(np.median(diffs)) if diffs.size else 1.0
            dts.append(dt)
            self._stale.append(STALE_INTERVALS * dt)
        self.native_interval_s = float(min(dts))  # recorded seconds between samples
        # Start once every device has its first sample (devices of one tick are read a few ms apart),
        # but never skip more than one interval of the earliest device.
        first = min(float(t[0]) for t in self._times)
        self.t0 = min(max(float(t[0]) for t in self._times), first + self.native_interval_s)
        self.t_end = float(max(t[-1] for t in self._times))
        # One loop lasts the recording plus one interval, so the last sample is held like the others.
        self.period = self.t_end - self.t0 + self.native_interval_s
        self._start_mono = clock()
        self._start_wall = float(wall_clock())
        # A log on a raw monotonic clock (SensorGuard) ties it to UTC in meta["utc_offset"]: what a view shows
        # is the recording's Unix time, not 1970 plus the host's uptime. Only an anchor all traces share.
        anchors = {t.meta.get("utc_offset") for t in traces}
        anchor = anchors.pop() if len(anchors) == 1 else None
        self._utc = float(anchor) if isinstance(anchor, int | float) and np.isfinite(anchor) else 0.0
        self.exhausted = False
        self._announced = False

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        speed: float = 1.0,
        loop: bool = False,
        format: str = "auto",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> ReplaySource:
        from phasescope.sources.replay import read  # engineer A's readers; lazy so `top` starts fast

        traces = read(path, format)
        return cls(traces, speed=speed, loop=loop, path=str(path), clock=clock, wall_clock=wall_clock)

    @property
    def interval_s(self) -> float:
        """Real seconds between recorded samples at this speed: a sampler interval that skips none."""
        return self.native_interval_s / self.speed

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    @property
    def clock_offset_s(self) -> float:
        """Add to a tick's time for the recording's own clock in Unix seconds (what a view shows: the trace's
        time, not wall time running `speed` times faster; a raw clock through the log's UTC anchor). Exact
        for the first pass; a loop's later passes run on past the recording's end on the same clock."""
        return self.t0 + self._utc - self._start_wall

    def trace_time(self, stamp: float) -> float:
        """The recording's own time at a tick stamped `stamp` (inside the loop's pass it belongs to)."""
        elapsed = stamp - self._start_wall
        return self.t0 + self._utc + (elapsed % self.period if self.loop else elapsed)

    def recorded_elapsed(self) -> float:
        """Recorded seconds played since the start (keeps growing across loops)."""
        return (self._clock() - self._start_mono) * self.speed

    def read(self) -> TickBatch:
        elapsed = self.recorded_elapsed()
        stamp = self._start_wall + elapsed
        events = []
        if not self._announced:
            self._announced = True
            events.append(
                f"replaying {self.path or 'traces'} at {self.speed:g}x{' in a loop' if self.loop else ''}"
            )
        if not self.loop and elapsed >= self.period:
            if not self.exhausted:
                events.append("replay finished")
            self.exhausted = True
            batch = TickBatch.empty(stamp, self.devices())
            batch.events = events
            return batch
        pos = self.t0 + (elapsed % self.period if self.loop else elapsed)
        values = np.full((len(self._devices), len(SIGNAL_NAMES)), np.nan)
        for row, (times, vals, stale) in enumerate(zip(self._times, self._values, self._stale, strict=True)):
            i = int(np.searchsorted(times, pos, side="right")) - 1
            if i >= 0 and pos - times[i] <= stale:
                values[row] = vals[i]
        return TickBatch(stamp, self.devices(), values, events=events)

    def error_counts(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self.exhausted = True
