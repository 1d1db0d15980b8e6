"""The sampler's schedule, checked on an injected clock (exact, immune to a noisy box) and once for real."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from phasescope.schema import DeviceInfo, TickBatch
from phasescope.sources.host import HostSource
from phasescope.sources.sampler import Sampler


class FakeClock:
    """Monotonic time that moves only when someone sleeps or a read costs time."""

    def __init__(self, oversleep: float = 0.0, seed: int = 0) -> None:
        self.t = 1000.0
        self.oversleep = oversleep
        self.rng = random.Random(seed)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds + self.rng.uniform(0.0, self.oversleep)


class CostlySource:
    """A source whose read takes `cost(k)` seconds of clock time and records when each read began."""

    name = "costly"

    def __init__(self, clock: FakeClock, cost) -> None:
        self.clock = clock
        self.cost = cost
        self.starts: list[float] = []

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo("dev-0")]

    def read(self) -> TickBatch:
        self.starts.append(self.clock.t)
        self.clock.t += self.cost(len(self.starts) - 1)
        return TickBatch.empty(self.clock.t, self.devices())

    def error_counts(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def _run(
    interval: float, duration: float, cost, oversleep: float = 0.0
) -> tuple[CostlySource, Sampler, float]:
    clock = FakeClock(oversleep)
    t0 = clock.t
    src = CostlySource(clock, cost)
    sampler = Sampler(src, interval, clock=clock.now, sleep=clock.sleep)
    sampler.run(lambda batch: None, duration=duration)
    return src, sampler, t0


def test_ticks_land_on_the_grid_despite_read_time():
    # A naive "sleep one interval after each read" loop would drift 30 * 30 ms = 0.9 s here.
    src, sampler, t0 = _run(0.1, 3.0, lambda k: 0.03)
    assert len(src.starts) == 30 and sampler.stats.skipped == 0
    np.testing.assert_allclose(np.array(src.starts) - t0, np.arange(30) * 0.1, atol=1e-9)


def test_sleep_jitter_does_not_accumulate():
    src, sampler, t0 = _run(0.1, 3.0, lambda k: 0.02, oversleep=0.008)
    late = np.array(src.starts) - t0 - np.arange(len(src.starts)) * 0.1
    assert len(src.starts) == 30
    assert late.min() >= 0 and late.max() <= 0.008 + 1e-9  # each tick late by its own jitter only
    assert sampler.stats.max_late_s == pytest.approx(late.max())


def test_overrun_skips_missed_slots_instead_of_bunching():
    # Tick 3 takes 0.28 s: slots 4 and 5 are gone (slot 5 began 0.08 s before the read ended).
    src, sampler, t0 = _run(0.1, 2.0, lambda k: 0.28 if k == 3 else 0.01)
    offsets = np.array(src.starts) - t0
    assert sampler.stats.skipped == 2
    assert len(src.starts) + sampler.stats.skipped == 20
    np.testing.assert_allclose(offsets[:5], [0.0, 0.1, 0.2, 0.3, 0.6], atol=1e-9)
    assert np.diff(offsets).min() >= 0.1 - 1e-9  # never two reads closer than one interval


def test_slightly_late_slot_still_runs():
    # Tick 3 ends 0.03 s into slot 5: run slot 5 at once (late), skip only slot 4.
    src, sampler, t0 = _run(0.1, 1.0, lambda k: 0.23 if k == 3 else 0.01)
    offsets = np.array(src.starts) - t0
    assert sampler.stats.skipped == 1
    np.testing.assert_allclose(offsets[4], 0.53, atol=1e-9)
    np.testing.assert_allclose(offsets[5:], [0.6, 0.7, 0.8, 0.9], atol=1e-9)


def test_skips_past_the_end_are_not_counted():
    # The read in slot 8 overruns past the end of a 1 s run: only slot 9 was lost.
    src, sampler, _ = _run(0.1, 1.0, lambda k: 0.5 if k == 8 else 0.01)
    assert len(src.starts) == 9 and sampler.stats.skipped == 1


def test_stop_event_ends_the_run():
    clock = FakeClock()
    src = CostlySource(clock, lambda k: 0.0)
    stop = threading.Event()
    seen: list[TickBatch] = []

    def on_tick(batch: TickBatch) -> None:
        seen.append(batch)
        if len(seen) == 5:
            stop.set()

    stats = Sampler(src, 0.5, clock=clock.now, sleep=clock.sleep).run(on_tick, stop=stop)
    assert stats.ticks == 5 and len(seen) == 5


@pytest.mark.parametrize("bad", [0.05, 0.0, -1.0, float("nan")])
def test_interval_below_ten_hertz_is_refused(bad):
    with pytest.raises(ValueError, match=r"at least 0\.1 s"):
        Sampler(HostSource(find_torch=False), bad)


def test_real_clock_run_with_the_host_source():
    src = HostSource(find_torch=False)
    batches: list[TickBatch] = []
    stats = Sampler(src, 0.1).run(batches.append, duration=0.5)
    # On a busy machine a slot may be skipped, but every slot is either run or counted.
    assert stats.ticks + stats.skipped == 5 and len(batches) == stats.ticks >= 2
    times = [b.time for b in batches]
    assert times == sorted(times)


def test_until_played_out_stops_at_the_end_of_a_replay_instead_of_passing_empty_ticks() -> None:
    import threading

    from phasescope.schema import TickBatch
    from phasescope.sources.sampler import until_played_out

    class Replay:
        exhausted = False

    src, stop, got = Replay(), threading.Event(), []
    tick = until_played_out(src, got.append, stop)  # type: ignore[arg-type]
    first = TickBatch.empty(0.0, [])
    tick(first)
    src.exhausted = True
    tick(TickBatch.empty(1.0, []))
    assert got == [first] and stop.is_set()
