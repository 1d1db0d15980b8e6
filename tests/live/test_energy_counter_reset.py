"""A counter reset next to a missing counter reading: the live meter bridges the interval between the two
counter readings with power, as `energy_curve` does (it used to bridge only when the previous tick had a
reading, so `1000, 1100, NaN, 5, ...` lost the reset interval live but not offline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.kpi.energy import EnergyMeter, FleetEnergyMeter, device_energy
from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay import read
from tests.live_helpers import ticks

NAN = float("nan")
RUNS = [
    "20260824_calib-bursty_verifier-gpu0_s0_r01",
    "20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01",
    "20260825_infer_bert_verifier-gpu0_s0_r01",
    "20260825_hpc_memcpy_verifier-gpu0_s2_r03",
]


def test_reset_after_a_missing_reading_is_bridged_like_offline() -> None:
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    counter = [1000.0, 1100.0, NAN, 5.0, 105.0, 205.0]
    trace = Trace(DeviceInfo("GPU-a"), times, {"power": np.full(6, 100.0), "energy": np.array(counter)})
    offline = device_energy(trace)
    meter = EnergyMeter()
    for t, e in zip(times, counter, strict=True):
        meter.update(t, 100.0, e)
    live = meter.result()
    assert (offline.joules, offline.covered_s, offline.resets) == pytest.approx((500.0, 5.0, 1))
    assert (live.joules, live.covered_s, live.resets) == pytest.approx((500.0, 5.0, 1))


def _with_counter(trace: Trace, rng: np.random.Generator) -> Trace:
    """The trace with a counter built from its own power (running trapezoid integral), reset once at a
    random row whose previous reading is missing (the readings two rows before and at the reset are kept,
    so the reset interval is two ticks, within the gap rule), and ~20% of the other readings missing at
    random. The first reading is kept: before it the live meter integrates power, which the offline
    counter method cannot know about."""
    t, p = trace.time, np.nan_to_num(trace["power"], nan=0.0)
    counter = 5e6 + np.concatenate(([0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * np.diff(t))))
    at = int(rng.integers(len(t) // 4, 3 * len(t) // 4))
    counter[at:] -= counter[at] - 10.0
    missing = rng.random(len(t)) < 0.2
    missing[[0, at - 2, at - 1, at]] = [False, False, True, False]  # one missing right before the reset
    counter[missing] = np.nan
    return trace.with_columns(energy=counter)


@pytest.mark.parametrize("run", RUNS)
def test_live_equals_offline_with_reset_and_missing_readings(shared_data: Path, run: str) -> None:
    rng = np.random.default_rng(7)
    traces = read(shared_data / "sensorguard-rtx3090" / run / "nvml.csv")
    n = min(len(t) for t in traces)
    traces = [_with_counter(t.take(slice(0, n)), rng) for t in traces]
    for tr in traces:  # one fleet per device: a shared tick would carry the first device's clock
        fleet = FleetEnergyMeter()
        for batch in ticks([tr]):
            fleet.update(batch)
        offline = device_energy(tr)
        live = fleet.meters[tr.device.uuid].result()
        assert (live.method, live.resets) == (offline.method, offline.resets) == ("counter", 1)
        assert live.joules == pytest.approx(offline.joules, abs=1e-6)
        assert live.covered_s == pytest.approx(offline.covered_s, abs=1e-6)
