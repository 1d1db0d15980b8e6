"""Cost from time and energy, per phase and per unit of work, and the training/inference crossover."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from phasescope.kpi.cost import (
    Cost,
    Prices,
    cost_of,
    cost_per_query,
    crossover,
    device_cost,
    per_1k_requests,
    per_million_tokens,
    per_step,
    phase_costs,
    total_cost,
)
from phasescope.kpi.energy import UNSEGMENTED, device_energy
from phasescope.sources.replay import read

TRAIN_RUN = "sensorguard-rtx3090/20260825_train_gpt2_wikitext_verifier-gpu0_s2_r03/nvml.csv"
INFER_RUN = "sensorguard-rtx3090/20260825_infer_gpt2_verifier-gpu0_s2_r03/nvml.csv"
BOTH = Prices(usd_per_gpu_hour=2.5, usd_per_kwh=0.12)


# ---------------------------------------------------------------- crossover: the textbook cases


def test_crossover_textbook_cases() -> None:
    # $10M training; 1M queries/day at $0.001 = $1,000/day -> 10,000 days.
    assert crossover(10e6, 1e6, 0.001) == pytest.approx(10_000)
    # 100M queries/day at $0.01 = $1M/day -> 10 days.
    assert crossover(10e6, 100e6, 0.01) == pytest.approx(10)


def test_crossover_edges() -> None:
    assert math.isinf(crossover(10e6, 0, 0.01))
    assert math.isinf(crossover(10e6, 1e6, 0))
    assert crossover(0, 1e6, 0.01) == 0
    for bad in ((-1, 1, 1), (1, -1, 1), (1, 1, float("nan")), (1, float("inf"), 1)):
        with pytest.raises(ValueError, match="finite number"):
            crossover(*bad)


# ---------------------------------------------------------------- the two components


def test_cost_components() -> None:
    c = cost_of(3600.0, 3.6e6, BOTH)  # one GPU-hour that drew one kWh
    assert (c.time_usd, c.energy_usd, c.total_usd) == (
        pytest.approx(2.5),
        pytest.approx(0.12),
        pytest.approx(2.62),
    )
    only_time = cost_of(7200.0, 3.6e6, Prices(usd_per_gpu_hour=2.0))
    assert (only_time.time_usd, only_time.energy_usd, only_time.total_usd) == (4.0, None, 4.0)
    unpriced = cost_of(7200.0, 3.6e6, Prices())
    assert unpriced.total_usd is None  # not priced is not free
    assert (Cost(1.0, None) + Cost(None, 2.0)).to_dict() == {
        "time_usd": 1.0,
        "energy_usd": 2.0,
        "total_usd": 3.0,
    }


def test_prices_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match="usd_per_kwh"):
        Prices(usd_per_kwh=-0.1)
    with pytest.raises(ValueError, match="usd_per_gpu_hour"):
        Prices(usd_per_gpu_hour=float("nan"))


def test_per_phase_cost_sums_to_total_on_a_real_run(shared_data: Path) -> None:
    traces = read(shared_data / TRAIN_RUN)
    gpu0 = traces[0]
    mid = float(gpu0.time[0] + gpu0.time[-1]) / 2
    segs = [(gpu0.time[0], mid, "idle"), (mid, gpu0.time[-1], "training")]
    results = [device_energy(gpu0, segs), device_energy(traces[1])]
    by_phase = phase_costs(results, BOTH)
    assert set(by_phase) == {"idle", "training", UNSEGMENTED}
    total = total_cost(results, BOTH)
    for part in ("time_usd", "energy_usd", "total_usd"):
        assert sum(getattr(c, part) for c in by_phase.values()) == pytest.approx(
            getattr(total, part), rel=1e-12
        )
    # The time component follows held time only; the energy component follows joules only.
    r = results[0]
    assert total.time_usd == pytest.approx((r.span_s + results[1].span_s) / 3600 * 2.5)
    assert device_cost(r, BOTH).energy_usd == pytest.approx(r.joules / 3.6e6 * 0.12)


def test_per_device_prices(shared_data: Path) -> None:
    traces = read(shared_data / TRAIN_RUN)
    results = [device_energy(t) for t in traces]
    dear = {results[0].device: Prices(usd_per_gpu_hour=4.0), results[1].device: Prices(usd_per_gpu_hour=1.0)}
    got = total_cost(results, dear).time_usd
    assert got == pytest.approx(results[0].span_s / 3600 * 4.0 + results[1].span_s / 3600 * 1.0)
    # Per phase, both devices' (unknown: not judged) time adds up under the one label, each at its own price.
    assert phase_costs(results, dear)[UNSEGMENTED].time_usd == pytest.approx(got)


# ---------------------------------------------------------------- per unit of work


def test_per_unit_math() -> None:
    spent = Cost(4.0, 1.0)
    per_k = per_1k_requests(spent, 20_000)
    assert per_k is not None and per_k.total_usd == pytest.approx(0.25)
    assert per_k.time_usd == pytest.approx(0.2)
    step = per_step(spent, 1_000)
    assert step is not None and step.total_usd == pytest.approx(0.005)
    mtok = per_million_tokens(spent, 2_500_000)
    assert mtok is not None and mtok.total_usd == pytest.approx(2.0)
    assert per_1k_requests(spent, 0) is None
    assert per_step(spent, None) is None
    assert per_million_tokens(spent, float("nan")) is None


def test_measured_cost_per_query_feeds_the_crossover(shared_data: Path) -> None:
    infer = [t for t in read(shared_data / INFER_RUN) if t.meta.get("gpu_index") == 0]
    results = [device_energy(t) for t in infer]
    requests = 50_000.0
    per_query = cost_per_query(results, requests, BOTH)
    r = results[0]
    by_hand = (r.span_s / 3600 * 2.5 + r.joules / 3.6e6 * 0.12) / requests
    assert per_query.total_usd == pytest.approx(by_hand, rel=1e-12)
    assert per_query.total_usd is not None
    days = crossover(10e6, 1e6, per_query.total_usd)
    assert days == pytest.approx(10e6 / (1e6 * by_hand))
    # Restricted to the inference phase: only that phase's time and energy count.
    mid = float(r.span_s / 2 + infer[0].time[0])
    half = [device_energy(infer[0], [(infer[0].time[0], mid, "idle"), (mid, infer[0].time[-1], "inference")])]
    phase_only = cost_per_query(half, requests, BOTH, phase="inference")
    assert phase_only.total_usd is not None and phase_only.total_usd < by_hand
    with pytest.raises(ValueError, match="requests"):
        cost_per_query(results, 0, BOTH)


def test_no_energy_reading_costs_device_time_only_never_zero_energy() -> None:
    from phasescope.kpi.energy import EnergyMeter

    meter = EnergyMeter(interval_s=1.0)  # a host: ticks with no power and no energy counter
    for t, phase in ((0.0, "training"), (1.0, "training"), (2.0, "inference"), (3.0, "inference")):
        meter.update(t, math.nan, math.nan, phase)
    result = meter.result("host")
    assert result.method == "none"
    cost = device_cost(result, BOTH)
    assert cost.time_usd == pytest.approx(3.0 / 3600 * 2.5)
    assert cost.energy_usd is None  # unmeasured, not $0 of energy
    by_phase = phase_costs([result], BOTH)
    assert {k: c.time_usd for k, c in by_phase.items()} == {
        "training": pytest.approx(1.0 / 3600 * 2.5), "inference": pytest.approx(2.0 / 3600 * 2.5)}
    assert all(c.energy_usd is None for c in by_phase.values())
    assert cost_of(3600.0, 0.0, BOTH, measured=False).to_dict() == {
        "time_usd": 2.5, "energy_usd": None, "total_usd": 2.5}
