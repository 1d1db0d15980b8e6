"""dcgm-exporter names and Kubernetes labels through the real Prometheus: real labelled traces are written
as dcgm-exporter series (with pod/namespace labels), backfilled with `promtool tsdb create-blocks-from
openmetrics`, served by /usr/bin/prometheus, and classified by `phasescope fleet`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from tests.fleet.harness import Procs, backfill, free_port, labelled_trace, start_prometheus

from phasescope.cli.fleet import command as fleet_command
from phasescope.fleet.scan import available_cpus
from phasescope.schema import DeviceInfo, Trace

ROWS = {  # uuid -> (labels.csv path, gpu, pod, namespace, expected fleet label)
    "GPU-dcgm-train": (
        "sensorguard-rtx3090/20260825_train_resnet_cifar10_verifier-gpu0_s2_r03/nvml.csv",
        0,
        "resnet-train-0",
        "research",
        "training",
    ),
    "GPU-dcgm-serve": (
        "sensorguard-rtx3090/20260825_infer_bert_verifier-gpu1_s1_r02/nvml.csv",
        1,
        "bert-serve-5f6d",
        "serving",
        "inference",
    ),
    "GPU-dcgm-held": (
        "sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu1_s0_r02/nvml.csv",
        0,
        "notebook-7",
        "research",
        "held_idle",
    ),
    "GPU-dcgm-free": (
        "sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv",
        1,
        "",
        "",
        "idle",
    ),
}


def _placed(trace: Trace, device: DeviceInfo, end: float) -> Trace:
    """The trace under a new identity, shifted to end at `end` (wall clock)."""
    t = trace.time - trace.time[-1] + end
    return Trace(device, t, trace.columns, trace.meta)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dcgm_series_with_pods_are_classified(shared_data: Path, tmp_path: Path) -> None:
    end = float(np.floor(time.time() / 60) * 60 - 3600)  # an hour ago: whole minutes, safely in the past
    traces = []
    for uuid, (path, gpu, pod, ns, _label) in ROWS.items():
        trace, _row = labelled_trace(shared_data, path, gpu)
        extra = {"pod": pod, "namespace": ns, "container": "main"} if pod else {}
        traces.append(
            _placed(trace, DeviceInfo(uuid, "NVIDIA GeForce RTX 3090", gpu, "node-a", extra=extra), end)
        )
    backfill(traces, tmp_path, "dcgm")
    procs = Procs()
    try:
        url = start_prometheus(
            procs, tmp_path, "global:\n  scrape_interval: 15s\nscrape_configs: []\n", free_port()
        )
        args = [
            "--prometheus",
            url,
            "--since",
            "600s",
            "--end",
            str(end),
            "--json",
            "--price-gpu-hour",
            "2.5",
        ]
        result = CliRunner().invoke(fleet_command, args)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        got = {d["uuid"]: d["label"] for d in doc["devices"]}
        assert got == {u: r[4] for u, r in ROWS.items()}, json.dumps(doc["devices"], indent=1)[:3000]
        pods = {d["uuid"]: (d["namespace"], d["pod"]) for d in doc["devices"]}
        assert pods["GPU-dcgm-serve"] == ("serving", "bert-serve-5f6d")
        s = doc["summary"]
        assert s["by_namespace"]["research"]["training"] == 1
        assert s["by_namespace"]["research"]["held_idle"] == 1
        assert s["by_namespace"]["serving"]["inference"] == 1
        assert s["by_host"]["node-a"]["idle"] == 1
        held = next(d for d in doc["devices"] if d["uuid"] == "GPU-dcgm-held")
        # Held-idle time is priced per GPU-hour through kpi.cost.
        assert held["held_idle_gpu_hours"] > 0.02
        assert held["held_idle_cost"]["time_usd"] == pytest.approx(held["held_idle_gpu_hours"] * 2.5)
        assert s["waste"]["held_idle_usd"] == pytest.approx(held["held_idle_cost"]["total_usd"])

        # One batch per device, classified in three worker processes: the same verdicts to the last digit.
        r = CliRunner().invoke(fleet_command, [*args, "--workers", "3", "--batch-samples", "10000"])
        assert r.exit_code == 0, r.output
        pooled = json.loads(r.output)
        assert pooled["timing"]["workers"] == 3 and pooled["fetched"]["queries"] == len(ROWS)
        # default: one worker per CPU, at most one per device here (a batch per device at most)
        assert doc["timing"]["workers"] == min(available_cpus(), len(ROWS))
        assert pooled["devices"] == doc["devices"] and pooled["summary"] == doc["summary"]

        # Shards split the fleet without overlap or loss.
        seen: list[str] = []
        for i in range(3):
            r = CliRunner().invoke(fleet_command, [*args, "--shard", f"{i}/3"])
            assert r.exit_code == 0, r.output
            seen += [d["uuid"] for d in json.loads(r.output)["devices"]]
        assert sorted(seen) == sorted(ROWS)
    finally:
        procs.stop()
