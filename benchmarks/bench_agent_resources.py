"""What the agent (`phasescope serve`) really uses: the figures behind the DaemonSet's resource requests.

Runs `phasescope serve --source 'replay:FILE?speed=1&loop=1'` in a child process, replaying the 8x H100
training trace from ../shared/data at its recorded pace (10 Hz), while this process scrapes /metrics every
second (as the kube-prometheus-stack ServiceMonitor does). Every second it reads the child's RSS and CPU
time with psutil; it prints the RSS at start and at the end, the peak RSS and its trend (the agent's --history
buffer, 15 min by default, fills for that long: measure at least that long for the steady state), and the
CPU used (mean over the run, and the 95th percentile / max of 5 s windows, so a classification pass shows).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_agent_resources.py [--seconds 960]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PHASESCOPE_SHARED_DATA", REPO.parent / "shared" / "data"))
TRACE = "nvidia-smi-h100-training/power-trace_2025-07-26-23-32-09.csv"  # 8 GPUs, labels.csv: training


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> float:
    """Seconds until `url` answers 200 (the agent has started and served one scrape)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"the agent exited with {proc.returncode} before serving {url}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


def tree_usage(p: psutil.Process) -> tuple[int, float]:
    """(RSS bytes, CPU seconds) of the agent and any children it started."""
    procs = [p, *p.children(recursive=True)]
    rss = cpu = 0.0
    for q in procs:
        try:
            rss += q.memory_info().rss
            t = q.cpu_times()
            cpu += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return int(rss), cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=960.0,
                    help="how long to measure after start-up (the default outlasts the 15 min history)")
    ap.add_argument("--trace", default=TRACE, help="recording under the shared data folder")
    args = ap.parse_args()
    path = DATA / args.trace
    if not path.exists():
        raise SystemExit(f"{path}: no such trace (set PHASESCOPE_SHARED_DATA to the shared data folder)")
    port = free_port()
    cmd = [sys.executable, "-m", "phasescope", "serve", "--source", f"replay:{path}?speed=1&loop=1",
           "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        startup_s = wait_up(url, proc)
        agent = psutil.Process(proc.pid)
        rss0, cpu0 = tree_usage(agent)
        rss, cpu, stamps, scraped = [rss0], [cpu0], [time.monotonic()], 0
        with httpx.Client(timeout=5) as client:
            end = stamps[0] + args.seconds
            while time.monotonic() < end:
                time.sleep(max(0.0, stamps[-1] + 1.0 - time.monotonic()))
                scraped += len(client.get(url).content)
                now_rss, now_cpu = tree_usage(agent)
                rss.append(now_rss)
                cpu.append(now_cpu)
                stamps.append(time.monotonic())
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    t, c = np.array(stamps), np.array(cpu)
    span = t[-1] - t[0]
    windows = [(c[i + 5] - c[i]) / (t[i + 5] - t[i]) for i in range(0, len(t) - 5, 5)]
    mib = 1 << 20
    print(f"agent: phasescope serve --source 'replay:{args.trace}?speed=1&loop=1' (at the trace's own "
          f"sample rate), /metrics scraped every 1 s")
    print(f"host: {platform.processor() or platform.machine()}, {psutil.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print(f"start-up until the first /metrics answer: {startup_s:.1f} s")
    print(f"measured: {span:.0f} s, {len(t) - 1} scrapes, {scraped / max(len(t) - 1, 1) / 1024:.1f} KiB each")
    growth = np.polyfit((t - t[0]) / 60, np.array(rss) / mib, 1)[0]  # the history buffer fills for 15 min
    print(f"RSS: {rss[0] / mib:.0f} MiB at start, {rss[-1] / mib:.0f} MiB at the end, "
          f"peak {max(rss) / mib:.0f} MiB; trend {growth:+.1f} MiB/min")
    print(f"CPU: mean {1000 * (c[-1] - c[0]) / span:.0f} millicores; 5 s windows: "
          f"p95 {1000 * np.percentile(windows, 95):.0f}, max {1000 * max(windows):.0f} millicores")
    if err.strip():
        print("agent stderr (last lines):", *err.decode(errors="replace").splitlines()[-3:], sep="\n  ")


if __name__ == "__main__":
    main()
