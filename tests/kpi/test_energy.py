"""Energy per device and per phase, on real traces from ../shared/data (counter, integrated power, gaps)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from phasescope.kpi.energy import (
    UNSEGMENTED,
    EnergyMeter,
    FleetEnergyMeter,
    as_segments,
    device_energy,
    energy_curve,
    energy_per_device,
    totals_by_phase,
)
from phasescope.schema import SIGNAL_NAMES, TickBatch, Trace
from phasescope.sources.replay import read

TRAIN_RUN = "sensorguard-rtx3090/20260825_train_gpt2_wikitext_verifier-gpu0_s2_r03/nvml.csv"
SPAR_RUN = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"
# An arbitrary "energy since driver load" the synthetic counter starts from, as NVML's would.
COUNTER_OFFSET_J = 1.7e9


def _by_index(traces: list[Trace], index: int) -> Trace:
    return next(t for t in traces if t.meta.get("gpu_index", t.device.index) == index)


def _label_span(shared_data: Path, rel: str, gpu: int) -> tuple[float, float]:
    with (shared_data / "labels.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row["path"] == rel and int(row["gpu_index"]) == gpu and row["t_from"]:
                return float(row["t_from"]), float(row["t_to"])
    raise AssertionError(f"no labelled span for {rel} gpu {gpu}")


@pytest.fixture(scope="module")
def run_traces(shared_data: Path) -> list[Trace]:
    return read(shared_data / TRAIN_RUN)


@pytest.fixture(scope="module")
def train(run_traces: list[Trace]) -> Trace:
    return _by_index(run_traces, 0)


@pytest.fixture(scope="module")
def bystander(run_traces: list[Trace]) -> Trace:
    return _by_index(run_traces, 1)


@pytest.fixture(scope="module")
def span(shared_data: Path) -> tuple[float, float]:
    return _label_span(shared_data, TRAIN_RUN, 0)


def _with_counter(trace: Trace) -> Trace:
    """The real power trace plus an energy counter that is its running trapezoid integral."""
    t, p = trace.time, trace["power"]
    steps = 0.5 * (p[1:] + p[:-1]) * np.diff(t)
    return trace.with_columns(energy=COUNTER_OFFSET_J + np.concatenate(([0.0], np.cumsum(steps))))


def _mean_power_bound(trace: Trace) -> tuple[float, float]:
    """mean(power) x duration, and how far a trapezoid integral can differ from it on these very samples.

    With d = duration / (n - 1): |E - mean*D| <= pmax * sum|dt_i - d| + d * |mean - (p_0 + p_n) / 2|.
    """
    t, p = trace.time, trace["power"]
    dt = np.diff(t)
    d = dt.mean()
    tol = p.max() * np.abs(dt - d).sum() + d * abs(p.mean() - 0.5 * (p[0] + p[-1]))
    return float(p.mean() * (t[-1] - t[0])), float(tol)


# ---------------------------------------------------------------- integrated power on real traces


def test_training_energy_is_mean_power_times_duration(train: Trace, span: tuple[float, float]) -> None:
    for trace in (train, train.slice_time(*span)):
        r = device_energy(trace)
        assert r.method == "integrated_power"
        assert r.coverage == pytest.approx(1.0)  # this run has no gaps
        expected, tol = _mean_power_bound(trace)
        assert abs(r.joules - expected) <= tol + 1e-9
        assert tol < 0.01 * expected  # the bound is tight enough to mean something


def test_training_draws_far_more_than_its_idle_bystander(train: Trace, bystander: Trace) -> None:
    busy, idle = device_energy(train), device_energy(bystander)
    assert busy.span_s == pytest.approx(idle.span_s, abs=2.0)
    # Same host, same minutes: the GPU under training uses several times the energy of the idle one.
    assert busy.joules > 3 * idle.joules
    assert min(train["power"]) <= busy.mean_power_w <= max(train["power"])


def test_spar_a100_parquet_has_no_counter_and_is_integrated(shared_data: Path) -> None:
    (trace,) = read(shared_data / SPAR_RUN)
    assert not trace.has("energy")  # checked: no total-energy column in any spar-a100 file
    r = device_energy(trace)
    expected, tol = _mean_power_bound(trace)
    assert r.method == "integrated_power"
    assert abs(r.joules - expected) <= tol + 1e-9


def test_rows_out_of_order_or_repeated_give_the_same_energy(train: Trace) -> None:
    order = np.random.default_rng(0).permutation(len(train))
    shuffled = train.take(order)
    doubled = Trace.concat([train, train.take(slice(100, 110))])
    base = device_energy(train).joules
    assert device_energy(shuffled).joules == pytest.approx(base, rel=1e-12)
    assert device_energy(doubled).joules == pytest.approx(base, rel=1e-12)


# ---------------------------------------------------------------- gaps and NaN


def test_one_missing_sample_is_bridged(train: Trace) -> None:
    k = 300
    p = train["power"].copy()
    p[k] = np.nan
    r = device_energy(train.with_columns(power=p))
    full = device_energy(train)
    assert r.coverage == pytest.approx(1.0)
    dt = train.time[k + 1] - train.time[k - 1]
    # Bridging one sample replaces it with the mean of its neighbours: the error is at most that difference.
    p0 = train["power"]
    assert abs(r.joules - full.joules) <= 0.5 * abs(p0[k] - 0.5 * (p0[k - 1] + p0[k + 1])) * dt + 1e-9


def test_long_gap_is_not_integrated_and_is_reported(train: Trace) -> None:
    lo, hi = 200, 260  # 60 samples missing, ~61 s between the finite neighbours
    p = train["power"].copy()
    p[lo:hi] = np.nan
    r = device_energy(train.with_columns(power=p))
    gap_s = train.time[hi] - train.time[lo - 1]
    assert r.uncovered_s == pytest.approx(gap_s, rel=1e-9)
    assert r.coverage == pytest.approx(1 - gap_s / r.span_s)
    lost, _ = energy_curve(train).between(train.time[lo - 1], train.time[hi])
    assert r.joules == pytest.approx(device_energy(train).joules - float(lost), rel=1e-12)
    # A larger allowance bridges the gap with one straight line between its ends.
    bridged = device_energy(train.with_columns(power=p), max_gap_s=gap_s + 1)
    assert bridged.coverage == pytest.approx(1.0)


def test_gap_rule_scales_with_the_sample_period(shared_data: Path) -> None:
    (trace,) = read(shared_data / SPAR_RUN)
    assert device_energy(trace, max_gap_s=0.5).covered_s == 0.0  # 1 Hz samples, 0.5 s allowance
    assert device_energy(trace, gap_factor=3).coverage == pytest.approx(1.0)


def test_no_power_and_no_counter_means_no_energy(train: Trace) -> None:
    r = device_energy(train.without("power"))
    assert (r.method, r.joules, r.covered_s) == ("none", 0.0, 0.0)
    assert r.uncovered_s == pytest.approx(r.span_s)
    assert json.loads(json.dumps(r.to_dict()))["mean_power_w"] is None


# ---------------------------------------------------------------- the energy counter


def test_counter_is_preferred_and_agrees_with_integrated_power(train: Trace) -> None:
    with_counter = _with_counter(train)
    r = device_energy(with_counter)
    assert r.method == "counter"
    assert r.joules == pytest.approx(device_energy(train).joules, rel=1e-9)
    assert device_energy(with_counter.without("power")).method == "counter"
    assert device_energy(with_counter, method="integrated_power").method == "integrated_power"


def test_counter_covers_a_gap_exactly_where_power_cannot(train: Trace) -> None:
    with_counter = _with_counter(train)
    lo, hi = 200, 260
    holes = {k: with_counter[k].copy() for k in ("power", "energy")}
    for col in holes.values():
        col[lo:hi] = np.nan
    gappy = with_counter.with_columns(**holes)
    counted = device_energy(gappy)
    assert counted.method == "counter"
    assert counted.coverage == pytest.approx(1.0)
    assert counted.joules == pytest.approx(device_energy(train).joules, rel=1e-9)
    integrated = device_energy(gappy, method="integrated_power")
    assert integrated.joules < counted.joules
    assert integrated.coverage < 0.95


def test_counter_reset_is_bridged_with_power(train: Trace) -> None:
    counter = _with_counter(train)["energy"].copy()
    k = 400
    # The driver reloads between samples k-1 and k: the counter restarts from zero partway through.
    restart_at = 0.5 * (counter[k - 1] + counter[k])
    counter[k:] -= restart_at
    reset = train.with_columns(energy=counter)
    r = device_energy(reset)
    assert r.resets == 1
    assert r.coverage == pytest.approx(1.0)
    assert r.joules == pytest.approx(device_energy(train).joules, rel=1e-9)
    # Without power the reset interval cannot be known: it is left out and reported as uncovered.
    blind = device_energy(reset.without("power"))
    dt = train.time[k] - train.time[k - 1]
    assert blind.resets == 1
    assert blind.uncovered_s == pytest.approx(dt, rel=1e-9)
    lost = _with_counter(train)["energy"][k] - _with_counter(train)["energy"][k - 1]
    assert blind.joules == pytest.approx(r.joules - lost, rel=1e-9)


def test_counter_reset_across_a_long_gap_is_not_bridged(train: Trace) -> None:
    # The counter is silent for 20 samples and comes back reset: power at both ends must not be stretched
    # over a gap longer than the gap rule allows (it would guess 20 s of energy); the gap stays uncovered.
    counter = _with_counter(train)["energy"].copy()
    k, n = 400, 20
    counter[k : k + n] = np.nan
    counter[k + n :] -= counter[k + n] - 1.0
    r = device_energy(train.with_columns(energy=counter))
    assert r.method == "counter" and r.resets == 1
    assert r.uncovered_s == pytest.approx(train.time[k + n] - train.time[k - 1], rel=1e-9)


# ---------------------------------------------------------------- per phase


def test_phases_sum_to_the_total_and_match_the_labelled_span(train: Trace, span: tuple[float, float]) -> None:
    t_from, t_to = span
    t0, t1 = float(train.time[0]), float(train.time[-1])
    segs = [(t0, t_from, "other"), (t_from, t_to, "training"), (t_to, t1, "other")]
    r = device_energy(train, segs)
    assert set(r.phases) == {"other", "training"}
    assert sum(p.joules for p in r.phases.values()) == pytest.approx(r.joules, rel=1e-12)
    assert r.phases["training"].seconds == pytest.approx(t_to - t_from)
    assert r.phases["other"].seconds == pytest.approx((t_from - t0) + (t1 - t_to))
    # Against the energy of the cut trace: they differ only by the two partial intervals at the cut edges.
    cut = device_energy(train.slice_time(t_from, t_to)).joules
    edge = 2 * float(np.nanmax(train["power"])) * float(np.diff(train.time).max())
    assert abs(r.phases["training"].joules - cut) <= edge


def test_unclaimed_time_is_unknown(train: Trace, span: tuple[float, float]) -> None:
    r = device_energy(train, [(span[0], span[1], "training")])
    assert set(r.phases) == {"training", UNSEGMENTED}
    assert sum(p.seconds for p in r.phases.values()) == pytest.approx(r.span_s)
    assert sum(p.joules for p in r.phases.values()) == pytest.approx(r.joules, rel=1e-12)


def test_unclaimed_time_joins_the_time_the_classifier_called_unknown(
    train: Trace, span: tuple[float, float]
) -> None:
    """Time no segment claims and segments the classifier called unknown are one "unknown" row, the one
    word every view uses for time not judged: the unclaimed rest adds to it, it does not overwrite it."""
    t0 = float(train.time[0])
    r = device_energy(train, [(t0, span[0], "unknown"), (span[0], span[1], "training")])
    assert UNSEGMENTED == "unknown" and set(r.phases) == {"training", "unknown"}
    assert r.phases["unknown"].seconds == pytest.approx(r.span_s - (span[1] - span[0]))
    assert sum(p.seconds for p in r.phases.values()) == pytest.approx(r.span_s)
    assert sum(p.joules for p in r.phases.values()) == pytest.approx(r.joules, rel=1e-12)
    assert sum(p.covered_s for p in r.phases.values()) == pytest.approx(r.covered_s, rel=1e-12)


def test_segments_from_the_decider_and_plain_tuples_agree(train: Trace, span: tuple[float, float]) -> None:
    from phasescope.classify.decide import Segment

    objs = [Segment(span[0], span[1], "training", {}, 1)]
    assert device_energy(train, objs).phases == device_energy(train, [(*span, "training")]).phases


def test_bad_segments_are_refused() -> None:
    with pytest.raises(ValueError, match="overlap"):
        as_segments([(0, 10, "training"), (5, 20, "idle")])
    with pytest.raises(ValueError, match="start <= end"):
        as_segments([(10, 0, "training")])
    assert as_segments([(10, 20, "b"), (0, 10, "a")]) == [(0.0, 10.0, "a"), (10.0, 20.0, "b")]


def test_per_device_and_totals(run_traces: list[Trace], span: tuple[float, float]) -> None:
    segs = {run_traces[0].device.uuid: [(*span, "training")]}
    results = energy_per_device(run_traces, segs)
    assert [r.device for r in results] == [t.device.uuid for t in run_traces]
    totals = totals_by_phase(results)
    assert sum(p.joules for p in totals.values()) == pytest.approx(sum(r.joules for r in results), rel=1e-12)
    assert json.dumps([r.to_dict() for r in results])


# ---------------------------------------------------------------- live meter


def _phase_at(times: np.ndarray, span: tuple[float, float]) -> list[str]:
    return ["training" if span[0] < t <= span[1] else "other" for t in times]


def _feed(trace: Trace, phases: list[str]) -> EnergyMeter:
    meter = EnergyMeter(interval_s=1.0)
    for t, p, e, ph in zip(trace.time, trace["power"], trace["energy"], phases, strict=True):
        meter.update(t, p, e, ph)
    return meter


def test_meter_matches_batch_per_phase_on_a_real_trace(train: Trace, span: tuple[float, float]) -> None:
    # Segment edges on sample times, so batch and live attribute every interval the same way.
    i0, i1 = np.searchsorted(train.time, span)
    s0, s1 = float(train.time[i0]), float(train.time[i1])
    batch = device_energy(
        train, [(train.time[0], s0, "other"), (s0, s1, "training"), (s1, train.time[-1], "other")]
    )
    live = _feed(train, _phase_at(train.time, (s0, s1))).result(train.device.uuid)
    assert live.method == "integrated_power"
    assert live.joules == pytest.approx(batch.joules, rel=1e-12)
    for label in ("training", "other"):
        assert live.phases[label].joules == pytest.approx(batch.phases[label].joules, rel=1e-9)
        assert live.phases[label].seconds == pytest.approx(batch.phases[label].seconds, rel=1e-9)


def test_meter_with_counter_gap_and_reset_matches_batch(train: Trace) -> None:
    counter = _with_counter(train)["energy"].copy()
    counter[500:] -= 0.5 * (counter[499] + counter[500])  # a reset
    counter[100:130] = np.nan  # a counter gap, power still there
    trace = train.with_columns(energy=counter)
    live = _feed(trace, ["training"] * len(trace))
    batch = device_energy(trace)
    assert (live.method, live.resets) == ("counter", 1)
    assert live.joules == pytest.approx(batch.joules, rel=1e-9)
    assert live.covered_s == pytest.approx(batch.covered_s, rel=1e-9)
    assert live.joules == pytest.approx(device_energy(train).joules, rel=1e-9)


def test_meter_skips_long_power_gaps_like_batch(train: Trace) -> None:
    p = train["power"].copy()
    p[200:260] = np.nan
    gappy = train.with_columns(power=p)
    live = _feed(gappy, ["x"] * len(gappy))
    batch = device_energy(gappy)
    assert live.joules == pytest.approx(batch.joules, rel=1e-12)
    assert live.covered_s == pytest.approx(batch.covered_s, rel=1e-12)
    assert live.update(train.time[10], 100.0) == 0.0  # a tick from the past is ignored


def test_fleet_meter_reads_tick_batches(run_traces: list[Trace]) -> None:
    a, b = run_traces[0], run_traces[1]
    n = min(len(a), len(b))
    times = a.time[:n]
    fleet = FleetEnergyMeter(interval_s=1.0)
    col = SIGNAL_NAMES.index("power")
    for i in range(n):
        batch = TickBatch.empty(float(times[i]), [a.device, b.device])
        batch.values[0, col], batch.values[1, col] = a["power"][i], b["power"][i]
        fleet.update(batch, {a.device.uuid: "training"})
    got = {r.device: r for r in fleet.results()}
    for tr in (a, b):
        expected = device_energy(Trace(tr.device, times, {"power": tr["power"][:n]}))
        assert got[tr.device.uuid].joules == pytest.approx(expected.joules, rel=1e-12)
    assert set(got[a.device.uuid].phases) == {"training"}
    assert set(got[b.device.uuid].phases) == {"unknown"}
