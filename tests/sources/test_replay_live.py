"""ReplaySource: a real log played as live devices, on an injected clock (no sleeping)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.errors import InputError
from phasescope.schema import PAPER_SIGNALS, SIGNAL_COLUMN, SIGNAL_NAMES, Trace
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource

RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
WALL0 = 1_780_000_000.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def real(shared_data: Path) -> list[Trace]:
    traces = read(shared_data / RUN)
    assert len(traces) >= 2
    return traces


def _source(traces: list[Trace], **kw: object) -> tuple[ReplaySource, FakeClock]:
    clock = FakeClock()
    return ReplaySource(traces, clock=clock, wall_clock=lambda: WALL0, **kw), clock  # type: ignore[arg-type]


def _row(trace: Trace, i: int) -> np.ndarray:
    return np.array([trace[s][i] for s in SIGNAL_NAMES])


def test_devices_advance_in_step_on_the_recorded_clock(real: list[Trace]) -> None:
    src, clock = _source(real)
    assert [d.uuid for d in src.devices()] == [t.device.uuid for t in real]
    t0 = src.t0
    first = src.read()  # at the start every device already has a sample
    for row, trace in enumerate(real):
        np.testing.assert_array_equal(first.values[row], _row(trace, 0))
    for i in (5, 42, 120):
        pos = max(t.time[i] for t in real) + 1e-3
        clock.now = 100.0 + (pos - t0)
        batch = src.read()
        assert batch.time == pytest.approx(WALL0 + pos - t0)
        for row, trace in enumerate(real):
            np.testing.assert_array_equal(batch.values[row], _row(trace, i))
    assert not src.exhausted and src.error_counts() == {}


def test_speed_plays_the_recording_faster(real: list[Trace]) -> None:
    src, clock = _source(real, speed=20.0)
    t0 = src.t0
    assert src.interval_s == pytest.approx(src.native_interval_s / 20.0)
    assert src.native_interval_s == pytest.approx(1.0, abs=0.01)
    clock.now += 3.0  # 3 real seconds = 60 recorded seconds
    batch = src.read()
    assert batch.time == pytest.approx(WALL0 + 60.0)
    i = int(np.searchsorted(real[0].time, t0 + 60.0, side="right")) - 1
    np.testing.assert_array_equal(batch.values[0], _row(real[0], i))


def test_loop_restarts_and_time_keeps_growing(real: list[Trace]) -> None:
    src, clock = _source(real, speed=10.0, loop=True)
    clock.now += 1.234  # 12.34 recorded seconds in
    first = src.read()
    assert np.isfinite(first.values[:, SIGNAL_COLUMN["power"]]).all()
    clock.now += src.period / 10.0  # exactly one loop later
    again = src.read()
    assert again.time == pytest.approx(first.time + src.period)
    np.testing.assert_array_equal(again.values[0], first.values[0])
    assert not src.exhausted


def test_without_loop_the_source_runs_out(real: list[Trace]) -> None:
    src, clock = _source(real, speed=100.0)
    assert src.read().events and not src.exhausted  # says once what it replays
    clock.now += src.period / 100.0 - 0.01
    last = src.read()
    np.testing.assert_array_equal(last.values[0], _row(real[0], len(real[0]) - 1))
    clock.now += 0.02
    end = src.read()
    assert src.exhausted and "replay finished" in end.events
    assert np.isnan(end.values).all()


def test_a_gap_in_the_log_reads_as_missing(real: list[Trace]) -> None:
    trace = real[0]
    keep = np.ones(len(trace), bool)
    keep[50:80] = False  # 30 s with no samples
    src, clock = _source([trace.take(keep)])
    t0 = trace.time[0]
    clock.now = 100.0 + (trace.time[49] - t0) + 0.5
    assert np.isfinite(src.read().values[0, [SIGNAL_COLUMN[s] for s in PAPER_SIGNALS]]).all()
    clock.now = 100.0 + (trace.time[65] - t0)
    assert np.isnan(src.read().values).all()
    clock.now = 100.0 + (trace.time[80] - t0) + 0.01
    np.testing.assert_array_equal(src.read().values[0], _row(trace, 80))


def test_from_path_reads_any_format(shared_data: Path) -> None:
    spar = sorted((shared_data / "spar-a100").glob("*.parquet"))[0]
    src = ReplaySource.from_path(spar, speed=5.0)
    batch = src.read()
    assert len(batch.devices) == 1 and np.isfinite(batch.values[0, SIGNAL_COLUMN["power"]])
    with pytest.raises(InputError):
        ReplaySource.from_path(shared_data / "nope.csv")


def test_bad_arguments(real: list[Trace]) -> None:
    with pytest.raises(InputError, match="speed: expected a positive number"):
        ReplaySource(real, speed=0)
    with pytest.raises(InputError, match="at least one device with samples"):
        ReplaySource([real[0].take(np.zeros(len(real[0]), bool))])


def test_duplicate_uuids_stay_distinct_devices(real: list[Trace]) -> None:
    src, _ = _source([real[0], real[0]])
    uuids = [d.uuid for d in src.devices()]
    assert len(set(uuids)) == 2 and uuids[0] == real[0].device.uuid


def test_a_tick_maps_back_to_the_recordings_own_clock(real: list[Trace]) -> None:
    """Views show a replay's own time, not wall time running `speed` times faster (issue 22 item 4)."""
    anchor = float(real[0].meta.get("utc_offset") or 0.0)  # the raw clock's tie to UTC (next test)
    src, clock = _source(real, speed=10.0)
    clock.now += 6.0  # 60 recorded seconds in
    batch = src.read()
    assert src.trace_time(batch.time) == pytest.approx(src.t0 + anchor + 60.0)
    assert batch.time + src.clock_offset_s == pytest.approx(src.t0 + anchor + 60.0)
    looped, lclock = _source(real, speed=10.0, loop=True)
    lclock.now += (looped.period + 60.0) / 10.0  # one whole pass, then 60 s into the next
    assert looped.trace_time(looped.read().time) == pytest.approx(looped.t0 + anchor + 60.0)


def test_a_raw_clock_maps_through_the_logs_utc_anchor(real: list[Trace]) -> None:
    """SensorGuard keeps a raw monotonic clock (~16,000 s: 1970 as a date) tied to UTC in meta: the replay's
    clock is the recording's Unix time."""
    offset = real[0].meta.get("utc_offset")
    assert isinstance(offset, float) and offset > 1e9  # the file has its anchor
    src, clock = _source(real, speed=10.0)
    clock.now += 6.0
    assert src.trace_time(src.read().time) == pytest.approx(src.t0 + offset + 60.0)
    assert src.t0 + offset > 1.7e9  # 2023 or later: a real date
