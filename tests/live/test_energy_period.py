"""The live energy meters' learnt sample period: an interval is judged by the spacings before it, and the
fleet meter learns the period from the source's ticks, so a hiccup early in a session or a device's absence
is not bridged by a period it vouched for itself."""

from __future__ import annotations

import numpy as np
import pytest

from phasescope.kpi.energy import EnergyMeter, FleetEnergyMeter, energy_curve
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, TickBatch, Trace

WATTS = 100.0


def _offline_j(times: list[float]) -> float:
    trace = Trace(DeviceInfo("GPU-a"), times, {"power": np.full(len(times), WATTS)})
    return float(energy_curve(trace).energy_j[-1])


@pytest.mark.parametrize("hiccup_at", [2, 3])
def test_early_hiccup_is_not_bridged(hiccup_at: int) -> None:
    """1 Hz ticks whose 3rd (or 4th) comes 29 s late: the late interval is a gap, as offline calls it (the
    median of [1, 29] s, counting the interval itself, was 15 s and bridged it)."""
    times = [float(t) for t in range(hiccup_at)] + [hiccup_at + 28.0 + k for k in range(70)]
    meter = EnergyMeter()
    for t in times:
        meter.update(t, WATTS)
    assert meter.joules == pytest.approx(_offline_j(times))
    assert meter.covered_s == pytest.approx(len(times) - 2)  # every 1 s interval, not the 29 s one


def _batch(t: float, uuids: list[str]) -> TickBatch:
    values = np.full((len(uuids), len(SIGNAL_NAMES)), np.nan)
    values[:, SIGNAL_NAMES.index("power")] = WATTS
    return TickBatch(t, [DeviceInfo(u) for u in uuids], values)


def test_device_absent_for_an_hour_is_not_bridged() -> None:
    """A GPU listed for two 1 s ticks, unlisted for an hour, then back: the fleet ticked at 1 s all along,
    so the hour is a gap (its own three ticks, 1 s and 3,600 s apart, gave a 1,800 s median: bridged)."""
    fleet = FleetEnergyMeter()
    for t in range(3700):
        fleet.update(_batch(float(t), ["GPU-a", "GPU-b"] if t < 2 or t >= 3602 else ["GPU-a"]))
    b = fleet.meters["GPU-b"]
    assert b.covered_s == pytest.approx(1.0 + 97.0)  # 0..1 and 3602..3699
    assert fleet.meters["GPU-a"].covered_s == pytest.approx(3699.0)


def test_fleet_period_follows_sparse_ticks() -> None:
    """Batches 10 s apart are metered (the period is learnt from them), as before."""
    fleet = FleetEnergyMeter()
    for t in range(0, 600, 10):
        fleet.update(_batch(float(t), ["GPU-a"]))
    assert fleet.meters["GPU-a"].covered_s == pytest.approx(590.0)
    assert fleet.meters["GPU-a"].max_gap_s == pytest.approx(30.0)
