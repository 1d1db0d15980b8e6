"""Live store (SQLite WAL) ingest rate and the time to query a day of 8 GPUs at 1 Hz.

    .venv/bin/python benchmarks/bench_store.py [--gpus 8] [--hours 24] [--json FILE]

Data is synthesised at run time: every signal of the schema with realistic magnitudes and ~5% NaN
(as a device that lacks a signal or misses a read). Figures:
  - bulk ingest: ticks handed over in transactions of 600 ticks (a replay / backfill);
  - live ingest: one transaction per tick, as the sampler thread does at 1 Hz (measured over 2,000 ticks);
  - query: `Store.query()` of the whole span, all signals, as numpy columns (24 h x 8 GPUs = 691,200 rows),
    then one GPU and one hour; best of 3, on a fresh reader connection each time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from phasescope.schema import SIGNAL_NAMES, DeviceInfo, TickBatch
from phasescope.store.live import Store

T0 = 1_780_000_000.0
CHUNK = 600


def _values(rng: np.random.Generator, n_gpus: int) -> np.ndarray:
    scale = np.array(
        [
            1.0,
            1.0,
            80e9,
            700.0,
            80.0,
            2e9,
            3e9,
            1e10,
            1e10,
            80e9,
            1e9,
            700.0,
            255.0,
            1e11,
            1e11,
            1.0,
            1.0,
            1.0,
        ][: len(SIGNAL_NAMES)]
    )
    v = rng.random((n_gpus, len(SIGNAL_NAMES))) * scale
    v[rng.random(v.shape) < 0.05] = np.nan
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    devices = [
        DeviceInfo(f"GPU-bench-{i:02d}", "NVIDIA H100 80GB HBM3", i, "bench") for i in range(args.gpus)
    ]
    n_ticks = int(args.hours * 3600)
    rng = np.random.default_rng(0)
    pool = [_values(rng, args.gpus) for _ in range(64)]  # reuse matrices: measure the store, not the RNG

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.sqlite", retention_s=None)
        t = time.perf_counter()
        for start in range(0, n_ticks, CHUNK):
            stop = min(start + CHUNK, n_ticks)
            store.ingest_many(TickBatch(T0 + i, devices, pool[i % 64]) for i in range(start, stop))
        bulk_s = time.perf_counter() - t
        rows = n_ticks * args.gpus

        live_ticks = 2000
        t = time.perf_counter()
        for i in range(live_ticks):
            store.ingest(TickBatch(T0 + n_ticks + i, devices, pool[i % 64]))
        live_s = time.perf_counter() - t
        end = T0 + n_ticks - 1

        def best(fn: object) -> tuple[float, int]:
            times, got = [], 0
            for _ in range(3):
                fresh = Store(store.path, retention_s=None)
                t = time.perf_counter()
                traces = fn(fresh)  # type: ignore[operator]
                times.append(time.perf_counter() - t)
                got = sum(len(tr) for tr in traces)
                fresh.close()
            return min(times), got

        q_all, n_all = best(lambda s: s.query(start=T0, end=end))
        q_hour, n_hour = best(lambda s: s.query(device=devices[0].uuid, start=end - 3599, end=end))
        size = store.path.stat().st_size
        store.close()

    result = {
        "gpus": args.gpus,
        "hours": args.hours,
        "bulk_ingest_rows": rows,
        "bulk_ingest_s": bulk_s,
        "bulk_ingest_samples_per_s": rows / bulk_s,
        "live_ingest_ms_per_tick": live_s / live_ticks * 1e3,
        "live_ingest_samples_per_s": live_ticks * args.gpus / live_s,
        "query_all_rows": n_all,
        "query_all_s": q_all,
        "query_one_gpu_hour_rows": n_hour,
        "query_one_gpu_hour_s": q_hour,
        "db_bytes": size,
    }
    print(f"bulk ingest   {rows:,} rows in {bulk_s:.2f} s = {rows / bulk_s:,.0f} samples/s (device-ticks)")
    print(
        f"live ingest   {result['live_ingest_ms_per_tick']:.3f} ms per {args.gpus}-GPU tick "
        f"= {result['live_ingest_samples_per_s']:,.0f} samples/s (one transaction per tick)"
    )
    print(f"query all     {n_all:,} rows ({args.hours:g} h x {args.gpus} GPUs, all signals) in {q_all:.3f} s")
    print(f"query 1 GPU   {n_hour:,} rows (1 h) in {q_hour * 1e3:.1f} ms")
    print(f"store size    {size / 1e6:.1f} MB ({size / max(rows + live_ticks * args.gpus, 1):.0f} B per row)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
