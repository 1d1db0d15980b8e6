"""/metrics from the custom collector: fresh values each scrape, clean under `promtool check metrics`."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from prometheus_client import generate_latest

from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.schema import MIB, PHASES, SIGNAL_COLUMN, ProcessSample, TickBatch
from phasescope.serve import collector as collector_module
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.containers import Attribution, ContainerResolver
from phasescope.sources.host import HostSource
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from tests.live_helpers import ticks
from tests.serve.conftest import MIGRATION_RUN, PROMTOOL, feed, promtool_check, samples, system_tool
from tests.sources.fake_procfs import build_tree, resolver

REPO = Path(__file__).resolve().parents[2]
# The join docs/FLEET.md shows: GPUs per namespace and phase, from the agent's series and its pod info.
FLEET_DOC_JOIN = (
    "sum by (namespace, phase) (phasescope_gpu_phase * on (uuid) group_left (namespace, pod, container) "
    "phasescope_gpu_pod_info)"
)




def test_replayed_run_scrapes_clean_and_current(shared_data: Path, model: PhaseModel) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1")
    feed(agent, ticks(traces, stop=120))
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    s = samples(text)
    last = next(ticks(traces, start=119, stop=120))
    for labels, value in s["phasescope_gpu_power_watts"]:
        row = [d.uuid for d in last.devices].index(labels["uuid"])
        assert value == pytest.approx(last.value(labels["uuid"], "power"))
        assert labels["gpu"] == str(last.devices[row].index) and labels["host"] == "node1"
    probs = [(lab["gpu"], lab["phase"]) for lab, _ in s["phasescope_gpu_phase_probability"]]
    assert sorted(probs) == sorted((g, p) for g in ("3", "4") for p in PHASES)
    current = {lab["gpu"]: lab["phase"] for lab, v in s["phasescope_gpu_phase"] if v == 1.0}
    assert current == {"3": "training", "4": "training"}  # by tick 120 the run is on both GPUs
    # Seconds per phase add up to the span metered; idle came before training on GPU 4.
    secs = {lab["phase"]: v for lab, v in s["phasescope_gpu_phase_seconds_total"] if lab["gpu"] == "4"}
    assert secs.get("idle", 0) > 10 and secs["training"] > 10
    assert sum(secs.values()) == pytest.approx(float(last.time - traces[0].time[0]), abs=2.0)
    # The agent was driven by hand, so its sampler is not running: the source is not up.
    assert s["phasescope_source_up"] == [({"source": "replay"}, 0.0)]
    assert s["phasescope_sampler_ticks_total"] == [({}, 0.0)]
    assert s["phasescope_scrape_duration_seconds"][0][1] > 0


def test_training_alarm_gauge_follows_the_onset_alarm(shared_data: Path, model: PhaseModel) -> None:
    # GPUs 3 and 4 of the migration run: training labelled from 91407.932 (labels.csv) on both.
    training_from = 91407.932
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1")
    batches = list(ticks(traces, stop=120))
    assert batches[15].time < training_from < batches[-1].time
    feed(agent, iter(batches[:16]))  # before the start: the alarm is exported and off, with no start time
    before = samples(generate_latest(registry))
    assert sorted(v for _, v in before["phasescope_gpu_training_alarm"]) == [0.0, 0.0]
    assert "phasescope_gpu_training_alarm_start_time_seconds" not in before
    feed(agent, iter(batches[16:]))
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    after = samples(text)
    assert {lab["gpu"]: v for lab, v in after["phasescope_gpu_training_alarm"]} == {"3": 1.0, "4": 1.0}
    starts = after["phasescope_gpu_training_alarm_start_time_seconds"]
    assert len(starts) == 2 and all(training_from <= v <= training_from + 60.0 for _, v in starts)
    assert {lab["uuid"] for lab, _ in starts} == {t.device.uuid for t in traces}
    # Alarm turned off: no alarm series at all (absent, not a made-up 0).
    quiet = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model, alarm=False))
    feed(quiet, iter(batches[:20]))
    names = samples(generate_latest(registry_for(quiet)))
    assert not [n for n in names if "training_alarm" in n] and "phasescope_gpu_phase" in names


def test_values_are_fresh_per_scrape_and_gone_devices_vanish(shared_data: Path, model: PhaseModel) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent)
    batches = list(ticks(traces, stop=20))
    feed(agent, iter(batches[:10]))
    first = samples(generate_latest(registry))["phasescope_gpu_temperature_celsius"]
    feed(agent, iter(batches[10:]))
    second = samples(generate_latest(registry))["phasescope_gpu_temperature_celsius"]
    col = SIGNAL_COLUMN["temperature"]
    assert [v for _, v in second] == [batches[-1].values[i, col] for i in range(2)]
    assert first != second or batches[9].values[:, col].tolist() == batches[-1].values[:, col].tolist()
    # Device 0 drops out: its signal samples go (no stale value, no invented 0); device 1 stays.
    b = batches[-1]
    agent.on_tick(TickBatch(b.time + 1, [b.devices[1]], b.values[1:2]))
    after = samples(generate_latest(registry))
    assert [lab["uuid"] for lab, _ in after["phasescope_gpu_temperature_celsius"]] == [b.devices[1].uuid]
    assert promtool_check(generate_latest(registry)) == ""


def test_nvml_path_exposes_counter_limits_and_model(
    shared_data: Path, fake_nvml: Any, model: PhaseModel
) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    fake = fake_nvml(
        traces, mem_total_bytes=24576 * MIB, power_limit_w=350.0, energy_from_power=True, throttle_reasons=4
    )
    source = NvmlSource()
    agent = Agent(source, 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1")
    for _ in range(5):
        agent.on_tick(source.read())
        fake.advance()
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    s = samples(text)
    energy = s["phasescope_gpu_energy_joules_total"]
    assert len(energy) == 2 and all(v > 0 for _, v in energy)
    assert {v for _, v in s["phasescope_gpu_power_limit_watts"]} == {350.0}
    assert {v for _, v in s["phasescope_gpu_mem_total_bytes"]} == {24576 * MIB}
    assert {v for _, v in s["phasescope_gpu_throttle_reasons"]} == {4.0}
    assert all(lab["model"] for lab, _ in energy)  # the NVML device name
    per_phase = s["phasescope_gpu_phase_energy_joules_total"]
    assert per_phase and all(v >= 0 for _, v in per_phase)
    # NVML's PCI address of each board (the scripted NVML numbers them 0x10 + index) on the info series only.
    info = {lab["gpu"]: lab["pci_bus_id"] for lab, _ in s["phasescope_gpu_info"]}
    assert info == {lab["gpu"]: f"00000000:{0x10 + int(lab['gpu']):02X}:00.0" for lab, _ in energy}
    source.close()


def _with_processes(batches: list[TickBatch], procs: dict[str, list[int]]) -> Iterator[TickBatch]:
    for b in batches:
        yield replace(
            b, processes=[ProcessSample(b.time, pid, uuid) for uuid, pids in procs.items() for pid in pids]
        )


def test_pods_of_gpu_processes_come_as_info_metrics(
    shared_data: Path, model: PhaseModel, tmp_path: Path
) -> None:
    tree = build_tree(tmp_path)
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1", resolver=resolver(tree))
    batches = list(ticks(traces, stop=40))
    a, b = (d.uuid for d in batches[0].devices)
    # GPU a: pod llm-train-0 (pid 101) and a host process (404). GPU b: shared by two pods (202, 101),
    # plus a vanished pid (999) and a plain Docker container without a pod (505).
    feed(agent, _with_processes(batches[:20], {a: [101, 404], b: [202, 101, 999, 505]}))
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    s = samples(text)
    pods = {lab["uuid"]: lab for lab, v in s["phasescope_gpu_pod_info"] if v == 1.0}
    assert set(pods) == {a}  # GPU b's two pods disagree on every label: no joinable series for it
    assert {k: pods[a][k] for k in ("pod", "namespace", "container", "host")} == {
        "pod": "llm-train-0",
        "namespace": "research",
        "container": "trainer",
        "host": "node1",
    }
    procs = sorted((lab["uuid"], lab["pid"], lab["pod"]) for lab, _ in s["phasescope_gpu_process_info"])
    assert procs == sorted([(a, "101", "llm-train-0"), (b, "101", "llm-train-0"), (b, "202", "vllm-7d9f")])
    # Every other series keeps its fixed label set: a pod coming or going starts no new series there.
    for name in ("phasescope_gpu_phase_probability", "phasescope_gpu_power_watts"):
        assert all("pod" not in lab for lab, _ in s[name]), name
    # The pod leaves GPU a: its info series goes with it (no stale label).
    feed(agent, _with_processes(batches[20:], {b: [202, 303]}))
    s = samples(generate_latest(registry))
    assert [(lab["uuid"], lab["pod"]) for lab, _ in s["phasescope_gpu_pod_info"]] == [(b, "vllm-7d9f")]


def test_pod_join_in_promql_on_a_real_scrape(shared_data: Path, model: PhaseModel, tmp_path: Path) -> None:
    """The join docs/FLEET.md shows, run by promtool's PromQL engine on series taken from a real scrape."""
    tree = build_tree(tmp_path)
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1", resolver=resolver(tree))
    batches = list(ticks(traces, stop=60))
    a, b = (d.uuid for d in batches[0].devices)
    feed(agent, _with_processes(batches, {a: [101], b: [202, 303]}))
    s = samples(generate_latest(registry))
    series = [
        {
            "series": name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "}",
            "values": " ".join([repr(v)] * 3),
        }
        for name in ("phasescope_gpu_phase", "phasescope_gpu_pod_info")
        for lab, v in s[name]
    ]
    current = {lab["uuid"]: lab["phase"] for lab, v in s["phasescope_gpu_phase"] if v == 1.0}
    pods = {a: ("research", "llm-train-0"), b: ("serving", "vllm-7d9f")}
    expected: dict[tuple[str, str], float] = {}
    for uuid, (ns, _pod) in pods.items():
        for lab, _ in s["phasescope_gpu_phase"]:
            if lab["uuid"] == uuid:
                key = (ns, lab["phase"])
                expected[key] = expected.get(key, 0.0) + (1.0 if current[uuid] == lab["phase"] else 0.0)
    expr = FLEET_DOC_JOIN
    assert expr in (REPO / "docs/FLEET.md").read_text()
    test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "1m",
                        "exp_samples": [
                            {"labels": f'{{namespace="{ns}",phase="{ph}"}}', "value": v}
                            for (ns, ph), v in sorted(expected.items())
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "join_test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [system_tool(PROMTOOL), "test", "rules", "join_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_host_source_is_exported_as_host_not_gpu(model: PhaseModel) -> None:
    source = HostSource(find_torch=False)
    agent = Agent(source, 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1")
    for _ in range(3):
        agent.on_tick(source.read())
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    s = samples(text)
    gpu_series = [n for n in s if n.startswith("phasescope_gpu_")]
    assert gpu_series == []  # a fleet counting phasescope_gpu_* series counts no CPU
    (cpu,) = s["phasescope_host_cpu_util_ratio"]
    assert 0.0 <= cpu[1] <= 1.0 and cpu[0]["host"] == socket.gethostname()
    (total,) = s["phasescope_host_memory_total_bytes"]
    assert total[1] == psutil.virtual_memory().total
    assert s["phasescope_host_memory_used_bytes"][0][1] <= total[1]
    source.close()


def test_missing_host_reading_is_an_absent_sample_not_nan(model: PhaseModel) -> None:
    import numpy as np

    from phasescope.schema import DeviceInfo, Trace
    from phasescope.sources.host import HOST_KIND

    host = DeviceInfo("host:n1", "cpu", host="n1", extra={"kind": HOST_KIND})
    trace = Trace(host, np.arange(3.0), {"gpu_util": np.full(3, np.nan), "mem_total": np.full(3, 64.0 * MIB)})
    agent = Agent(ReplaySource([trace]), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="n1")
    feed(agent, ticks([trace]))
    s = samples(generate_latest(registry))
    assert s["phasescope_host_memory_total_bytes"][0][1] == 64.0 * MIB
    assert "phasescope_host_cpu_util_ratio" not in s


class _CountingResolver(ContainerResolver):
    def __init__(self, tree: dict[str, Path]) -> None:
        super().__init__(tree["proc"], tree["logs"], (tree["containerd"],))
        self.calls = 0

    def attribute(self, pid: int) -> Attribution | None:
        self.calls += 1
        return super().attribute(pid)


def test_scrapes_read_proc_only_when_the_processes_change(
    shared_data: Path, model: PhaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    counting = _CountingResolver(build_tree(tmp_path))
    registry = registry_for(agent, resolver=counting)
    batches = list(ticks(traces, stop=6))
    a, b = (d.uuid for d in batches[0].devices)
    feed(agent, _with_processes(batches[:3], {a: [101], b: [202]}))
    for _ in range(5):
        generate_latest(registry)
    assert counting.calls == 2  # one lookup per process, not per scrape
    feed(agent, _with_processes(batches[3:4], {a: [101], b: [202, 303]}))
    generate_latest(registry)
    assert counting.calls == 5  # a new process: all looked up afresh
    monkeypatch.setattr(collector_module, "ATTRIBUTION_TTL_S", 0.0)  # expired: a reused PID is seen again
    generate_latest(registry)
    assert counting.calls == 8


def test_a_gpu_without_power_has_phase_time_but_no_made_up_zero_energy(
    shared_data: Path, model: PhaseModel
) -> None:
    """No power and no energy counter: phasescope_gpu_phase_seconds_total counts, and the per-phase energy
    series is absent (a sum over the fleet must not read 0 J for it), while a powered GPU keeps its series."""
    from phasescope.schema import Trace

    powered = read(shared_data / MIGRATION_RUN)[0]
    blind = powered.without("power", "energy")
    blind = Trace(replace(blind.device, uuid="GPU-no-power-sensor"), blind.time, blind.columns, blind.meta)
    agent = Agent(ReplaySource([powered, blind]), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="n1")
    feed(agent, ticks([powered, blind], stop=30))
    text = generate_latest(registry)
    s = samples(text)
    by_uuid = {lab["uuid"] for lab, _ in s["phasescope_gpu_phase_seconds_total"]}
    assert by_uuid == {powered.device.uuid, "GPU-no-power-sensor"}
    energy = s["phasescope_gpu_phase_energy_joules_total"]
    assert {lab["uuid"] for lab, _ in energy} == {powered.device.uuid}
    assert all(v > 0 for _, v in energy)
    assert promtool_check(text) == ""


def test_idle_held_gauge_flags_the_pod_holding_its_model(shared_data: Path, model: PhaseModel) -> None:
    """Real production pods (1 sample/min): one holds 17 GiB of Stable Diffusion weights at 0% for 45 minutes,
    the other serves bursts. `phasescope_gpu_idle_held` is 1 for the first, 0 for the second, per device,
    as the dashboard's "idle but held" (the same `LiveState.idle_held`)."""
    traces = read(shared_data / "alibaba-gentd26" / "pod_gpu_duty_cycle_anon.csv")
    pods = [next(t for t in traces if t.device.uuid.startswith(p))
            for p in ("alibaba-gentd26:673d", "alibaba-gentd26:6dcc")]
    agent = Agent(ReplaySource(pods), 60.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1")
    feed(agent, ticks(pods, stop=45))
    text = generate_latest(registry)
    held = {lab["uuid"]: v for lab, v in samples(text)["phasescope_gpu_idle_held"]}
    assert held == {pods[0].device.uuid: 1.0, pods[1].device.uuid: 0.0}
    assert agent.snapshot()["idle_held"] == [pods[0].device.uuid]
    assert promtool_check(text) == ""


def test_gpu_info_names_the_pci_bus_and_the_node_once_per_gpu(
    shared_data: Path, model: PhaseModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pci_bus_id` and `node` are on the one info series per GPU, not on every series (prom/names.py):
    the node from the downward API's NODE_NAME, else the host label."""
    traces = read(shared_data / MIGRATION_RUN)
    bus = {t.device.uuid: f"00000000:{i + 7:02X}:00.0" for i, t in enumerate(traces)}
    traces = [
        type(t)(replace(t.device, extra={**t.device.extra, "pci_bus_id": bus[t.device.uuid]}), t.time,
                t.columns, t.meta)
        for t in traces
    ]
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="pod-abc12")
    feed(agent, ticks(traces, stop=5))
    monkeypatch.delenv("NODE_NAME", raising=False)
    info = samples(generate_latest(registry))["phasescope_gpu_info"]
    assert {(lab["uuid"], lab["pci_bus_id"], lab["node"]) for lab, _ in info} == {
        (u, b, "pod-abc12") for u, b in bus.items()
    }
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    s = samples(text)
    assert {lab["node"] for lab, _ in s["phasescope_gpu_info"]} == {"gpu-node-7"}
    assert len(s["phasescope_gpu_info"]) == len(bus)
    # Every other series keeps the fixed device labels only.
    assert all("node" not in lab and "pci_bus_id" not in lab for lab, _ in s["phasescope_gpu_power_watts"])
