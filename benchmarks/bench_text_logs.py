"""Read time of the three text-log readers (`nvidia-smi` table, `nvidia-smi -q`, `dcgmi dmon`) on one hour of
1 Hz logs from 8 GPUs, built from the layouts their tests write (shared data holds no such log). Reads with
`phasescope.sources.replay.read(path)` (detection included), best of N, CPU seconds of this process too (the
wall time on a shared machine says more about the neighbours).

    .venv/bin/python benchmarks/bench_text_logs.py [--seconds 3600] [--gpus 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.sources.replay import test_dcgmi_dmon as dcgmi  # noqa: E402
from tests.sources.replay import test_nvidia_smi_q as smi_q  # noqa: E402
from tests.sources.replay import test_nvidia_smi_table as table  # noqa: E402

from phasescope.sources.replay import read  # noqa: E402


def _clock(k: int) -> str:
    return f"{10 + k // 3600:02d}:{(k // 60) % 60:02d}:{k % 60:02d}"


def table_log(seconds: int, gpus: int) -> str:
    out = []
    for k in range(seconds):
        rows = [
            table.wide_gpu(i % 2, f"{40 + i}C", f"{60 + i}W", f"{1000 + k % 100}MiB", f"{k % 100}%")
            .replace(f"|   {i % 2}  ", f"|   {i}  ", 1)
            for i in range(gpus)
        ]
        out.append(table.wide_block(f"Mon Dec  7 {_clock(k)} 2026", rows))
    return "".join(out)


def q_log(seconds: int, gpus: int) -> str:
    out = []
    for k in range(seconds):
        sections = [
            smi_q.gpu_section(f"00000000:{i + 1:02X}:00.0", f"GPU-{i:08d}", f"{k % 100} %",
                              f"{1000 + k % 100} MiB", "61.00 W")
            for i in range(gpus)
        ]
        out.append(smi_q.dump(0, sections).replace("10:00:00", _clock(k)))
    return "".join(out)


def dcgmi_log(seconds: int, gpus: int) -> str:
    row = "     61.000       {u}     1234         1410   45     0.500        0.310        0.120       0.200\n"
    rows = (f"GPU {i}" + row.format(u=k % 100) for k in range(seconds) for i in range(gpus))
    return dcgmi.HEADER + "".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        makers = (("nvidia-smi-table", table_log), ("nvidia-smi-q", q_log), ("dcgmi-dmon", dcgmi_log))
        for name, make in makers:
            p = Path(tmp) / f"{name}.log"
            p.write_text(make(args.seconds, args.gpus))
            best_wall = best_cpu = float("inf")
            for _ in range(args.repeat):
                wall, cpu = time.perf_counter(), time.process_time()
                traces = read(p)
                best_wall = min(best_wall, time.perf_counter() - wall)
                best_cpu = min(best_cpu, time.process_time() - cpu)
            assert traces[0].meta["format"] == name and len(traces) == args.gpus
            mb = p.stat().st_size / 1e6
            print(f"{name:17s} {mb:6.1f} MB  {len(traces)} GPUs x {len(traces[0])} samples  "
                  f"best wall {best_wall:.2f} s  cpu {best_cpu:.2f} s  ({mb / best_cpu:.1f} MB per cpu-s)")


if __name__ == "__main__":
    main()
