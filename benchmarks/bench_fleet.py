"""Fleet classification end to end through the real Prometheus: query + classify, 100 vs 1,000 GPUs.

Setup (not timed): real labelled 1 Hz SensorGuard traces (training, inference, other, idle; cut to their
labelled spans) are tiled to `--hours` per GPU at 1 Hz, each GPU starting at its own offset, written as
OpenMetrics and backfilled with `promtool tsdb create-blocks-from openmetrics`. /usr/bin/prometheus
then serves that TSDB on loopback. Timed: `phasescope.fleet.scan` over the whole range, once for a
selector that matches 100 GPUs and once for all of them, `--repeat` times each (the first pass also
reads the blocks from disk), and for each `--workers` count in turn. The TSDB is kept in `--workdir`
and reused when it matches.

Columns: total = the pass end to end (wall); query and classify = their wall seconds summed over the
worker processes (they overlap, so with 2 workers they add up to more than the total); CPU seconds of
Prometheus (from /proc), of our decoding (HTTP, JSON, grid) and of our classification; the 1-minute
load average after the pass, since the machine may be shared.

    .venv/bin/python benchmarks/bench_fleet.py --gpus 1000 --hours 1 --workers 1,2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from phasescope.classify.model import PhaseModel
from phasescope.fleet import openmetrics
from phasescope.fleet.collect import fetch_traces
from phasescope.fleet.judge import judge_all
from phasescope.fleet.scan import ScanOptions, scan
from phasescope.prom.client import PromClient
from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay import read

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PHASESCOPE_SHARED_DATA", ROOT.parent / "shared" / "data"))
POOL_PER_LABEL = 4


def pool() -> list[tuple[Trace, str]]:
    """A few labelled 1 Hz SensorGuard spans per label, from distinct runs."""
    with open(DATA / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    picked: list[tuple[Trace, str]] = []
    per: Counter[str] = Counter()
    for r in rows:
        lab = r["label"]
        if r["source"] != "sensorguard" or per[lab] >= POOL_PER_LABEL or "node" in r["path"]:
            continue
        if "markers" in r["path"]:
            continue
        t = next(t for t in read(DATA / r["path"]) if t.device.index == int(r["gpu_index"]))
        if r["t_from"]:
            t = t.slice_time(float(r["t_from"]), float(r["t_to"]))
        if len(t) < 120:
            continue
        picked.append((t, lab))
        per[lab] += 1
    return picked


def fleet_traces(n: int, seconds: int, end: float) -> tuple[list[Trace], dict[str, str]]:
    src = pool()
    start = end - seconds + 1
    traces, labels = [], {}
    rng = np.random.default_rng(7)
    for i in range(n):
        base, lab = src[i % len(src)]
        off = int(rng.integers(0, len(base)))
        idx = (np.arange(seconds) + off) % len(base)
        uuid = f"GPU-bench-{i:04d}"
        dev = DeviceInfo(uuid, "NVIDIA GeForce RTX 3090", i % 8, f"node-{i // 8:03d}")
        cols = {k: v[idx] for k, v in base.columns.items()}
        traces.append(Trace(dev, start + np.arange(seconds, dtype=np.float64), cols))
        labels[uuid] = lab
    return traces, labels


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), to split the work from Prometheus'."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prom_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).split()[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_tsdb(work: Path, n: int, seconds: int) -> tuple[float, dict[str, str]]:
    marker = work / "tsdb.json"
    if marker.exists():
        meta = json.loads(marker.read_text())
        if meta["gpus"] == n and meta["seconds"] == seconds:
            print(f"reusing {work / 'tsdb'} ({n} GPUs x {seconds} s)", flush=True)
            return float(meta["end"]), meta["labels"]
    shutil.rmtree(work / "tsdb", ignore_errors=True)
    end = float(np.floor(time.time() / 3600) * 3600 - 3600)
    t0 = time.perf_counter()
    traces, labels = fleet_traces(n, seconds, end)
    om = work / "fleet.om"
    samples = openmetrics.write(traces, om, "phasescope")
    t1 = time.perf_counter()
    print(
        f"wrote {samples:,} samples ({om.stat().st_size / 1e9:.2f} GB OpenMetrics) in {t1 - t0:.0f}s",
        flush=True,
    )
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(work / "tsdb")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    om.unlink()
    print(f"promtool backfill {time.perf_counter() - t1:.0f}s", flush=True)
    marker.write_text(json.dumps({"gpus": n, "seconds": seconds, "end": end, "labels": labels}))
    return end, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--small", type=int, default=100, help="GPUs in the smaller (selector) run")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--workers", default="0", help="fleet worker processes, comma-separated to compare (0: one per CPU)"
    )
    ap.add_argument(
        "--batch-samples",
        default=str(ScanOptions.max_samples),
        help="most samples per query, comma-separated to compare",
    )
    ap.add_argument(
        "--check-identical",
        action="store_true",
        help="also classify all GPUs in one process (fetch_traces + judge_all, 4M-sample batches) and "
        "count the verdict documents equal to those of the last pass",
    )
    ap.add_argument("--labels-out", default="", help="append GPU, label, current phase per pass here (TSV)")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "phasescope-bench-fleet"))
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    seconds = int(args.hours * 3600)
    end, labels = build_tsdb(work, args.gpus, seconds)

    port = free_port()
    (work / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115 - closed after Prometheus stops
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=3650d",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    model = PhaseModel.load()
    t_load = time.perf_counter()
    model.predict_trace(pool()[0][0], evidence=False)  # parse the boosters once, outside the timing
    print(f"model load + first prediction {time.perf_counter() - t_load:.2f}s (once per process, not timed)")
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        digits = len(str(args.small - 1))
        small_sel = '{uuid=~"GPU-bench-' + "0" * (4 - digits) + "[0-9]" * digits + '"}' if args.small else ""
        print(f"\nPrometheus {prom_version()}, {os.cpu_count()} CPUs, range {seconds} s at 1 s step\n")
        print(
            "| GPUs | pass | workers | batch | queries | total s | query s | classify s "
            "| CPU s: Prometheus | CPU s: decode | CPU s: classify | samples | correct label | load 1 min |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        workers_list = [int(w) for w in args.workers.split(",")]
        batch_list = [int(b) for b in args.batch_samples.split(",")]
        # the settings alternate pass by pass, so that they see the same machine load
        runs = [
            (sel, n, k, w, b)
            for sel, n in ((small_sel, args.small), ("", args.gpus))
            for k in range(args.repeat)
            for w in workers_list
            for b in batch_list
        ]
        for sel, n, k, workers, batch in runs:
            opts = ScanOptions(
                url=url,
                since_s=seconds - 1,
                end=end,
                step_s=1.0,
                selector=sel,
                workers=workers,
                max_samples=batch,
            )
            prom_cpu = cpu_seconds(prom.pid)
            r = scan(opts, model=model)
            prom_cpu = cpu_seconds(prom.pid) - prom_cpu
            assert len(r.verdicts) == n, (len(r.verdicts), n)
            right = sum(
                v.label == labels[v.uuid] or (v.label == "held_idle" and labels[v.uuid] == "idle")
                for v in r.verdicts
            )
            print(
                f"| {n} | {k + 1} | {r.workers} | {batch / 1e6:g}M | {r.stats.queries} "
                f"| {r.wall_s:.2f} | {r.query_s:.2f} | {r.classify_s:.2f} "
                f"| {prom_cpu:.2f} | {r.query_cpu_s:.2f} | {r.classify_cpu_s:.2f} "
                f"| {r.stats.samples:,} | {right / n:.1%} | {os.getloadavg()[0]:.1f} |",
                flush=True,
            )
            if args.labels_out:
                with open(args.labels_out, "a") as f:
                    for v in r.verdicts:
                        f.write(f"{n}\t{r.workers}\t{batch}\t{k + 1}\t{v.uuid}\t{v.label}\t{v.current}\n")
        if args.check_identical:
            with PromClient(url) as client:
                traces = fetch_traces(
                    client, start=end - seconds + 1, end=end, step=1.0, max_samples=4_000_000
                )
            serial = {v.uuid: v.to_dict() for v in judge_all(traces, model)}
            same = sum(serial.get(v.uuid) == v.to_dict() for v in r.verdicts)
            print(
                f"\nverdict documents equal to the single-process path: {same}/{len(r.verdicts)} "
                f"(last pass: {r.workers} workers, {r.stats.queries} queries)"
            )
    finally:
        os.killpg(prom.pid, signal.SIGTERM)
        prom.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    main()
