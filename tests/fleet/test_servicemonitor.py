"""dcgm-exporter as kube-prometheus-stack scrapes it, through the real Prometheus.

Under a ServiceMonitor, Prometheus adds the scrape target's labels (the exporter's own `pod`, `namespace`,
`container`, `service`, `endpoint`) and renames the exporter's labels of the same names (the GPU's workload)
to `exported_*`. A GPU with no workload then carries only the exporter's `pod`: it must not be counted as held
by it, nor filed under the exporter's namespace. And dcgm-exporter collects every 30 s by default: a
Prometheus scraping every 15 s stores each reading twice, and a query at the default 1 s step repeats each 30
times; the fleet must judge the real samples, and say what their interval is.

The TSDB holds what such a scrape stores (`fleet.openmetrics.write(targets=...)`, the `up` series included),
backfilled with `promtool` and served by /usr/bin/prometheus.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from tests.fleet.harness import Procs, backfill, free_port, labelled_trace, start_prometheus

from phasescope.cli.fleet import command as fleet_command
from phasescope.schema import DeviceInfo, Trace

ROWS = {  # uuid -> (labels.csv path, gpu, workload pod, namespace, label at 1 Hz)
    "GPU-sm-train": ("sensorguard-rtx3090/20260825_train_resnet_cifar10_verifier-gpu0_s2_r03/nvml.csv", 0,
                     "resnet-train-0", "research", "training"),
    "GPU-sm-serve": ("sensorguard-rtx3090/20260825_infer_bert_verifier-gpu1_s1_r02/nvml.csv", 1,
                     "bert-serve-5f6d", "serving", "inference"),
    "GPU-sm-free": ("sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv", 1, "", "",
                    "idle"),
}
TARGET = {  # the labels kube-prometheus-stack's ServiceMonitor gives the dcgm-exporter pod on node-a
    "job": "nvidia-dcgm-exporter",
    "instance": "10.0.3.17:9400",
    "namespace": "gpu-operator",
    "pod": "nvidia-dcgm-exporter-x7k2p",
    "container": "nvidia-dcgm-exporter",
    "service": "nvidia-dcgm-exporter",
    "endpoint": "gpu-metrics",
}


def scraped(trace: Trace, device: DeviceInfo, end: float, collect_s: float, scrape_s: float) -> Trace:
    """What the TSDB holds for `trace` moved to end at `end`: every `scrape_s` the reading the exporter last
    collected (every `collect_s`)."""
    t0 = end - (trace.time[-1] - trace.time[0])
    collected = np.arange(t0, end, collect_s)
    scrapes = np.arange(t0, end, scrape_s)
    last = np.searchsorted(collected, scrapes, side="right") - 1
    src = collected[last] - t0 + trace.time[0]
    cols = {s: np.interp(src, trace.time, v) for s, v in trace.columns.items() if np.isfinite(v).any()}
    return Trace(device, scrapes, cols, dict(trace.meta))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("collect_s", "scrape_s"), [(1.0, 1.0), (30.0, 15.0)])
def test_servicemonitor_labels_and_collection_interval(
    shared_data: Path, tmp_path: Path, collect_s: float, scrape_s: float
) -> None:
    end = float(np.floor(time.time() / 60) * 60 - 3600)
    traces = []
    for uuid, (path, gpu, pod, ns, _label) in ROWS.items():
        trace, _row = labelled_trace(shared_data, path, gpu)
        extra = {"pod": pod, "namespace": ns, "container": "main"} if pod else {}
        dev = DeviceInfo(uuid, "NVIDIA GeForce RTX 3090", gpu, "node-a", extra=extra)
        traces.append(scraped(trace, dev, end, collect_s, scrape_s))
    backfill(traces, tmp_path, "dcgm", targets={"node-a": TARGET})
    procs = Procs()
    try:
        url = start_prometheus(procs, tmp_path, "global:\n  scrape_interval: 15s\nscrape_configs: []\n",
                               free_port())
        args = ["--prometheus", url, "--since", "600s", "--end", str(end), "--json"]
        result = CliRunner().invoke(fleet_command, args)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        devices = {d["uuid"]: d for d in doc["devices"]}
        assert set(devices) == set(ROWS)
        # The workload's labels, never the exporter's: the free GPU belongs to no namespace and no pod.
        assert {u: (d["namespace"], d["pod"]) for u, d in devices.items()} == {
            u: (r[3], r[2]) for u, r in ROWS.items()}
        assert "gpu-operator" not in doc["summary"]["by_namespace"]
        assert devices["GPU-sm-free"]["held"] is not True and devices["GPU-sm-free"]["label"] != "held_idle"
        for d in devices.values():  # the data's own interval, not the 1 s query step
            assert d["sample_interval_s"] == pytest.approx(collect_s, rel=0.05), d
        if collect_s == 1.0:
            assert {u: d["label"] for u, d in devices.items()} == {u: r[4] for u, r in ROWS.items()}
            # A selector on the workload's namespace finds the GPUs the table lists under it (the series
            # hold it as exported_namespace; `namespace` is the exporter's), with other matchers kept.
            for sel, want in (('{namespace="serving"}', {"GPU-sm-serve"}),
                              ('{namespace=~"res.*",Hostname="node-a"}', {"GPU-sm-train"}),
                              ('{namespace="gpu-operator"}', set()),
                              ('{pod!="bert-serve-5f6d"}', {"GPU-sm-train", "GPU-sm-free"})):
                r = CliRunner().invoke(fleet_command, [*args, "--selector", sel])
                assert r.exit_code == 0, r.output
                assert {d["uuid"] for d in json.loads(r.output)["devices"]} == want, sel
            # Piped, the table is not cut to 80 columns: every uuid and reason column whole.
            text = CliRunner().invoke(fleet_command, [a for a in args if a != "--json"])
            assert text.exit_code == 0, text.output
            assert all(u in text.output for u in ROWS) and "…" not in text.output
        else:
            # 30 s samples: a rate the shipped model is not validated at. Unknown, and the reason says so.
            for d in devices.values():
                assert d["label"] == "unknown", d
                assert "30 s" in d["reason"] or "interval" in d["reason"], d["reason"]
            text = CliRunner().invoke(fleet_command, [a for a in args if a != "--json"])
            assert text.exit_code == 0, text.output
            assert f"{len(ROWS)} GPU(s) unknown; the commonest reason ({len(ROWS)}): sample interval 30s" \
                in text.output
    finally:
        procs.stop()
