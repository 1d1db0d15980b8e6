"""MIG facts written and read by the fleet: a device listed as its own parent (a damaged file) is a whole
GPU everywhere, as `kpi.cost.mig_shares` prices it; the agent's info series is asked for MIG instances
only."""

from __future__ import annotations

import io

import numpy as np

from phasescope.fleet.collect import gpu_info
from phasescope.fleet.openmetrics import write_stream
from phasescope.schema import DeviceInfo, Trace

A100 = "NVIDIA A100-SXM4-80GB"


def _traces() -> list[Trace]:
    t = 1.7e9 + np.arange(5.0)
    devs = [DeviceInfo("GPU-a", A100, 0), DeviceInfo("MIG-1", f"{A100} MIG 3g.40gb", 0, parent_uuid="GPU-a"),
            DeviceInfo("GPU-c", A100, 2, parent_uuid="GPU-c")]
    return [Trace(d, t, {"power": np.full(t.size, 100.0)}) for d in devs]


def _lines(family: str) -> list[str]:
    out = io.StringIO()
    write_stream(_traces(), out, family)  # type: ignore[arg-type]
    return out.getvalue().splitlines()


def test_own_parent_is_a_whole_gpu_in_the_backfill() -> None:
    # dcgm family: named as a whole GPU (was GPU_I_ID="1" under its own UUID: the fleet read "GPU-c/gi1").
    power = [ln for ln in _lines("dcgm") if ln.startswith("DCGM_FI_DEV_POWER_USAGE{") and '"GPU-c"' in ln]
    assert power and not any("GPU_I_ID" in ln for ln in power)
    # phasescope family: no info series saying it is its own MIG instance; the real instance keeps its.
    info = [ln for ln in _lines("phasescope") if ln.startswith("phasescope_gpu_info{")]
    assert info and all('uuid="MIG-1"' in ln and 'parent_uuid="GPU-a"' in ln for ln in info)


class _Recorder:
    def __init__(self) -> None:
        self.matches: list[str] = []

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        self.matches.append(match)
        return []


def test_gpu_info_asks_for_mig_instances_only() -> None:
    """A fleet without MIG: one series call whose answer is empty (the agent exports the info for every
    GPU, with empty labels for a whole one), not one label set per GPU in Prometheus."""
    client = _Recorder()
    assert gpu_info(client, 0.0, 60.0) == {}  # type: ignore[arg-type]
    assert client.matches == ['{__name__="phasescope_gpu_info",parent_uuid!=""}']
