"""/metrics from the custom collector: fresh values each scrape, clean under `promtool check metrics`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from phasescope.classify.model import PhaseModel
from phasescope.live_classify import LiveClassifier
from phasescope.schema import MIB, PHASES
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.base import SIGNAL_COLUMN, TickBatch
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from tests.live_helpers import ticks
from tests.serve.conftest import MIGRATION_RUN, feed, promtool_check


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


def _samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_replayed_run_scrapes_clean_and_current(shared_data: Path, model: PhaseModel) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1")
    feed(agent, ticks(traces, stop=120))
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    s = _samples(text)
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


def test_values_are_fresh_per_scrape_and_gone_devices_vanish(shared_data: Path, model: PhaseModel) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent)
    batches = list(ticks(traces, stop=20))
    feed(agent, iter(batches[:10]))
    first = _samples(generate_latest(registry))["phasescope_gpu_temperature_celsius"]
    feed(agent, iter(batches[10:]))
    second = _samples(generate_latest(registry))["phasescope_gpu_temperature_celsius"]
    col = SIGNAL_COLUMN["temperature"]
    assert [v for _, v in second] == [batches[-1].values[i, col] for i in range(2)]
    assert first != second or batches[9].values[:, col].tolist() == batches[-1].values[:, col].tolist()
    # Device 0 drops out: its signal samples go (no stale value, no invented 0); device 1 stays.
    b = batches[-1]
    agent.on_tick(TickBatch(b.time + 1, [b.devices[1]], b.values[1:2]))
    after = _samples(generate_latest(registry))
    assert [lab["uuid"] for lab, _ in after["phasescope_gpu_temperature_celsius"]] == [b.devices[1].uuid]
    assert promtool_check(generate_latest(registry)) == ""


def test_nvml_path_exposes_counter_limits_and_model(
    shared_data: Path, fake_nvml: Any, model: PhaseModel
) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    fake = fake_nvml(traces, mem_total_bytes=24576 * MIB, power_limit_w=350.0, energy_from_power=True,
                     throttle_reasons=4)
    source = NvmlSource()
    agent = Agent(source, 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1")
    for _ in range(5):
        agent.on_tick(source.read())
        fake.advance()
    text = generate_latest(registry)
    assert promtool_check(text) == ""
    s = _samples(text)
    energy = s["phasescope_gpu_energy_joules_total"]
    assert len(energy) == 2 and all(v > 0 for _, v in energy)
    assert {v for _, v in s["phasescope_gpu_power_limit_watts"]} == {350.0}
    assert {v for _, v in s["phasescope_gpu_mem_total_bytes"]} == {24576 * MIB}
    assert {v for _, v in s["phasescope_gpu_throttle_reasons"]} == {4.0}
    assert all(lab["model"] for lab, _ in energy)  # the NVML device name
    per_phase = s["phasescope_gpu_phase_energy_joules_total"]
    assert per_phase and all(v >= 0 for _, v in per_phase)
    source.close()
