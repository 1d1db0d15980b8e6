"""The dashboard's live stream (`/api/stream`, Server-Sent Events) against polling (`/api/update?since=`).

Same agent as bench_serve.py (8 fake GPUs at 1 Hz through the real NvmlSource, LiveClassifier, the Starlette
app on uvicorn, in a child process). In one run, on the same machine:

1. bytes on the wire per update after the first full load: a page following the stream (gzip, one
   compressor per connection, flushed per event) and a page polling with gzip, as browsers do;
2. the agent's CPU (psutil, user+system) with 0 clients, then 1, 5 and 20 pages streaming, then polling
   (streams share each tick's encoding; each poll builds its own).

    .venv/bin/python benchmarks/bench_stream.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import get_gzip, poll_loop, state  # the same agent and polling client

BENCH_SERVE = Path(__file__).resolve().parent / "bench_serve.py"


def stream_loop(port: int, stop: threading.Event, period: float, counts: list[int],
                wire: list[int] | None = None) -> None:
    """One page following /api/stream with gzip: counts events (and wire bytes after the first event)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/stream", headers={"Accept-Encoding": "gzip"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-encoding") == "gzip"
    unpack = zlib.decompressobj(31)
    buf = ""
    events = 0
    while not stop.is_set():
        chunk = r.read1(65536)
        if not chunk:
            break
        if wire is not None and events >= 1:  # the first event is the full load, not an update
            wire[0] += len(chunk)
        buf += unpack.decompress(chunk).decode()
        while "\n\n" in buf:
            block, buf = buf.split("\n\n", 1)
            if not block.startswith(":"):  # ": keep-alive" is no update
                events += 1
                counts[0] += 1
    conn.close()


def per_update_bytes(port: int, seconds: float) -> None:
    stop = threading.Event()
    counts, wire = [0], [0]
    t = threading.Thread(target=stream_loop, args=(port, stop, 1.0, counts, wire))
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join(timeout=5)
    updates = max(counts[0] - 1, 1)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    doc = json.loads(get_gzip(conn, "/api/update")[0])
    since = max(h["t"][-1] for h in doc["history"].values() if h["t"])
    time.sleep(1.2)
    upd, upd_gz = get_gzip(conn, f"/api/update?since={since}")
    print(f"per update, 8 GPUs, 1 new tick: stream (gzip per connection) {wire[0] / updates:.0f} bytes "
          f"on the wire (mean of {updates} updates); poll with gzip {upd_gz} bytes ({len(upd)} raw); "
          f"stream/poll = {wire[0] / updates / upd_gz:.2f}")


def cpu_per_client(port: int, child: psutil.Process, seconds: float) -> None:
    base = None
    loops: list[tuple[str, Callable[..., None]]] = [("streaming", stream_loop), ("polling", poll_loop)]
    for n, (what, loop) in [(0, loops[0]), *[(k, lp) for lp in loops for k in (1, 5, 20)]]:
        stop = threading.Event()
        counts = [0]
        threads = [threading.Thread(target=loop, args=(port, stop, 1.0, counts)) for _ in range(n)]
        for t in threads:
            t.start()
        time.sleep(1.5)  # every client past its first full load
        c0, k0, t0 = child.cpu_times(), counts[0], time.perf_counter()
        time.sleep(seconds)
        c1, wall = child.cpu_times(), time.perf_counter() - t0
        updates = counts[0] - k0
        stop.set()
        for t in threads:
            t.join(timeout=5)
        cpu = (c1.user - c0.user + c1.system - c0.system) / wall * 100
        if base is None:
            base = cpu
            print(f"agent CPU, no client: {cpu:.2f}% of one core")
            continue
        print(f"agent CPU, {n:2d} page(s) {what} ({updates / wall:.1f} updates/s): {cpu:.2f}% of one core, "
              f"{(cpu - base) / n:.2f}% per client")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs "
          f"(shared; clients and agent on the same machine), load avg {os.getloadavg()[0]:.1f}")
    child = subprocess.Popen([sys.executable, str(BENCH_SERVE), "--agent"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        time.sleep(3.0)  # a few ticks in, so every device has data and a first phase
        per_update_bytes(port, args.seconds)
        # Whole classifier periods (every 5 s) per window, so each window carries the same classifier work.
        cpu_per_client(port, psutil.Process(child.pid), max(10.0, 5.0 * round(args.seconds / 5)))
        final = state(port)
        print(f"sampler over the whole run: {final['ticks']} ticks, {final['skipped']} skipped")
    finally:
        child.terminate()
        child.wait(timeout=15)


if __name__ == "__main__":
    main()
