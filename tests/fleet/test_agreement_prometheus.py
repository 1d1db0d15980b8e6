"""One verdict through a real Prometheus (issue 20, "Done when"): the agent's phase gauge and `fleet`'s
verdict agree on the same samples when both come out of the same TSDB.

The 8x H100 training trace plays through the agent (hand-driven replay source, live classifier, the
`/metrics` collector) and its exposition is scraped every second of the recording (as the
kube-prometheus-stack ServiceMonitor does), stamped with the recorded clock. Those scrapes are backfilled
with `promtool` and served by /usr/bin/prometheus; `fleet` then reads the agent's raw signals back out of it
(fetch_traces) and judges them, while the agent's `phasescope_gpu_phase` is read out of the same Prometheus
at a 15 s step. They may differ only where docs/design/live-classifier.md ("One verdict") allows: the
warm-up and the decoder's lag after a change in the fleet's segments (tests/fleet/test_agreement.py
`lag_bound_s`).
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from tests.fleet.harness import PROMTOOL, Procs, free_port, need_tool, start_prometheus
from tests.fleet.test_agreement import H100_RUN, compare_with_fleet, lag_bound_s

from phasescope.classify.model import PhaseModel
from phasescope.fleet.collect import fetch_traces
from phasescope.fleet.judge import judge
from phasescope.live.classify import LiveClassifier
from phasescope.prom import names as mn
from phasescope.prom.client import PromClient
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource

TARGET = {"job": "phasescope-agent", "instance": "h100:9464"}  # what the scrape adds
SCRAPE_EVERY_S = 1.0  # the ServiceMonitor's interval (the trace itself is ~10 Hz)
CHECK_EVERY_S = 15.0  # where the agent's gauge is compared: a Prometheus range query's step

# The families the test needs in the TSDB: what the fleet reads (its signals, the devices' limits, the MIG
# info) and the phase gauge; the rest of each scrape is left out to keep the TSDB small.
WANTED = {m.name for m in mn.SIGNAL_METRICS.values() if m.kind == "gauge"}
WANTED |= {mn.GPU_INFO.name, mn.PHASE_CURRENT.name}
_TARGET = ",".join(f'{k}="{v}"' for k, v in TARGET.items())


def scrape_all(shared_data: Path, model: PhaseModel) -> tuple[dict[str, list[str]], float]:
    """Each wanted family's OpenMetrics sample lines from a scrape of the agent every SCRAPE_EVERY_S (the
    exposition's own lines, with the scrape's target labels and the tick's time added); and the classifier's
    run period (for the lag bound)."""
    traces = read(shared_data / H100_RUN)
    clock = [0.0]
    source = ReplaySource(traces, clock=lambda: clock[0], wall_clock=lambda: 0.0)
    classifier = LiveClassifier(model, alarm=False)
    agent = Agent(source, source.native_interval_s, classifier=classifier)
    registry = registry_for(agent, host="h100")
    out: dict[str, list[str]] = defaultdict(list)
    next_scrape = source.t0
    while True:
        batch = source.read()
        if source.exhausted:
            break
        batch.time += source.t0  # the recorded clock
        agent.on_tick(batch)
        clock[0] += source.native_interval_s
        if batch.time < next_scrape:
            continue
        next_scrape += SCRAPE_EVERY_S
        stamp = f" {float(batch.time):.3f}\n"
        for line in generate_latest(registry).decode().splitlines():
            name, brace, rest = line.partition("{")
            if brace and name in WANTED:  # every device series has labels; comments have none
                out[name].append(f"{name}{{{_TARGET},{rest}{stamp}")
    return out, classifier.every_s


def backfill_scrapes(scrapes: dict[str, list[str]], tmp: Path) -> None:
    """The scrapes as OpenMetrics (one block per family), then `promtool tsdb create-blocks-from`."""
    om = tmp / "agent.om"
    with om.open("w") as f:
        for name, lines in sorted(scrapes.items()):
            f.write(f"# TYPE {name} gauge\n")
            f.writelines(lines)
        f.write("# EOF\n")
    out = subprocess.run(
        [need_tool(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp / "tsdb")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    om.unlink()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_agent_gauge_and_fleet_agree_through_a_real_prometheus(shared_data: Path, tmp_path: Path) -> None:
    model = PhaseModel.load()
    scrapes, every_s = scrape_all(shared_data, model)
    times = [float(line.rsplit(" ", 1)[1]) for line in scrapes[mn.PHASE_CURRENT.name]]
    first, last = min(times), max(times)
    backfill_scrapes(scrapes, tmp_path)
    procs = Procs()
    try:
        url = start_prometheus(procs, tmp_path, "global:\n  scrape_interval: 1s\nscrape_configs: []\n",
                               free_port())
        client = PromClient(url)
        fetched = fetch_traces(client, start=first, end=last, step=1.0)
        # The agent's own gauge, as an alert or a dashboard reads it: the phase whose series is 1.
        gauge: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for s in client.query_range(f"{mn.PHASE_CURRENT.name} == 1", first, last, CHECK_EVERY_S):
            gauge[s.labels["uuid"]] += [(float(t), s.labels["phase"]) for t in s.time]
    finally:
        procs.stop()

    originals = {t.device.uuid: t for t in read(shared_data / H100_RUN)}
    assert {t.device.uuid for t in fetched} == set(originals) == set(gauge)
    cfg = model.config
    warm_up = cfg.window_s + cfg.stride_s + every_s
    lag = lag_bound_s(model, every_s)
    for trace in fetched:
        uuid = trace.device.uuid
        # The fleet judged the agent's 1 s samples, not a coarser or repeated copy of them.
        assert trace.meta["sample_interval_s"] == pytest.approx(1.0, rel=0.05), trace.meta
        span = float(originals[uuid].time[-1] - originals[uuid].time[0])
        assert len(trace) >= 0.95 * span / SCRAPE_EVERY_S, (len(trace), span)
        mean_power = np.nanmean(originals[uuid]["power"])
        np.testing.assert_allclose(np.nanmean(trace["power"]), mean_power, rtol=0.01)
        fleet = judge(trace, model)
        assert fleet.label == "training", uuid
        compared, disagree = compare_with_fleet(fleet, gauge[uuid], float(trace.time[0]), warm_up, lag)
        assert compared >= 40, uuid  # 687 s at a 15 s step, less the warm-up
        assert disagree == 0, f"{uuid}: {disagree} of {compared} points disagree"
