"""The idle agent's CPU: `phasescope serve` at 1 Hz with no client, 8 GPUs and 1 GPU (issue 23 item 1).

Runs `phasescope serve --source 'replay:TRACE?speed=1&loop=1' --interval 1` in child processes, side by side
in the same minute: the 8x H100 training trace from ../shared/data (8 GPUs), the same trace's first GPU alone
(its every 8th row, written to a temporary file: 1 GPU), and a bare `python -c 'import time; time.sleep(...)'`
as the floor. Nothing scrapes or opens a page. After `--warm` seconds (past start-up, and past the 120 s the
alarm's history and the classifier's windows take to fill, so every per-tick cost is at its steady size), it
reads each child's CPU time per thread from /proc for `--seconds` and prints % of one core: the whole agent,
its main thread (uvicorn's event loop) and the rest (the sampler thread: ingest, energy, classifier,
alarm, KPIs). Per extra GPU = (8 GPUs - 1 GPU) / 7.

`--before-src DIR` runs the same pair from another source tree as well (e.g. the last commit's:
`git archive HEAD src | tar -x -C /tmp/before`, then `--before-src /tmp/before/src`), so a change is compared
with what it replaced under the same load.

Goal: <= 1% of one core for 8 GPUs, <= 0.05% more per extra GPU.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_agent_cpu.py [--seconds 120] [--warm 150]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PHASESCOPE_SHARED_DATA", REPO.parent / "shared" / "data"))
TRACE = "nvidia-smi-h100-training/power-trace_2025-07-26-23-32-09.csv"  # 8 GPUs interleaved, 10 Hz
TICK = os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def thread_cpu(pid: int) -> dict[int, float]:
    """Thread id -> CPU seconds (user + system) of every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def first_gpu_only(src: Path, dst: Path) -> None:
    """The trace's first GPU: nvidia-smi writes one row per GPU per sweep, 8 GPUs in turn."""
    lines = src.read_text().splitlines()
    dst.write_text("\n".join([lines[0], *lines[1::8]]) + "\n")


class Agent:
    def __init__(self, label: str, source: str, src_dir: str | None) -> None:
        self.label, self.port = label, free_port()
        env = dict(os.environ)
        if src_dir:
            env["PYTHONPATH"] = src_dir + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "phasescope", "serve", "--source", source, "--interval", "1",
             "--port", str(self.port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_up(self, timeout_s: float = 180) -> None:
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")[-500:] if self.proc.stderr else ""
                raise SystemExit(f"{self.label}: the agent exited with {self.proc.returncode}: {err}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.label}: no /metrics answer within {timeout_s:.0f} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to measure")
    ap.add_argument("--warm", type=float, default=150.0, help="seconds after start-up before measuring")
    ap.add_argument("--before-src", help="another source tree to run side by side (its `src` folder)")
    args = ap.parse_args()
    trace = DATA / TRACE
    if not trace.exists():
        raise SystemExit(f"{trace}: no such trace (set PHASESCOPE_SHARED_DATA to the shared data folder)")
    if args.before_src and not (Path(args.before_src) / "phasescope" / "__init__.py").exists():
        raise SystemExit(f"--before-src {args.before_src}: expected a source folder holding phasescope/")
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "gpu0.csv"
        first_gpu_only(trace, one)
        sources = {"8 GPUs": f"replay:{trace}?speed=1&loop=1",
                   "1 GPU": f"replay:{one}?speed=1&loop=1&format=nvidia-smi-csv:gpus=1"}
        versions = {"this tree": None, **({"before": args.before_src} if args.before_src else {})}
        agents = [Agent(f"{v}, {n}", s, d) for v, d in versions.items() for n, s in sources.items()]
        bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"])
        try:
            for a in agents:
                a.wait_up()
            time.sleep(args.warm)
            load0 = os.getloadavg()
            before = {a.label: thread_cpu(a.proc.pid) for a in agents}
            bare0, t0 = sum(thread_cpu(bare.pid).values()), time.monotonic()
            time.sleep(args.seconds)
            after = {a.label: thread_cpu(a.proc.pid) for a in agents}
            bare1, span = sum(thread_cpu(bare.pid).values()), time.monotonic() - t0
            load1 = os.getloadavg()
        finally:
            for a in agents:
                a.stop()
            bare.terminate()
    print(f"host: {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
          f"{load0[0]:.2f} at the start, {load1[0]:.2f} at the end (other jobs share the machine)")
    print(f"agents: phasescope serve --source 'replay:{TRACE}?speed=1&loop=1' --interval 1 (and its "
          f"first GPU alone), no client; measured {span:.0f} s after {args.warm:.0f} s of warm-up")
    print(f"{'agent':24} {'% of one core':>14} {'main thread':>12} {'other threads':>14}")
    total: dict[str, float] = {}
    for a in agents:
        used = {tid: c - before[a.label].get(tid, 0.0) for tid, c in after[a.label].items()}
        main_s = used.get(a.proc.pid, 0.0)
        total[a.label] = 100 * sum(used.values()) / span
        print(f"{a.label:24} {total[a.label]:13.2f}% {100 * main_s / span:11.2f}% "
              f"{100 * (sum(used.values()) - main_s) / span:13.2f}%")
    print(f"{'bare python, sleeping':24} {100 * (bare1 - bare0) / span:13.2f}%")
    for v in versions:
        eight, single = total[f"{v}, 8 GPUs"], total[f"{v}, 1 GPU"]
        print(f"{v}: 8 GPUs {eight:.2f}% of one core (goal <= 1%), per extra GPU {(eight - single) / 7:.3f}% "
              f"(goal <= 0.05%)")
    if args.before_src:
        ratio = total["this tree, 8 GPUs"] / max(total["before, 8 GPUs"], 1e-9)
        print(f"this tree / before, 8 GPUs: {ratio:.2f} (same run, same load)")


if __name__ == "__main__":
    main()
