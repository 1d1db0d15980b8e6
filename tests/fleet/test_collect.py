"""Series -> Traces: both metric families on one grid, units, precedence, batching."""

from __future__ import annotations

import numpy as np

from phasescope.fleet import names
from phasescope.fleet.collect import _batches, _Device, build_traces, fetch_limits, in_shard
from phasescope.fleet.shard import Shard
from phasescope.prom.client import Series
from phasescope.schema import MIB, Trace


def test_both_families_land_on_one_grid(fleet_traces: dict[str, Trace]) -> None:
    t = fleet_traces["training"]
    start, step, n = float(np.floor(t.time[0])), 1.0, 200
    grid = start + np.arange(n)
    power = np.interp(grid, t.time, t["power"])
    mem_mib = np.interp(grid, t.time, t["mem_used"]) / MIB
    util = np.interp(grid, t.time, t["gpu_util"])
    lab = {"uuid": "GPU-1", "gpu": "0", "model": "RTX 3090", "host": "n1"}
    dcgm = {
        "UUID": "GPU-1",
        "gpu": "0",
        "modelName": "RTX 3090",
        "Hostname": "n1",
        "pod": "p",
        "namespace": "ns",
    }
    series = [
        # dcgm's utilisation (percent) and the agent's (ratio) for the same device: the agent's wins.
        Series({"__name__": "DCGM_FI_DEV_GPU_UTIL", **dcgm}, grid, util * 90),  # 90% of the agent's
        Series({"__name__": "phasescope_gpu_util_ratio", **lab}, grid[:150], util[:150]),
        Series({"__name__": "DCGM_FI_DEV_FB_USED", **dcgm}, grid, mem_mib),
        Series({"__name__": "phasescope_gpu_power_watts", **lab}, grid[10:], power[10:]),
    ]
    dev = _Device("GPU-1", "uuid", {**lab, **dcgm}, {s.labels["__name__"] for s in series})
    mmap = names.metric_map()
    (trace,) = build_traces([dev], series, start, step, n, mmap, {"GPU-1": {"power_limit": 350.0}})
    np.testing.assert_allclose(trace["mem_used"], mem_mib * MIB)
    np.testing.assert_allclose(trace["gpu_util"][:150], util[:150])  # agent's series first
    np.testing.assert_allclose(trace["gpu_util"][150:], util[150:] * 0.9)  # dcgm fills the rest, in ratio
    assert np.isnan(trace["power"][:10]).all() and np.allclose(trace["power"][10:], power[10:])
    assert (trace["power_limit"] == 350.0).all()
    assert trace.device.host == "n1" and trace.device.index == 0
    assert trace.device.extra["pod"] == "p" and trace.device.extra["namespace"] == "ns"


def test_grid_points_without_any_sample_are_dropped() -> None:
    grid = 1000.0 + np.arange(10)
    s = Series({"__name__": "phasescope_gpu_power_watts", "uuid": "GPU-2"}, grid[[0, 1, 5]], np.ones(3))
    dev = _Device("GPU-2", "uuid", {"uuid": "GPU-2"}, {"phasescope_gpu_power_watts"})
    (trace,) = build_traces([dev], [s], 1000.0, 1.0, 10, names.metric_map())
    np.testing.assert_array_equal(trace.time, grid[[0, 1, 5]])


def test_mig_instances_are_devices_of_their_own() -> None:
    assert names.device_key({"UUID": "GPU-9", "GPU_I_ID": "3"}) == "GPU-9/gi3"
    assert names.device_key({"uuid": "GPU-9"}) == "GPU-9"
    assert names.device_key({"instance": "x"}) is None


def test_batches_stay_under_the_sample_budget() -> None:
    devs = [
        _Device(f"GPU-{i}", "uuid" if i % 3 else "UUID", {}, {f"m{j}" for j in range(9)}) for i in range(50)
    ]
    batches = list(_batches(devs, 3600, 100_000))
    assert sorted(d.key for b in batches for d in b) == sorted(d.key for d in devs)
    for b in batches:
        assert len({d.label_name for d in b}) == 1
        assert len(b) == 1 or sum(len(d.metrics) for d in b) * 3600 <= 100_000


