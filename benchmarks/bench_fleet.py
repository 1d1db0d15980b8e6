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

Then, per pass, each stage's wall and CPU seconds summed over the workers (`ScanResult.stages`: the listing
calls, then per batch http, decode, assemble, classify) with its CPU cost per GPU-hour, and the busiest
worker's peak RSS. Last, baselines measured in the same run on the same bytes (one batch's answer): the
old read path (httpx) against the new (`http.client`), the plain `json.loads` decoder against the columnar
one, and the model-and-segments part of `classify` against the fleet verdict around it (judge).

    .venv/bin/python benchmarks/bench_fleet.py --gpus 1000 --hours 1 --workers 1,2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from phasescope.classify import verdict
from phasescope.classify.model import PhaseModel
from phasescope.fleet import openmetrics
from phasescope.fleet.collect import build_traces, fetch_traces, plan_fetch
from phasescope.fleet.judge import judge_all
from phasescope.fleet.scan import ScanOptions, ScanResult, scan
from phasescope.prom.client import PromClient, _parse_matrix_json, parse_matrix
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


def cpu_model() -> str:
    """The CPU's model name, as `lscpu | grep 'Model name'` prints it (docs/BENCHMARKS.md quotes it)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def stage_table(passes: list[tuple[int, ScanResult]]) -> None:
    """Each stage's seconds per pass, and its CPU per GPU-hour (the rate docs/design/fleet-scale.md uses)."""
    print("\n| GPUs | workers | stage | calls | wall s (summed) | CPU s | CPU ms per GPU-hour |")
    print("|---|---|---|---|---|---|---|")
    for n, r in passes:
        gpu_hours = n * (r.end - r.start + 1) / 3600
        for name, wall in r.stages.wall.items():
            cpu = r.stages.cpu[name]
            print(
                f"| {n} | {r.workers} | {name} | {r.stages.calls[name]} | {wall:.2f} | {cpu:.2f} "
                f"| {1000 * cpu / gpu_hours:.2f} |"
            )
        rss = r.worker_peak_rss_bytes / 2**20
        print(f"| {n} | {r.workers} | busiest worker's peak RSS | | | | {rss:.0f} MiB |")


def best_cpu(fn: Callable[[], object], repeat: int = 3) -> float:
    """The least CPU seconds of `repeat` calls (the machine is shared: the least is the least disturbed)."""
    best = float("inf")
    for _ in range(repeat):
        c = time.process_time()
        fn()
        best = min(best, time.process_time() - c)
    return best


def same_bytes_baselines(url: str, start: float, end: float, model: PhaseModel) -> None:
    """Old against new on one batch's answer, in this run: read path, decoder; and classify against judge."""
    with PromClient(url) as new, PromClient(url, transport=httpx.HTTPTransport()) as old:
        plan = plan_fetch(new, start=start, end=end, max_samples=ScanOptions.max_samples)
        batch = plan.batches[0]
        regex = "|".join(d.ident for d in batch)
        metrics = "|".join(sorted({m for d in batch for m in d.metrics}))
        form = {
            "query": f'{{__name__=~"{metrics}",uuid=~"{regex}"}}',
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": "1",
        }
        body = new._post("/api/v1/query_range", form)
        assert body == old._post("/api/v1/query_range", form)
        read_new = best_cpu(lambda: new._post("/api/v1/query_range", form))
        read_old = best_cpu(lambda: old._post("/api/v1/query_range", form))
    dec_new = best_cpu(lambda: parse_matrix(body))
    dec_old = best_cpu(lambda: _parse_matrix_json(body, "bench"))
    series = parse_matrix(body)
    samples = sum(s.time.size for s in series)
    traces = build_traces(batch, series, plan.start, plan.step, plan.n_points, plan.mmap, plan.limits)
    c0 = time.process_time()
    for t in traces:
        verdict.build(t, model, evidence=False)
    c1 = time.process_time()
    judge_all(traces, model)
    c2 = time.process_time()
    per_m = 1e6 / samples
    print(
        f"\nSame bytes, one batch ({len(batch)} GPUs, {samples:,} samples, {len(body) / 1e6:.1f} MB), "
        "CPU s per million samples, best of 3:"
    )
    print("| part | old | new | old / new |")
    print("|---|---|---|---|")
    print(f"| read the answer (httpx -> http.client) | {read_old * per_m:.3f} | {read_new * per_m:.3f} "
          f"| {read_old / read_new:.1f}x |")
    print(f"| decode (json.loads -> columnar) | {dec_old * per_m:.3f} | {dec_new * per_m:.3f} "
          f"| {dec_old / dec_new:.1f}x |")
    print(f"| classify: model + segments (verdict.build) | | {(c1 - c0) * per_m:.3f} | |")
    print(f"| judge: the fleet verdict around it (judge_all - verdict.build) | | "
          f"{((c2 - c1) - (c1 - c0)) * per_m:.3f} | |")


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
        if meta["gpus"] == n and meta["seconds"] == seconds and meta.get("targets"):
            print(f"reusing {work / 'tsdb'} ({n} GPUs x {seconds} s)", flush=True)
            return float(meta["end"]), meta["labels"]
    shutil.rmtree(work / "tsdb", ignore_errors=True)
    end = float(np.floor(time.time() / 3600) * 3600 - 3600)
    t0 = time.perf_counter()
    traces, labels = fleet_traces(n, seconds, end)
    om = work / "fleet.om"
    # one scrape target per node with its `up` series, so that each pass makes its `up` call as in a real
    # deployment (collect.scrape_targets); the series then carry the target's job and instance
    hosts = {t.device.host for t in traces}
    targets = {h: {"job": "gpu-agent", "instance": f"{h}:9400"} for h in hosts}
    samples = openmetrics.write(traces, om, "phasescope", targets=targets)
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
    marker.write_text(
        json.dumps({"gpus": n, "seconds": seconds, "end": end, "labels": labels, "targets": True})
    )
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
        print(
            f"\nPrometheus {prom_version()}, {os.cpu_count()} CPUs ({cpu_model()}), "
            f"range {seconds} s at 1 s step\n"
        )
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
        passes: list[tuple[int, ScanResult]] = []
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
            r.stages.record("Prometheus (server CPU)", r.wall_s, prom_cpu, r.stats.queries)
            passes.append((n, r))
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
        stage_table(passes)
        print(f"\nparent's peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        same_bytes_baselines(url, end - seconds + 1, end, model)
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
