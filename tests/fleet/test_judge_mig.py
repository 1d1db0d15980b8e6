"""Held-idle cost of a MIG GPU: its instances pay their share of the physical GPU's price (kpi/cost.py
`mig_prices`, as `cost` does), so a GPU held idle costs one GPU-hour per hour, not one per instance."""

from __future__ import annotations

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel
from phasescope.fleet import names
from phasescope.fleet.collect import _Device, build_traces
from phasescope.fleet.judge import HELD_IDLE, judge_all
from phasescope.kpi.cost import Prices
from phasescope.prom.client import Series
from phasescope.schema import MIB, Trace


def _mig_traces(idle: Trace) -> list[Trace]:
    """dcgm-exporter in MIG mode: one A100's 3g and 4g instances, each replaying a real idle GPU's series."""
    # The grid stays inside the recording: held past its end, readings that never change read as a frozen
    # exporter (fleet/collect.py FROZEN_S), not as an idle GPU.
    start = float(np.ceil(idle.time[0]))
    n = int(idle.time[-1] - start) + 1
    grid = start + np.arange(n)
    util = np.interp(grid, idle.time, idle["gpu_util"]) * 100
    mem_mib = np.interp(grid, idle.time, idle["mem_used"]) / MIB
    power = np.interp(grid, idle.time, idle["power"])
    devices, series = [], []
    for gi, profile in (("1", "3g.20gb"), ("2", "4g.20gb")):
        lab = {"UUID": "GPU-a100", "gpu": "0", "modelName": "NVIDIA A100-SXM4-40GB", "Hostname": "n1",
               "GPU_I_ID": gi, "GPU_I_PROFILE": profile}
        for metric, values in (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_FB_USED", mem_mib),
                               ("DCGM_FI_DEV_POWER_USAGE", power)):
            series.append(Series({"__name__": metric, **lab}, grid, values))
        key = names.device_key(lab)
        assert key is not None
        devices.append(_Device(key, "UUID", lab, {s.labels["__name__"] for s in series[-3:]}))
    return build_traces(devices, series, start, 1.0, n, names.metric_map())


def test_held_idle_mig_instances_pay_their_slices_of_one_gpu(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    traces = _mig_traces(fleet_traces["idle"])
    assert [t.device.parent_uuid for t in traces] == ["GPU-a100", "GPU-a100"]
    verdicts = judge_all(traces, model, lambda name: Prices(7.0, 0.1), held_mem_bytes=256 * 1024**2)
    assert all(v.label == HELD_IDLE for v in verdicts)
    hours = [v.seconds[HELD_IDLE] / 3600 for v in verdicts]
    assert hours[0] == pytest.approx(hours[1]) and hours[0] > 0
    # 3g and 4g of the A100's 7 slices: $3 and $4 of a $7 GPU-hour (was $7 each).
    assert [v.held_idle_cost.time_usd for v in verdicts] == pytest.approx([hours[0] * 3.0, hours[0] * 4.0])
    # Each instance repeats the board's power: the board energy is priced once, split by the same shares.
    board_kwh = verdicts[0].held_idle_joules / 3.6e6
    assert verdicts[1].held_idle_joules == pytest.approx(verdicts[0].held_idle_joules)
    assert sum(v.held_idle_cost.energy_usd or 0.0 for v in verdicts) == pytest.approx(board_kwh * 0.1)
    doc = verdicts[0].to_dict()
    assert "3 of its 7 compute slices" in doc["price_note"]
