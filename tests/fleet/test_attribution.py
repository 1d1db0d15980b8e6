"""Pod attribution from the agent's info metric into the fleet table: scrape -> /api/v1/series -> summary."""

from __future__ import annotations

import io
import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tests.fleet.harness import PROMTOOL, Procs, free_port, need_tool, start_prometheus
from tests.live_helpers import ticks
from tests.sources.fake_procfs import build_tree, resolver

from phasescope.classify.model import PhaseModel
from phasescope.fleet import attribution
from phasescope.fleet.collect import fetch_traces
from phasescope.fleet.judge import HELD_IDLE, judge_all
from phasescope.fleet.openmetrics import write_stream
from phasescope.fleet.summary import summary
from phasescope.live.classify import LiveClassifier
from phasescope.prom.client import PromClient
from phasescope.schema import DeviceInfo, ProcessSample, Trace
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.replay_live import ReplaySource


def _series_api(label_sets: list[dict[str, str]]) -> httpx.MockTransport:
    """/api/v1/series over `label_sets`, matching `{__name__="..."}` as Prometheus does."""

    def handler(req: httpx.Request) -> httpx.Response:
        form = httpx.QueryParams(req.content.decode())
        assert req.url.path == "/api/v1/series"
        name = form["match[]"].split('"')[1]
        data = [ls for ls in label_sets if ls["__name__"] == name]
        return httpx.Response(200, content=json.dumps({"status": "success", "data": data}))

    return httpx.MockTransport(handler)


def test_agent_pod_info_groups_the_fleet_by_namespace_and_pod(
    fleet_traces: dict[str, Trace], model: PhaseModel, tmp_path: Path
) -> None:
    traces = list(fleet_traces.values())
    tree = build_tree(tmp_path)
    agent = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(model))
    registry = registry_for(agent, host="node1", resolver=resolver(tree))
    # The training GPU runs pod llm-train-0; the inference GPU and the idle one both belong to vllm-7d9f.
    procs = {"GPU-training": [101], "GPU-inference": [202], "GPU-idle": [303]}
    for b in ticks([t.take(slice(0, 5)) for t in traces]):
        agent.on_tick(
            replace(b, processes=[ProcessSample(b.time, p, u) for u, ps in procs.items() for p in ps])
        )
    scraped = [
        {"__name__": s.name, **s.labels}
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
    ]
    with PromClient("http://prom:9090", transport=_series_api(scraped)) as client:
        pods = attribution.fetch(client, 0.0, 1.0)
    assert pods["GPU-training"] == {"pod": "llm-train-0", "namespace": "research", "container": "trainer"}
    assert pods["GPU-idle"]["pod"] == pods["GPU-inference"]["pod"] == "vllm-7d9f"

    before = summary(judge_all(traces, model))
    assert before["by_namespace"] == {} and before["by_pod"] == {}  # the GPU series carry no pod labels
    s = summary(judge_all(attribution.attach(traces, pods), model))
    assert s["by_namespace"]["research"]["training"] == 1
    serving = s["by_namespace"]["serving"]
    # The idle GPU is held by a pod: held-idle, the waste the fleet table prices.
    assert (serving["inference"], serving[HELD_IDLE], sum(serving.values())) == (1, 1, 2)
    assert set(s["by_pod"]) == {"research/llm-train-0", "serving/vllm-7d9f"}


