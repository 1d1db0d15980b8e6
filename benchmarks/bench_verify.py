"""Cost of claim checking and of the evidence ledger, on real telemetry.

    .venv/bin/python benchmarks/bench_verify.py [--reps 3] [--json FILE]

Data (read from ../shared/data, never copied):
  - H100: `nvidia-smi-h100-training/ckpt1.csv`, 8 GPUs at 10 Hz, 3 signals (power, util, memory);
  - RTX 3090: the `duty_shaping` run r01, all 9 NVML signals at 1 Hz, 3 GPUs in the file.
Figures (best of --reps):
  - verify: `check_traces` (model windows, segments, alarm, coverage, FLOP) per device-hour of telemetry;
  - ledger write: `LedgerWriter.append_trace` for every device (60-sample batches, a signed root every 64
    records), samples per second and bytes per sample on disk;
  - live ledger: `LedgerWriter.on_tick` per tick of 8 devices (buffered; a batch per device per 60 ticks);
  - audit: `check_chain` (hashes, links, Merkle roots, signatures) and the full `audit_bundle` (adds the
    re-run of the classifier), per MB and per device-hour.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phasescope.classify.model import PhaseModel
from phasescope.schema import SIGNAL_NAMES, TickBatch, Trace
from phasescope.sources.replay import read
from phasescope.verify.audit import audit_bundle, check_chain
from phasescope.verify.check import CheckParams, check_traces
from phasescope.verify.claims import parse_claim
from phasescope.verify.ledger import LedgerWriter

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
H100 = "nvidia-smi-h100-training/ckpt1.csv"
RTX = "sensorguard-rtx3090/20260830T145308Z_dev-duty_shaping_node1-gpu1_r01/nvml.csv"


def best(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def device_hours(traces: list[Trace]) -> float:
    return sum(t.duration() for t in traces) / 3600.0


def bench_set(name: str, traces: list[Trace], model: PhaseModel, reps: int, tmp: Path) -> dict[str, Any]:
    claim = parse_claim("no-training")
    hours = device_hours(traces)
    samples = sum(len(t) for t in traces)
    secs, verdicts = best(lambda: check_traces(traces, claim, model), reps)
    key = Ed25519PrivateKey.generate()
    path = tmp / f"{name}.jsonl"

    def write() -> None:
        path.unlink(missing_ok=True)
        with LedgerWriter(path, key, model=model) as w:
            for t in traces:
                w.append_trace(t)
            for v in verdicts:
                w.append_verdict(v.to_dict(), claim.text, None, CheckParams().to_dict())

    wsecs, _ = best(write, reps)
    size = path.stat().st_size
    csecs, chain = best(lambda: check_chain(path), reps)
    assert not chain.problems, chain.problems[:1]
    asecs, report = best(lambda: audit_bundle(path, key.public_key(), model), reps)
    assert report.ok, report.problems[:1]
    return {
        "data": name,
        "devices": len(traces),
        "samples": samples,
        "device_hours": round(hours, 4),
        "verify_s": round(secs, 3),
        "verify_s_per_device_hour": round(secs / hours, 2),
        "ledger_write_s": round(wsecs, 3),
        "ledger_samples_per_s": round(samples / wsecs),
        "bundle_bytes": size,
        "bytes_per_sample": round(size / samples, 1),
        "records": len(chain.records),
        "roots": chain.roots,
        "check_chain_s": round(csecs, 3),
        "check_chain_mb_per_s": round(size / 1e6 / csecs, 1),
        "audit_s": round(asecs, 3),
        "audit_s_per_device_hour": round(asecs / hours, 2),
    }


def bench_ticks(traces: list[Trace], reps: int, tmp: Path) -> dict[str, Any]:
    """on_tick cost per tick for all devices of the file, replayed tick by tick."""
    n = min(len(t) for t in traces)
    ticks = []
    for i in range(n):
        vals = np.full((len(traces), len(SIGNAL_NAMES)), np.nan)
        for d, t in enumerate(traces):
            for j, s in enumerate(SIGNAL_NAMES):
                if s in t.columns:
                    vals[d, j] = t.columns[s][i]
        ticks.append(TickBatch(float(traces[0].time[i]), [t.device for t in traces], vals))
    key = Ed25519PrivateKey.generate()

    def run() -> None:
        p = tmp / "ticks.jsonl"
        p.unlink(missing_ok=True)
        with LedgerWriter(p, key) as w:
            for b in ticks:
                w.on_tick(b)

    secs, _ = best(run, reps)
    return {"ticks": n, "devices": len(traces), "us_per_tick": round(secs / n * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    model = PhaseModel.load()
    for sub in model.submodels:  # parse every booster once, outside the timings
        _ = sub.booster
    h100 = [t for t in read(DATA / H100) if len(t)]
    rtx = [t for t in read(DATA / RTX) if len(t)]
    out: dict[str, Any] = {"reps": args.reps}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out["rtx3090_1hz_9signals"] = bench_set("rtx3090", rtx, model, args.reps, tmp)
        out["h100_10hz_3signals"] = bench_set("h100", h100, model, args.reps, tmp)
        out["live_ticks_h100"] = bench_ticks(h100, args.reps, tmp)
    for k, v in out.items():
        if isinstance(v, dict):
            print(f"{k}: " + ", ".join(f"{a}={b}" for a, b in v.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
