"""A MIG GPU watched by phasescope's own agent: its instances are priced as shares of one physical GPU.

The agent names each MIG instance by its own uuid (`MIG-...`) and keeps the parent GPU and the profile in
the info metric `phasescope_gpu_info` (prom/names.py), where dcgm-exporter puts them on every
series (`UUID` of the parent, `GPU_I_ID`, `GPU_I_PROFILE`: test_judge_mig.py). The fleet joins that info by
uuid, so one A100 split in two instances held idle for an hour costs one GPU-hour, not three.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from tests.fleet.harness import Procs, backfill, free_port, start_prometheus

from phasescope.classify.model import PhaseModel
from phasescope.fleet import names
from phasescope.fleet.collect import _batches, build_traces, discover, fetch_traces, in_shard
from phasescope.fleet.judge import HELD_IDLE, judge_all
from phasescope.fleet.shard import Shard
from phasescope.kpi.cost import Prices
from phasescope.prom.client import PromClient, Series, StageClock
from phasescope.prom.names import SIGNAL_METRICS
from phasescope.schema import DeviceInfo, Trace

A100 = "NVIDIA A100-SXM4-40GB"
# One A100: the parent row, and two 3g instances (6 of its 7 slices; the parent pays the unassigned 1/7).
ROWS = [("GPU-a100", A100, ""), ("MIG-b", f"{A100} MIG 3g.20gb", "3g.20gb"),
        ("MIG-a", f"{A100} MIG 3g.20gb", "3g.20gb")]
USD_PER_GPU_HOUR = 7.0


def _labels(uuid: str, model: str) -> dict[str, str]:
    return {"uuid": uuid, "gpu": "0", "model": model, "host": "n1", "instance": "n1:9400", "job": "agent"}


def _info_label_sets() -> list[dict[str, str]]:
    """What the agent's /metrics holds for the three rows, as /api/v1/series lists it."""
    return [{"__name__": "phasescope_gpu_info", **_labels(u, m), "parent_uuid": "" if u == "GPU-a100" else
             "GPU-a100", "mig_profile": p} for u, m, p in ROWS]


class _SeriesApi:
    """/api/v1/series over fixed label sets: `{__name__=~"a|b"}` and `{__name__="a"}`, as Prometheus."""

    def __init__(self, label_sets: list[dict[str, str]]) -> None:
        self.label_sets = label_sets
        self.clock = StageClock()  # discover times its calls

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        wanted = set(match.split('"')[1].split("|"))
        return [ls for ls in self.label_sets if ls["__name__"] in wanted]


def _hourly_cost(traces: list[Trace], model: PhaseModel) -> tuple[float, float]:
    """(held-idle $ of all rows, held-idle hours of one row)."""
    verdicts = judge_all(
        traces, model, lambda name: Prices(USD_PER_GPU_HOUR, None), held_mem_bytes=256 * 1024**2
    )
    assert all(v.label == HELD_IDLE for v in verdicts)
    hours = [v.seconds[HELD_IDLE] / 3600 for v in verdicts]
    assert hours[0] > 0 and hours == pytest.approx([hours[0]] * len(hours))
    return sum(v.held_idle_cost.time_usd or 0.0 for v in verdicts), hours[0]


def test_agent_mig_instances_are_priced_as_one_gpu(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    idle = fleet_traces["idle"]
    # The grid stays inside the recording: held past its end, readings that never change read as a frozen
    # exporter (fleet/collect.py FROZEN_S), not as an idle GPU.
    start = float(np.ceil(idle.time[0]))
    n = int(idle.time[-1] - start) + 1
    grid = start + np.arange(n)
    series, label_sets = [], _info_label_sets()
    for uuid, model_name, _ in ROWS:
        lab = _labels(uuid, model_name)
        for signal in ("gpu_util", "mem_used", "power"):
            metric = SIGNAL_METRICS[signal].name
            series.append(Series({"__name__": metric, **lab}, grid, np.interp(grid, idle.time, idle[signal])))
            label_sets.append({"__name__": metric, **lab})
    devices = discover(_SeriesApi(label_sets), start, grid[-1])  # type: ignore[arg-type]
    assert [d.key for d in devices] == ["GPU-a100", "MIG-a", "MIG-b"]
    # The physical GPU decides the shard and the batch: its instances are priced together.
    assert all(len(in_shard(devices, Shard(i, 3))) in (0, 3) for i in range(3))
    assert [len(b) for b in _batches(devices, n, 3 * n)] == [3]

    traces = build_traces(devices, series, start, 1.0, n, names.metric_map())
    assert [t.device.parent_uuid for t in traces] == [None, "GPU-a100", "GPU-a100"]
    assert [t.device.extra.get("GPU_I_PROFILE") for t in traces] == [None, "3g.20gb", "3g.20gb"]
    usd, hours = _hourly_cost(traces, model)
    # One physical GPU held idle: $7 per hour in all (was $21: $7 per row).
    assert usd == pytest.approx(hours * USD_PER_GPU_HOUR)


def test_disagreeing_parents_are_not_joined() -> None:
    from phasescope.fleet.collect import gpu_info_from_label_sets

    info = _info_label_sets()
    got = gpu_info_from_label_sets([*info, {**info[1], "parent_uuid": "GPU-other"}])
    assert got == {"MIG-a": ("GPU-a100", "3g.20gb")}  # MIG-b names two parents over the range: left out


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("family", "keys"),
    [
        ("phasescope", ["GPU-a100", "MIG-a", "MIG-b"]),
        ("dcgm", ["GPU-a100", "GPU-a100/gi1", "GPU-a100/gi2"]),  # dcgm-exporter's naming of the instances
    ],
)
def test_mig_backfill_through_the_real_prometheus(
    fleet_traces: dict[str, Trace], model: PhaseModel, tmp_path: Path, family: str, keys: list[str]
) -> None:
    """The rows backfilled into /usr/bin/prometheus in the agent's names (with its phasescope_gpu_info) or
    in dcgm-exporter's, then the fleet's own fetch: one GPU-hour per hour either way."""
    idle = fleet_traces["idle"]
    end = float(np.floor(time.time() / 60) * 60 - 3600)  # an hour ago: whole minutes, safely in the past
    t = idle.time - idle.time[-1] + end
    traces = [Trace(DeviceInfo(u, m, 0, "n1", parent_uuid=None if u == "GPU-a100" else "GPU-a100"),
                    t, idle.columns, idle.meta) for u, m, _ in ROWS]
    backfill(traces, tmp_path, family)
    procs = Procs()
    try:
        url = start_prometheus(
            procs, tmp_path, "global:\n  scrape_interval: 15s\nscrape_configs: []\n", free_port()
        )
        with PromClient(url) as client:
            fetched = fetch_traces(client, start=float(t[0]), end=end, step=1.0)
    finally:
        procs.stop()
    assert sorted((f.device.uuid, f.device.parent_uuid) for f in fetched) == [
        (keys[0], None), (keys[1], "GPU-a100"), (keys[2], "GPU-a100")]
    usd, hours = _hourly_cost(fetched, model)
    assert usd == pytest.approx(hours * USD_PER_GPU_HOUR)