def test_a_mig_gpus_instances_stay_in_one_batch_and_one_shard() -> None:
    """Their price shares are worked out together (kpi.cost.mig_prices), so neither a batch boundary nor a
    shard may split a physical GPU's instances."""
    devs = [_Device(f"GPU-{i:02d}/gi{j}", "UUID", {}, {"m"}) for i in range(40) for j in (1, 2, 3)]
    batches = list(_batches(devs, 3600, 2 * 3600))  # the budget holds two instances' samples
    assert sorted(d.key for b in batches for d in b) == sorted(d.key for d in devs)
    assert all(len({d.gpu for d in b}) == 1 and len(b) == 3 for b in batches)
    owned = [in_shard(devs, Shard(i, 4)) for i in range(4)]
    assert sorted(d.key for o in owned for d in o) == sorted(d.key for d in devs)
    for o in owned:
        gpus = {d.gpu for d in o}
        assert all(sum(d.gpu == g for d in o) == 3 for g in gpus)
    assert in_shard(devs, None) is devs


def test_agent_names_come_from_the_exporter() -> None:
    from phasescope.prom.names import SIGNAL_METRICS

    mmap = names.metric_map()
    assert mmap.metrics[SIGNAL_METRICS["power"].name] == ("power", 1.0)
    assert mmap.metrics["DCGM_FI_DEV_FB_USED"] == ("mem_used", MIB)
    assert mmap.metrics["DCGM_FI_PROF_PCIE_TX_BYTES"] == ("pcie_tx", 1.0)


def test_an_older_agents_utilisation_name_is_still_read() -> None:
    """Agents before the rename wrote `phasescope_gpu_gpu_util_ratio`; a Prometheus keeps those series for
    weeks, so a range that spans the upgrade has the old name first and the new one after."""
    grid = 1000.0 + np.arange(10)
    util = np.linspace(0.1, 0.9, 10)  # every sample differs: none is dropped as a repeat
    lab = {"uuid": "GPU-3"}
    series = [
        Series({"__name__": "phasescope_gpu_gpu_util_ratio", **lab}, grid[:5], util[:5]),
        Series({"__name__": "phasescope_gpu_util_ratio", **lab}, grid[5:], util[5:]),
    ]
    mmap = names.metric_map()
    assert mmap.metrics["phasescope_gpu_gpu_util_ratio"] == ("gpu_util", 1.0)
    assert "phasescope_gpu_gpu_util_ratio" in mmap.name_regex().split("|")
    dev = _Device("GPU-3", "uuid", lab, {s.labels["__name__"] for s in series})
    (trace,) = build_traces([dev], series, 1000.0, 1.0, 10, mmap)
    np.testing.assert_allclose(trace["gpu_util"], util)


class _LimitsClient:
    """Answers `last_over_time(<metric>[...])` with dcgm-exporter's figures, in its units (MiB, W)."""

    def query(self, query: str, time: float) -> list[tuple[dict[str, str], float]]:
        answers = {"DCGM_FI_DEV_FB_TOTAL": 24576.0, "DCGM_FI_DEV_POWER_MGMT_LIMIT": 350.0}
        return [({"UUID": "GPU-1"}, v) for m, v in answers.items() if f"({m}[" in query]


def test_limits_from_dcgm_come_in_base_units() -> None:
    dev = _Device("GPU-1", "UUID", {"UUID": "GPU-1"}, set())
    limits = fetch_limits(_LimitsClient(), [dev], end=1000.0, range_s=600.0)  # type: ignore[arg-type]
    assert limits == {"GPU-1": {"mem_total": 24576.0 * MIB, "power_limit": 350.0}}


def test_workload_matchers_are_split_from_the_selector() -> None:
    from phasescope.fleet.collect import _workload_matches, split_selector

    assert split_selector("") == ([], "")
    assert split_selector('{namespace="ml", Hostname=~"a.*"}') == (
        [("namespace", "=", "ml")], 'Hostname=~"a.*"')
    assert split_selector('pod=~"x\\"y.*",container!="c"') == (
        [("pod", "=~", 'x"y.*'), ("container", "!=", "c")], "")
    assert split_selector('Hostname="n1"') == ([], 'Hostname="n1"')
    assert _workload_matches({"namespace": "ml", "pod": "p-1"},
                             [("namespace", "=", "ml"), ("pod", "=~", "p-.*")])
    assert not _workload_matches({"namespace": "ml"}, [("namespace", "!=", "ml")])
    assert _workload_matches({}, [("namespace", "!~", "kube-.*")])  # no workload: no namespace to exclude
