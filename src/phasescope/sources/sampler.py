"""Drift-free sampling: tick k runs at t0 + k * interval on the monotonic clock.

Sleeping "interval after the last tick" drifts by the read time every tick; anchoring every tick to t0
does not. When a tick overruns, the slots it missed are skipped (and counted), not run back to back:
bunched-up samples would be as misleading as missing ones. A slot that has just started (less than
half an interval late) still runs, so a small overrun costs lateness, not a sample.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from phasescope.schema import TickBatch
from phasescope.sources.base import LiveSource

DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.1  # 10 Hz: NVML's own counters do not refresh much faster
LATE_TOLERANCE = 0.5  # fraction of an interval a slot may be late and still run


@dataclass
class SamplerStats:
    ticks: int = 0
    skipped: int = 0  # slots never run because an earlier tick overran
    max_late_s: float = 0.0  # worst start lateness of a tick against its slot
    total_late_s: float = 0.0

    @property
    def mean_late_s(self) -> float:
        return self.total_late_s / self.ticks if self.ticks else 0.0


class Sampler:
    """Reads `source` every `interval_s` seconds and hands each TickBatch to `on_tick`."""

    def __init__(
        self,
        source: LiveSource,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not math.isfinite(interval_s) or interval_s < MIN_INTERVAL_S:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_S} s (10 Hz), got {interval_s}")
        self.source = source
        self.interval_s = float(interval_s)
        self._clock = clock
        self._sleep = sleep  # injectable for tests; None = real sleep, woken early by `stop`
        self.stats = SamplerStats()

    def _wait(self, seconds: float, stop: threading.Event | None) -> None:
        if seconds <= 0:
            return
        if self._sleep is not None:
            self._sleep(seconds)
        elif stop is not None:
            stop.wait(seconds)
        else:
            time.sleep(seconds)

    def next_slot(self, k: int, elapsed: float) -> tuple[int, int]:
        """After running slot k, with `elapsed` seconds since t0: (next slot to run, slots skipped)."""
        nxt = k + 1
        current = math.floor(elapsed / self.interval_s)  # the latest slot that has already begun
        if current < nxt:
            return nxt, 0
        if elapsed - current * self.interval_s <= LATE_TOLERANCE * self.interval_s:
            return current, current - nxt  # run the slot that just began; skip the ones before it
        return current + 1, current + 1 - nxt

    def run(
        self,
        on_tick: Callable[[TickBatch], None],
        duration: float | None = None,
        stop: threading.Event | None = None,
    ) -> SamplerStats:
        """Tick until `duration` seconds have passed (slots at offsets < duration) or `stop` is set."""
        stats = self.stats = SamplerStats()
        # Slots at offsets < duration; the 1e-9 keeps 3.0 / 0.1 from counting a 31st slot.
        n_slots = math.inf if duration is None else math.ceil(duration / self.interval_s - 1e-9)
        t0 = self._clock()
        k = 0
        while True:
            if k >= n_slots:
                break
            self._wait(t0 + k * self.interval_s - self._clock(), stop)
            if stop is not None and stop.is_set():
                break
            late = self._clock() - (t0 + k * self.interval_s)
            stats.ticks += 1
            stats.total_late_s += max(late, 0.0)
            stats.max_late_s = max(stats.max_late_s, late)
            on_tick(self.source.read())
            nxt, _ = self.next_slot(k, self._clock() - t0)
            stats.skipped += int(min(nxt, n_slots)) - (k + 1)  # only slots inside the run count
            k = nxt
        return stats


def until_played_out(
    source: LiveSource, on_tick: Callable[[TickBatch], None], stop: threading.Event
) -> Callable[[TickBatch], None]:
    """`on_tick`, except that once a replay without loop has played to its end it sets `stop` instead of
    passing on its empty ticks: what recording, signing and verifying do (`record`, `ledger`, `verify
    --source`). Live views keep their last picture instead and do not use it."""

    def tick(batch: TickBatch) -> None:
        if getattr(source, "exhausted", False):
            stop.set()
            return
        on_tick(batch)

    return tick