def test_label_rules_over_a_range() -> None:
    base = {"__name__": attribution.POD_INFO, "uuid": "GPU-a", "host": "n1"}
    got = attribution.from_label_sets(
        [
            # The scrape job set its own `pod`/`namespace` (the agent's): the GPU's are the exported_* ones.
            {
                **base,
                "pod": "phasescope-agent-x",
                "exported_pod": "train-0",
                "namespace": "monitoring",
                "exported_namespace": "ml",
                "container": "trainer",
            },
            # GPU b had pod p1, later p2 of the same namespace: only the namespace is certain.
            {**base, "uuid": "GPU-b", "pod": "p1", "namespace": "ml"},
            {**base, "uuid": "GPU-b", "pod": "p2", "namespace": "ml"},
            # GPU c was shared by two namespaces at one time (the agent left them empty), later had one.
            {**base, "uuid": "GPU-c", "pod": "", "namespace": ""},
            {**base, "uuid": "GPU-c", "pod": "solo", "namespace": "ml"},
            {**base, "uuid": ""},  # names no device
        ]
    )
    assert got == {
        "GPU-a": {"pod": "train-0", "namespace": "ml", "container": "trainer"},
        "GPU-b": {"namespace": "ml"},
    }


def test_series_pod_labels_win_over_the_info_metric(fleet_traces: dict[str, Trace]) -> None:
    t = fleet_traces["training"]
    dcgm = Trace(DeviceInfo("GPU-training", extra={"pod": "from-dcgm", "namespace": "a"}), t.time, t.columns)
    bare = fleet_traces["inference"]
    pods = {"GPU-training": {"pod": "from-agent", "namespace": "b"}, "GPU-inference": {"namespace": "c"}}
    out = attribution.attach([dcgm, bare, fleet_traces["idle"]], pods)
    assert out[0] is dcgm
    assert dict(out[1].device.extra) == {"namespace": "c"} and out[1].device.host == bare.device.host
    assert out[2] is fleet_traces["idle"]
    assert len(out[1]) == len(bare) and out[1].present_signals() == bare.present_signals()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pod_info_through_the_real_prometheus(
    fleet_traces: dict[str, Trace], model: PhaseModel, tmp_path: Path
) -> None:
    """Agent series without pod labels plus its pod info, backfilled into /usr/bin/prometheus, then the
    fleet's own fetch (which joins the pod info itself) and summary."""
    end = float(np.floor(time.time() / 60) * 60 - 3600)  # an hour ago: whole minutes, safely in the past
    traces = [Trace(t.device, t.time - t.time[-1] + end, t.columns, t.meta) for t in fleet_traces.values()]
    start = min(float(t.time[0]) for t in traces)
    text = io.StringIO()
    write_stream(traces, text, "phasescope")
    om = text.getvalue().removesuffix("# EOF\n")
    # What the agent would have been scraped for every 15 s: one pod-info series per GPU held by a pod.
    pods = {"GPU-training": ("llm-train-0", "research"), "GPU-idle": ("notebook-7", "research")}
    om += f"# TYPE {attribution.POD_INFO} gauge\n"
    for t in traces:
        if t.device.uuid in pods:
            pod, ns = pods[t.device.uuid]
            d = t.device
            labels = f'uuid="{d.uuid}",gpu="{d.index}",host="{d.host}",pod="{pod}",namespace="{ns}"'
            om += "".join(f"{attribution.POD_INFO}{{{labels}}} 1 {ts:.3f}\n" for ts in t.time[::15])
    (tmp_path / "backfill.om").write_text(om + "# EOF\n")
    done = subprocess.run(
        [need_tool(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", "backfill.om", "tsdb"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    procs = Procs()
    try:
        url = start_prometheus(
            procs, tmp_path, "global:\n  scrape_interval: 15s\nscrape_configs: []\n", free_port()
        )
        with PromClient(url) as client:
            fetched = fetch_traces(client, start=start, end=end, step=1.0)
            found = attribution.fetch(client, start, end)
    finally:
        procs.stop()
    assert found == {u: {"pod": p, "namespace": ns} for u, (p, ns) in pods.items()}
    s = summary(judge_all(fetched, model))  # fetch_traces attached the pods itself
    assert s["by_namespace"] == {"research": {**dict.fromkeys(s["phases"], 0), "training": 1, HELD_IDLE: 1}}
    assert set(s["by_pod"]) == {"research/llm-train-0", "research/notebook-7"}
    assert s["by_host"]["node-inference"]["inference"] == 1  # no pod: in the host table only
