"""Telemetry-only KPIs on `/metrics` (read back with prometheus_client's parser) and in `/api/state`, from
real shared traces driven through the serve agent's tick loop."""

from __future__ import annotations

import json
import math
from pathlib import Path

from prometheus_client import generate_latest
from starlette.testclient import TestClient

from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.prom import names as mn
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.views.display import MISSING
from tests.live.test_telemetry_kpis import SERVING_RUN
from tests.live_helpers import TRAINING_RUN, ticks
from tests.serve.conftest import feed, promtool_check, samples

STEP = mn.TELEMETRY_KPI_METRICS["step_period_s"].name
STALL = mn.TELEMETRY_KPI_METRICS["stall_fraction"].name
BUSY = mn.TELEMETRY_KPI_METRICS["busy_fraction"].name
BURSTS = mn.TELEMETRY_KPI_METRICS["burst_rate_per_s"].name


def _agent(path: Path, model: PhaseModel, n: int) -> Agent:
    traces = read(path)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    feed(agent, ticks(traces, stop=n))
    return agent


def test_training_kpis_on_metrics_and_api_state(shared_data: Path, model: PhaseModel) -> None:
    agent = _agent(shared_data / TRAINING_RUN, model, 450)
    text = generate_latest(registry_for(agent, host="node1"))
    assert promtool_check(text) == ""
    s = samples(text)
    state = {d["uuid"]: d for d in agent.snapshot()["devices"]}
    train = next(u for u, d in state.items() if d["phase"]["phase"] == "training")
    idle = next(u for u, d in state.items() if d["phase"]["phase"] == "idle")
    doc = state[train]["telemetry_kpis"]
    # /metrics carries what /api/state says, for the training GPU only; the idle GPU has no sample at all
    # (no made-up 0), and no inference gauge is exported for a training GPU.
    assert [(lab["uuid"], v) for lab, v in s[STEP]] == [(train, doc["step_period_s"]["value"])]
    assert [(lab["uuid"], v) for lab, v in s[STALL]] == [(train, doc["stall_fraction"]["value"])]
    conf = s[mn.STEP_PERIOD_CONFIDENCE.name]
    assert [(lab["uuid"], v) for lab, v in conf] == [(train, doc["step_period_s"]["confidence"])]
    assert BUSY not in s and BURSTS not in s
    assert all(math.isfinite(v) for lab, v in s[STEP] + s[STALL])
    # /api/state: the figures as `classify --json`'s `kpis`, the line `top` shows and each figure's method.
    assert doc["phase"] == "training" and doc["step_period_s"]["unit"] == "s"
    assert state[train]["telemetry_kpis_text"].startswith("step ")
    assert "stall" in state[train]["telemetry_kpis_text"]
    assert "autocorrelation" in state[train]["telemetry_kpis_notes"]["step period"]
    assert state[idle]["telemetry_kpis_text"] == MISSING and state[idle]["telemetry_kpis_notes"] == {}


def test_inference_kpis_on_metrics(shared_data: Path, model: PhaseModel) -> None:
    agent = _agent(shared_data / SERVING_RUN, model, 440)
    s = samples(generate_latest(registry_for(agent)))
    (dev,) = agent.snapshot()["devices"]
    assert dev["phase"]["phase"] == "inference"
    doc = dev["telemetry_kpis"]
    assert [v for _, v in s[BUSY]] == [doc["busy_fraction"]["value"]]
    assert [v for _, v in s[BURSTS]] == [doc["burst_rate_per_s"]["value"]]
    saturated = s[mn.TELEMETRY_KPI_METRICS["saturated"].name]
    assert [v for _, v in saturated] == [1.0 if doc["saturated"]["value"] else 0.0]
    assert STEP not in s and STALL not in s
    assert dev["telemetry_kpis_text"].startswith("busy ") and "bursts/min" in dev["telemetry_kpis_text"]


def test_api_state_serves_the_kpis_as_json(shared_data: Path, model: PhaseModel) -> None:
    """The web app's /api/state body is strict JSON (no NaN) with the telemetry KPIs of every device."""
    from phasescope.serve.app import build_app

    agent = _agent(shared_data / TRAINING_RUN, model, 120)
    with TestClient(build_app(agent)) as client:
        body = client.get("/api/state").text
    doc = json.loads(body, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    for dev in doc["devices"]:
        assert {"telemetry_kpis", "telemetry_kpis_text", "telemetry_kpis_notes"} <= dev.keys()
        assert dev["telemetry_kpis"]["phase"] == dev["phase"]["phase"]
