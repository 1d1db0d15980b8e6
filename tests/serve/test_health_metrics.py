"""GPU health on /metrics and /api/state: an agent over NvmlSource, NVML served by the scripted fake
replaying a real RTX 3090 run, with one GPU given datacenter health counters and the other left as a
consumer GPU (no ECC, no remapper, no memory sensor): its missing counters have no series and no JSON key,
never 0."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.prom import names as mn
from phasescope.prom.exposition import TextWriter
from phasescope.schema import MIB
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from tests.serve.conftest import MIGRATION_RUN, promtool_check, samples

ECC = {("corrected", "volatile"): 3, ("corrected", "aggregate"): 41,
       ("uncorrected", "volatile"): 1, ("uncorrected", "aggregate"): 2}




def health_agent(shared_data: Path, fake_nvml: Any, model: PhaseModel) -> tuple[Any, NvmlSource, Agent]:
    """GPU 1 with every health counter, GPU 0 with PCIe replays only (a consumer GPU); 3 ticks in."""
    fake = fake_nvml(read(shared_data / MIGRATION_RUN), mem_total_bytes=24576 * MIB)
    fake.set_health(1, ecc=ECC, remapped_rows=(5, 1, 1, 0), pcie_replays=7, mem_temp_c=61)
    fake.set_health(0, pcie_replays=12)
    source = NvmlSource(health_interval_s=0.0)
    agent = Agent(source, 1.0, classifier=LiveClassifier(model))
    for _ in range(3):
        agent.on_tick(source.read())
        fake.advance()
    return fake, source, agent


def test_health_series_only_where_the_gpu_has_the_counter(
    shared_data: Path, fake_nvml: Any, model: PhaseModel
) -> None:
    fake, source, agent = health_agent(shared_data, fake_nvml, model)
    consumer, dc = (d.uuid for d in source.devices())
    registry = registry_for(agent, host="node1")
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    served = TextWriter().render(registry.collect())  # what /metrics serves

    def health_lines(body: bytes) -> list[bytes]:
        names = tuple(m.family.encode() for m in mn.HEALTH_METRICS)
        bare = (re.sub(rb"^# (HELP|TYPE) ", b"", line) for line in body.splitlines())
        return [line for line in bare if line.startswith(names)]

    assert health_lines(served) == health_lines(text) and len(health_lines(text)) > 16
    s = samples(text)

    def by_uuid(name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for labels, v in s.get(name, []):
            out.setdefault(labels["uuid"], []).append((labels, v))
        return out

    ecc = by_uuid(mn.GPU_ECC_ERRORS.name)
    assert list(ecc) == [dc]  # the consumer GPU: no series at all, not 0
    assert {(lab["type"], lab["scope"]): v for lab, v in ecc[dc]} == {k: float(v) for k, v in ECC.items()}
    rows = by_uuid(mn.GPU_REMAPPED_ROWS.name)
    assert list(rows) == [dc] and {lab["cause"]: v for lab, v in rows[dc]} == {
        "correctable": 5.0, "uncorrectable": 1.0}
    for metric, want in ((mn.GPU_ROW_REMAP_PENDING, 1.0), (mn.GPU_ROW_REMAP_FAILURE, 0.0),
                         (mn.GPU_MEM_TEMPERATURE, 61.0)):
        got = by_uuid(metric.name)
        assert list(got) == [dc] and got[dc][0][1] == want, metric.name
    replays = {u: v[0][1] for u, v in by_uuid(mn.GPU_PCIE_REPLAYS.name).items()}
    assert replays == {consumer: 12.0, dc: 7.0}
    # XID events are watched on both: a count of 0 and no XID yet (0, as dcgm-exporter's field).
    assert {u: v[0][1] for u, v in by_uuid(mn.GPU_XID_ERRORS.name).items()} == {consumer: 0.0, dc: 0.0}
    assert {u: v[0][1] for u, v in by_uuid(mn.GPU_LAST_XID.name).items()} == {consumer: 0.0, dc: 0.0}
    labels = by_uuid(mn.GPU_PCIE_REPLAYS.name)[dc][0][0]
    assert set(labels) == set(mn.DEVICE_LABELS) and labels["host"]

    fake.xid(0, 79)
    agent.on_tick(source.read())
    s = samples(generate_latest(registry))
    assert {lab["uuid"]: v for lab, v in s[mn.GPU_XID_ERRORS.name]} == {consumer: 1.0, dc: 0.0}
    assert {lab["uuid"]: v for lab, v in s[mn.GPU_LAST_XID.name]} == {consumer: 79.0, dc: 0.0}
    fake.xid(0, 45)  # the application's channel torn down after it: the last XID, not a critical one
    agent.on_tick(source.read())
    s = samples(generate_latest(registry))
    assert {lab["uuid"]: v for lab, v in s[mn.GPU_LAST_XID.name]} == {consumer: 45.0, dc: 0.0}
    assert {lab["uuid"]: v for lab, v in s[mn.GPU_CRITICAL_XID_ERRORS.name]} == {consumer: 1.0, dc: 0.0}
    assert {lab["uuid"]: v for lab, v in s[mn.GPU_LAST_CRITICAL_XID.name]} == {consumer: 79.0, dc: 0.0}
    assert any("XID 79 (GPU has fallen off the bus)" in e for e in agent.state.events())  # as `top` shows it
    source.close()


def test_no_health_no_series(shared_data: Path, fake_nvml: Any, model: PhaseModel) -> None:
    """XID events not supported and no counter: not one health series (a replay or host source likewise)."""
    import pynvml

    fake = fake_nvml(read(shared_data / MIGRATION_RUN), mem_total_bytes=24576 * MIB)
    fake.fail("nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)
    source = NvmlSource(health_interval_s=0.0)
    agent = Agent(source, 1.0, classifier=LiveClassifier(model))
    agent.on_tick(source.read())
    text = generate_latest(registry_for(agent, host="node1")).decode()
    assert not [m.name for m in mn.HEALTH_METRICS if m.name in text]
    assert all(d["health"] == {"time": d["health"]["time"]} for d in agent.snapshot()["devices"])
    source.close()


def test_api_state_carries_health_per_device(shared_data: Path, fake_nvml: Any, model: PhaseModel) -> None:
    fake, source, agent = health_agent(shared_data, fake_nvml, model)
    fake.xid(1, 48)
    agent.on_tick(source.read())
    doc = json.loads(json.dumps(agent.snapshot(), allow_nan=False))  # JSON-safe, as /api/state sends it
    consumer, dc = doc["devices"]
    assert dc["health"]["ecc_errors"] == {"corrected": {"volatile": 3, "aggregate": 41},
                                          "uncorrected": {"volatile": 1, "aggregate": 2}}
    assert dc["health"]["remapped_rows"] == {"correctable": 5, "uncorrectable": 1}
    assert (dc["health"]["row_remap_pending"], dc["health"]["row_remap_failure"]) == (True, False)
    assert (dc["health"]["pcie_replays"], dc["health"]["mem_temperature_c"]) == (7, 61.0)
    assert (dc["health"]["xid_errors"], dc["health"]["last_xid"]) == (1, 48)
    assert dc["health"]["last_xid_time"] == pytest.approx(doc["time"], abs=1.0)
    # The consumer GPU: only what it has; no key for the rest.
    assert set(consumer["health"]) == {"time", "pcie_replays", "xid_errors", "last_xid",
                                       "critical_xid_errors", "last_critical_xid"}
    assert (dc["health"]["critical_xid_errors"], dc["health"]["last_critical_xid"]) == (1, 48)
    source.close()


def test_serve_source_auto_serves_health(shared_data: Path, fake_nvml: Any, model: PhaseModel) -> None:
    """`serve --source auto` opens NVML wrapped in the host source (CombinedSource, for process CPU/RSS),
    which rebuilt each TickBatch without its health: /metrics had no health series at all there."""
    from phasescope.cli.top import open_watched

    fake = fake_nvml(read(shared_data / MIGRATION_RUN), mem_total_bytes=24576 * MIB)
    fake.set_health(1, ecc=ECC, pcie_replays=7)
    said: list[str] = []
    source = open_watched("auto", said.append, host_row=True)  # what cli/serve.py opens
    assert source.name == "nvml+host", said
    agent = Agent(source, 1.0, classifier=LiveClassifier(model))
    fake.xid(1, 79)
    agent.on_tick(source.read())
    s = samples(generate_latest(registry_for(agent, host="node1")))
    dc = source.devices()[1].uuid
    assert [v for lab, v in s[mn.GPU_PCIE_REPLAYS.name] if lab["uuid"] == dc] == [7.0]
    assert [v for lab, v in s[mn.GPU_LAST_CRITICAL_XID.name] if lab["uuid"] == dc] == [79.0]
    source.close()
