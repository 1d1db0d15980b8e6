"""Honest resolution: the fleet hands the classifier the real samples, at the data's own interval, whatever
the query step; a frozen exporter is told from a steady GPU.

The answers are built as Prometheus builds them: an exporter collects a real trace every `collect_s`, each
scrape (every `scrape_s`) stores the last collected reading, and a range query answers each step with the
last stored sample at or before it (within the 5-minute lookback).
"""

from __future__ import annotations

import numpy as np
import pytest

from phasescope.fleet import names
from phasescope.fleet.collect import FROZEN_S, _Device, build_traces, fresh
from phasescope.prom.client import Series
from phasescope.schema import MIB, Trace

LOOKBACK_S = 300.0


def stored(trace: Trace, signal: str, start: float, end: float, collect_s: float, scrape_s: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """(scrape times, stored values): each scrape stores the reading the exporter last collected."""
    collected = np.arange(start, end, collect_s)
    readings = np.interp(collected, trace.time, trace[signal])
    scrapes = np.arange(start, end, scrape_s)
    last = np.searchsorted(collected, scrapes, side="right") - 1
    return scrapes, readings[last]


def answered(times: np.ndarray, values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A range query's answer on `grid`: per step, the last stored sample at or before it (lookback)."""
    i = np.searchsorted(times, grid, side="right") - 1
    ok = (i >= 0) & (grid - times[np.maximum(i, 0)] <= LOOKBACK_S)
    return grid[ok], values[i[ok]]


def _trace_from(trace: Trace, collect_s: float, scrape_s: float, step: float, n: int,
                signals: tuple[str, ...] = ("gpu_util", "mem_used", "power")) -> Trace:
    start = float(np.ceil(trace.time[0]))
    grid = start + step * np.arange(n)
    metric = {"gpu_util": ("DCGM_FI_DEV_GPU_UTIL", 100.0), "mem_used": ("DCGM_FI_DEV_FB_USED", 1 / MIB),
              "power": ("DCGM_FI_DEV_POWER_USAGE", 1.0)}
    lab = {"UUID": "GPU-r", "gpu": "0", "modelName": "RTX 3090", "Hostname": "n1"}
    series = []
    for sig in signals:
        name, factor = metric[sig]
        t, v = stored(trace, sig, start, grid[-1] + step, collect_s, scrape_s)
        gt, gv = answered(t, v * factor, grid)
        series.append(Series({"__name__": name, **lab}, gt, gv))
    dev = _Device("GPU-r", "UUID", lab, {s.labels["__name__"] for s in series})
    (out,) = build_traces([dev], series, start, step, n, names.metric_map())
    return out


def test_a_30s_collector_scraped_every_15s_and_queried_every_second_gives_30s_samples(
    fleet_traces: dict[str, Trace],
) -> None:
    t = fleet_traces["training"]
    out = _trace_from(t, collect_s=30.0, scrape_s=15.0, step=1.0, n=600)
    assert out.meta["sample_interval_s"] == pytest.approx(30.0)
    assert len(out) == pytest.approx(600 / 30, abs=1)  # not 600 repeats
    assert "frozen_since" not in out.meta


def test_one_hertz_data_at_a_one_second_step_is_kept_whole(fleet_traces: dict[str, Trace]) -> None:
    t = fleet_traces["training"]
    out = _trace_from(t, collect_s=1.0, scrape_s=1.0, step=1.0, n=300)
    assert len(out) == 300 and out.meta["sample_interval_s"] == pytest.approx(1.0)


def test_a_steady_signal_keeps_one_sample_per_real_interval() -> None:
    """Utilisation at zero and memory fixed for minutes, next to a power series that moves with each
    collection: the steady stretch keeps one row per 15 s, not one row in all."""
    values = np.full((600, 3), np.nan)
    values[:, 0] = 0.0  # utilisation
    values[:, 1] = 1e9  # memory
    values[:, 2] = 60.0 + np.repeat(np.arange(40) % 3, 15)  # power: a new reading every 15 steps
    keep = fresh(values)
    assert keep.sum() == 40 and np.all(np.diff(np.flatnonzero(keep)) == 15)
    values[:, 2] = np.nan  # no lively column at all: nothing to tell repeats by, so every row stays
    assert fresh(values).all()


def test_a_frozen_exporter_is_flagged_a_steady_gpu_is_not(fleet_traces: dict[str, Trace]) -> None:
    idle = fleet_traces["idle"]
    start = float(np.ceil(idle.time[0]))
    n = int(FROZEN_S) + 200
    grid = start + np.arange(n, dtype=float)
    power = np.interp(grid, idle.time, idle["power"])
    lab = {"UUID": "GPU-f", "Hostname": "n1"}
    dev = _Device("GPU-f", "UUID", lab, {"DCGM_FI_DEV_POWER_USAGE"})
    (steady,) = build_traces([dev], [Series({"__name__": "DCGM_FI_DEV_POWER_USAGE", **lab}, grid, power)],
                             start, 1.0, n, names.metric_map())
    assert "frozen_since" not in steady.meta  # a real idle GPU's power moves
    frozen = power.copy()
    frozen[150:] = frozen[150]  # DCGM hung: the exporter serves its last reading
    (stale,) = build_traces([dev], [Series({"__name__": "DCGM_FI_DEV_POWER_USAGE", **lab}, grid, frozen)],
                            start, 1.0, n, names.metric_map())
    assert stale.meta["frozen_since"] == pytest.approx(grid[150])


def test_impossible_readings_from_prometheus_are_missing(fleet_traces: dict[str, Trace]) -> None:
    """An exporter that reports 1e308 W or -50 W (a broken sensor, a unit bug) is counted and read as missing,
    as the file readers do (schema.RANGES): no joule or verdict is computed from it."""
    t = fleet_traces["training"]
    start, n = float(np.ceil(t.time[0])), 120
    grid = start + np.arange(n, dtype=float)
    power = np.interp(grid, t.time, t["power"])
    power[10], power[20:23] = 1e308, -50.0
    lab = {"UUID": "GPU-x", "Hostname": "n1"}
    dev = _Device("GPU-x", "UUID", lab, {"DCGM_FI_DEV_POWER_USAGE"})
    (out,) = build_traces([dev], [Series({"__name__": "DCGM_FI_DEV_POWER_USAGE", **lab}, grid, power)],
                          start, 1.0, n, names.metric_map())
    assert out.meta["impossible_values"] == {"power": 4}
    p = out["power"]
    assert np.nanmax(p) < 1000 and np.nanmin(p) >= 0 and np.isnan(p).sum() == 4
