"""`top --store` start-up cost: loading recent history from the live store, and classifying it.

    .venv/bin/python benchmarks/bench_top_history.py [--gpus 8] [--minutes 10] [--json FILE]

A real recording (SensorGuard RTX 3090, GPT-2 training on GPU 0 beside an idle GPU 1, from
$PHASESCOPE_SHARED_DATA) is written into a fresh store through the Store API at 1 Hz for `--gpus`
devices (the two real GPUs repeated under new uuids) and `--minutes` of history ending now. Figures
(best of 3, fresh LiveState each time):
  - load: `open_history` (read-only store, one query of the window) + `LiveState.preload`: what stands
    between `top` starting and the first frame with sparklines;
  - backfill: `backfill_phases` with the shipped model (boosters parsed first, not counted): what the
    sampler thread does before the first live sample.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from phasescope.live.classify import LiveClassifier
from phasescope.live.history import BACKFILL_S, backfill_phases, open_history
from phasescope.live.state import LiveState
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, TickBatch
from phasescope.sources.replay import read
from phasescope.store.live import Store

RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    data = Path(os.environ.get("PHASESCOPE_SHARED_DATA", "../shared/data"))
    traces = read(data / RUN)
    n = int(args.minutes * 60)
    table = np.stack([np.stack([t[s] for s in SIGNAL_NAMES], axis=1)[-n:] for t in traces], axis=1)
    rows = table[:, [i % len(traces) for i in range(args.gpus)]]
    devices = [DeviceInfo(f"GPU-bench-{i:04d}", "NVIDIA GeForce RTX 3090", i) for i in range(args.gpus)]
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "live.sqlite"
        with Store(path, retention_s=None) as store:
            store.ingest_many(TickBatch(now - 5.0 - (len(rows) - 1 - i), devices, rows[i].copy())
                              for i in range(len(rows)))
        classifier = LiveClassifier()
        classifier.warm_up()
        load_s, backfill_s = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            history = open_history(path, devices, args.minutes * 60, False, lambda _: None, now=now)
            assert history is not None
            state = LiveState("bench", history.capacity(args.minutes * 60, 1.0))
            loaded = state.preload(history.traces, devices)
            load_s.append(time.perf_counter() - t0)
            fresh = LiveClassifier(classifier.model)
            t0 = time.perf_counter()
            backfill_phases(state, fresh)
            backfill_s.append(time.perf_counter() - t0)
        phases = sorted({p.phase for d in devices if (p := state.phase(d.uuid)) is not None})
    out = {
        "gpus": args.gpus,
        "minutes": args.minutes,
        "samples_loaded": loaded,
        "load_ms": round(min(load_s) * 1e3, 1),
        "backfill_s": round(min(backfill_s), 3),
        "backfill_span_s": min(BACKFILL_S, args.minutes * 60),
        "classifier_runs": fresh.runs,
        "phases": phases,
    }
    print(f"history load (query + preload), {args.gpus} GPUs x {args.minutes:g} min at 1 Hz "
          f"({loaded} samples): {out['load_ms']} ms")
    print(f"classifier backfill over the last {out['backfill_span_s']:g} s: {out['backfill_s']} s "
          f"({fresh.runs} runs); phases found: {', '.join(phases)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
