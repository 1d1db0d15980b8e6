"""What the live telemetry-only KPIs add to a tick: a shared trace through the live pipeline's annotate hook.

    python benchmarks/bench_live_kpis.py [--shared ../shared/data]

Each recorded sample is one tick (state.ingest, then the Annotator with the shipped classifier and its
alarm), as `top` / `serve` run them; the KPI step (`live.annotate.ring_kpis`, run once per classifier run
per device) is timed apart. Printed per trace: ticks, devices, KPI runs, the median and worst KPI run, and
the KPI time per tick (all devices) beside the whole annotate hook's. CPU time (process_time), so other
work on the machine does not count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.live import annotate
from phasescope.live.classify import LiveClassifier
from phasescope.live.state import LiveState
from phasescope.schema import SIGNAL_NAMES, TickBatch
from phasescope.sources.replay import read

REPO = Path(__file__).resolve().parents[1]
# (trace, ticks, ring ticks): a 1 Hz 2-GPU training run in serve's 600-tick ring, an 8x H100 10 Hz run in
# the ring `top` sizes for the classifier and alarm at 10 Hz (1,201 ticks), a 4 Hz vLLM server.
RUNS = (
    ("sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv", 600, 600),
    ("nvidia-smi-h100-training/ckpt1.csv", 3000, 1201),
    ("powertrace-vllm/runs/burstgpt_qwen3-8b_a100/a100_trace_replay_tp1_1784416185/power.csv", 450, 600),
)


def run(path: Path, n: int, capacity: int) -> str:
    traces = read(path)
    n = min(n, min(len(t) for t in traces))
    table = np.stack([np.stack([t[s] for s in SIGNAL_NAMES], axis=1) for t in traces], axis=1)
    devices = [t.device for t in traces]
    state = LiveState("bench", capacity=capacity)
    clf = LiveClassifier()
    clf.warm_up()
    hook = annotate.Annotator(clf)
    kpi: list[float] = []
    real = annotate.ring_kpis

    def timed(*args: Any, **kwargs: Any) -> dict[str, Any]:
        t0 = time.process_time()
        out = real(*args, **kwargs)
        kpi.append(time.process_time() - t0)
        return out

    annotate.ring_kpis = timed
    total = 0.0
    try:
        for i in range(n):
            state.ingest(TickBatch(float(traces[0].time[i]), devices, table[i].copy()))
            t0 = time.process_time()
            hook(state)
            total += time.process_time() - t0
    finally:
        annotate.ring_kpis = real
    return (f"{path.name}: {n} ticks x {len(devices)} device(s), ring {capacity}: {len(kpi)} KPI runs, "
            f"median {statistics.median(kpi) * 1e3:.2f} ms, worst {max(kpi) * 1e3:.1f} ms; "
            f"KPIs {sum(kpi) / n * 1e3:.3f} ms per tick of {total / n * 1e3:.2f} ms for the annotate hook")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = os.environ.get("PHASESCOPE_SHARED_DATA") or str(REPO.parent / "shared" / "data")
    ap.add_argument("--shared", default=default)
    args = ap.parse_args()
    for rel, n, capacity in RUNS:
        print(run(Path(args.shared) / rel, n, capacity), flush=True)


if __name__ == "__main__":
    main()
