"""Cost of one `phasescope.monitor` window (begin_window + end_window) on a live source.

    .venv/bin/python benchmarks/bench_measure.py [--source host|nvml|auto] [--runs 7] [--windows 500]

Each window takes one reading at its begin and one at its end (no background thread on the host source or on
GPUs with NVML's energy counter), so the figure is what a window adds to the code it measures. Prints the
median and the fastest of `--runs` blocks of `--windows` back-to-back windows, after 50 warm-up windows.
"""

from __future__ import annotations

import argparse
import statistics
import time

from phasescope.kpi.cost import Prices
from phasescope.monitor import Monitor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="host", help="host (default), nvml or auto")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--windows", type=int, default=500)
    args = ap.parse_args()
    with Monitor(args.source, prices=Prices()) as mon:
        for _ in range(50):
            mon.begin_window("w")
            mon.end_window("w")
        per_ms = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            for _ in range(args.windows):
                mon.begin_window("w")
                mon.end_window("w")
            per_ms.append((time.perf_counter() - t0) / args.windows * 1e3)
        names = ", ".join(d.name for d in mon.devices)
    print(f"{args.source} ({names}): begin+end per window: median {statistics.median(per_ms):.3f} ms, "
          f"fastest {min(per_ms):.3f} ms ({args.runs} blocks x {args.windows} windows)")


if __name__ == "__main__":
    main()
