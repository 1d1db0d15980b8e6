"""End to end with real components: Debian's prometheus scrapes three phasescope agents, each replaying a
different real labelled trace (training, inference, idle) as a live GPU at speed 1, and `phasescope fleet`
must call each GPU by its trace's label.

Speed 1 on purpose: Prometheus stamps samples with its own scrape (wall) time, so a faster replay would
squeeze the recorded rhythm into fewer wall seconds than the model's 30 s windows expect.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.fleet.harness import (
    Procs,
    agent_command,
    free_port,
    labelled_trace,
    need_tool,
    prometheus_config,
    start_prometheus,
    wait_http,
    write_recording,
)

from phasescope.cli.fleet import command as fleet_command
from phasescope.schema import DeviceInfo

# (labels.csv path, gpu index): a training run, an inference run, an idle bystander, on three hosts.
TRACES = {
    "training": ("sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv", 0),
    "inference": ("sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01/nvml.csv", 0),
    "idle": ("sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv", 1),
}
COLLECT_S = 66.0  # three 30 s windows at the 15 s stride, plus scrape start-up


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fleet_classifies_each_replayed_gpu(shared_data: Path, tmp_path: Path) -> None:
    need_tool("/usr/bin/prometheus")
    procs = Procs()
    try:
        targets, expected = [], {}
        for label, (path, gpu) in TRACES.items():
            trace, row = labelled_trace(shared_data, path, gpu)
            assert row["label"] == label
            device = DeviceInfo(f"GPU-fleettest-{label}", "NVIDIA GeForce RTX 3090", 0, f"node-{label}")
            rec = write_recording(trace, device, tmp_path / f"{label}.parquet")
            port = free_port()
            procs.start(agent_command(rec, port), tmp_path / f"agent-{label}.log")
            targets.append(f"127.0.0.1:{port}")
            expected[device.uuid] = label
        for t, label in zip(targets, TRACES, strict=True):
            wait_http(f"http://{t}/metrics", 60, tmp_path / f"agent-{label}.log")
        started = time.time()
        url = start_prometheus(procs, tmp_path, prometheus_config(targets), free_port())
        time.sleep(max(0.0, COLLECT_S - (time.time() - started)))

        result = CliRunner().invoke(
            fleet_command, ["--prometheus", url, "--since", f"{int(COLLECT_S)}s", "--json"]
        )
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        got = {d["uuid"]: d["label"] for d in doc["devices"]}
        assert got == expected, json.dumps(doc["devices"], indent=1)[:3000]
        assert doc["summary"]["phases"]["training"] == 1
        assert doc["summary"]["by_host"]["node-training"]["training"] == 1
        assert doc["fetched"]["samples"] > 0 and doc["timing"]["query_s"] > 0

        # The selector narrows the fleet; a table without --json names the hosts.
        one = CliRunner().invoke(
            fleet_command,
            [
                "--prometheus",
                url,
                "--since",
                f"{int(COLLECT_S)}s",
                "--selector",
                '{uuid="GPU-fleettest-idle"}',
            ],
        )
        assert one.exit_code == 0, one.output
        assert "node-idle" in one.output and "node-training" not in one.output
    finally:
        procs.stop()
    assert all(p.poll() is not None for p in procs.procs)
