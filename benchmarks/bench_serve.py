"""`phasescope serve` under load: /metrics scrapes per second, and the cost of a dashboard client.

The agent runs in a child process exactly as `phasescope serve` wires it (Agent + LiveClassifier + the
Starlette app on uvicorn), sampling 8 fake GPUs at 1 Hz: the scripted fake NVML (tests/fakes/fake_nvml.py)
replays real recorded traces from ../shared/data through the real NvmlSource code path. The load comes from
separate client processes on loopback.

1. /metrics: `--clients` processes scrape in a bounded loop (keep-alive, one request in flight each) for
   `--seconds`; reports scrapes/s, latency percentiles, and the sampler's ticks/skips over the same span
   (goal: >= 200 scrapes/s with no sampling tick missed).
2. Dashboard: the bytes of one page update (`/api/update?since=<last t>`, raw and gzip) and of the first
   full load; then the agent's CPU (psutil, user+system) with 0, 1, 5 and 20 simulated pages polling at the
   page's own rate, per connected client.

    .venv/bin/python benchmarks/bench_serve.py [--seconds 20] [--clients 2]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.fakes
sys.path.insert(0, str(REPO / "benchmarks"))

import psutil  # noqa: E402

GPUS = 8


# ---------------------------------------------------------------- the agent (child process)


def run_agent(interval_s: float) -> None:
    """The serve agent over 8 fake GPUs; prints its port on stdout, serves until killed."""
    import uvicorn
    from tests.fakes.fake_nvml import FakeNvml

    from bench_sampler import eight_gpus
    from phasescope.classify.model import PhaseModel
    from phasescope.config import PriceConfig
    from phasescope.live.classify import LiveClassifier
    from phasescope.schema import MIB, TickBatch
    from phasescope.serve.agent import Agent
    from phasescope.serve.app import build_app
    from phasescope.serve.server import bind
    from phasescope.sources.nvml import NvmlSource

    fake = FakeNvml(eight_gpus(), mem_total_bytes=24576 * MIB, power_limit_w=350.0, energy_from_power=True,
                    throttle_reasons=0, max_clocks_mhz=(2100, 9751))
    installed = fake.installed()  # held (not a temporary) so the fake stays in place while we serve
    installed.__enter__()

    class Advancing:
        """NvmlSource whose fake driver moves one recorded sample on after every read (1 Hz recordings)."""

        def __init__(self) -> None:
            self.inner = NvmlSource()
            self.name = self.inner.name

        def devices(self) -> Any:
            return self.inner.devices()

        def read(self) -> TickBatch:
            batch = self.inner.read()
            fake.advance()
            return batch

        def error_counts(self) -> dict[str, int]:
            return self.inner.error_counts()

        def close(self) -> None:
            self.inner.close()

    classifier = LiveClassifier(PhaseModel.load())
    classifier.warm_up()
    agent = Agent(Advancing(), interval_s, classifier=classifier,
                  prices=PriceConfig(usd_per_gpu_hour=2.5, usd_per_kwh=0.12))
    app = build_app(agent)
    sock = bind("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    agent.start()
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")).run(
        sockets=[sock])


# ---------------------------------------------------------------- clients


def get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str] | None = None) -> bytes:
    """The body as sent (still compressed when the server gzipped it)."""
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}")
    return body


def get_gzip(conn: http.client.HTTPConnection, path: str) -> tuple[bytes, int]:
    """(decoded body, bytes on the wire) for a client that accepts gzip, as a browser does."""
    conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}")
    wire = len(body)
    return (gzip.decompress(body) if r.getheader("content-encoding") == "gzip" else body), wire


def scrape_loop(port: int, seconds: float, gz: bool, out: Any) -> None:
    """One client process: scrape /metrics back to back (keep-alive) until the time is up."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Accept-Encoding": "gzip"} if gz else {}
    lat = []
    nbytes = 0
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        nbytes += len(get(conn, "/metrics", headers))
        lat.append(time.perf_counter() - t0)
    out.put((len(lat), nbytes, lat))


def state(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        doc: dict[str, Any] = json.loads(get(conn, "/api/state"))
        return doc
    finally:
        conn.close()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(int(q * len(s)), len(s) - 1)] if s else float("nan")


def bench_metrics(port: int, clients: int, seconds: float, gz: bool) -> None:
    before = state(port)
    q: Any = mp.Queue()
    t0 = time.perf_counter()
    procs = [mp.Process(target=scrape_loop, args=(port, seconds, gz, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    after = state(port)
    n = sum(r[0] for r in results)
    lat = [x for r in results for x in r[2]]
    ticks = after["ticks"] - before["ticks"]
    skipped = after["skipped"] - before["skipped"]
    kib = sum(r[1] for r in results) / max(n, 1) / 1024
    what = "/metrics (gzip)" if gz else "/metrics"
    print(f"{what}: {clients} clients x {seconds:g} s: {n / seconds:.0f} scrapes/s, "
          f"{kib:.1f} KiB each, latency p50 {pct(lat, .5) * 1e3:.1f} ms "
          f"p99 {pct(lat, .99) * 1e3:.1f} ms; sampler over the same {wall:.1f} s: {ticks} ticks at 1 Hz, "
          f"{skipped} skipped, worst lateness {after['max_late_s'] * 1e3:.1f} ms (since start)")


def poll_loop(port: int, stop: threading.Event, period: float, counts: list[int]) -> None:
    """One simulated dashboard: poll /api/update?since=<last t> at the page's rate, as page.py does."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    since = None
    while not stop.is_set():
        path = "/api/update" + ("" if since is None else f"?since={since}")
        body = json.loads(get_gzip(conn, path)[0])
        ts = [h["t"][-1] for h in body["history"].values() if h["t"]]
        since = max(ts) if ts else since
        counts[0] += 1
        stop.wait(period)


def bench_page(port: int, child: psutil.Process, seconds: float) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    full, full_gz = get_gzip(conn, "/api/update")
    doc = json.loads(full)
    since = max(h["t"][-1] for h in doc["history"].values() if h["t"])
    time.sleep(1.2)  # one more tick
    upd, upd_gz = get_gzip(conn, f"/api/update?since={since}")
    new_points = len(next(iter(json.loads(upd)["history"].values()))["t"])
    print(f"page update (8 GPUs, {new_points} new tick(s)): {len(upd)} bytes raw, {upd_gz} gzip; "
          f"first full load ({len(next(iter(doc['history'].values()))['t'])} ticks of history): "
          f"{len(full)} bytes raw, {full_gz} gzip; plotly.min.js once (cached a day): "
          f"{len(get(conn, '/static/plotly.min.js'))} bytes")
    period = doc["state"]["interval_s"]  # page.py polls at the sampling interval, between 0.25 and 1 s
    period = min(1.0, max(0.25, period))
    base = None
    for n in (0, 1, 5, 20):
        stop = threading.Event()
        counts = [0]
        threads = [threading.Thread(target=poll_loop, args=(port, stop, period, counts)) for _ in range(n)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # let every client do its first full load before measuring
        c0 = child.cpu_times()
        k0 = counts[0]
        t0 = time.perf_counter()
        time.sleep(seconds)
        c1 = child.cpu_times()
        wall = time.perf_counter() - t0
        polls = counts[0] - k0
        stop.set()
        for t in threads:
            t.join()
        cpu = (c1.user - c0.user + c1.system - c0.system) / wall * 100
        if base is None:
            base = cpu
            print(f"agent CPU, no client: {cpu:.2f}% of one core (sampling 8 GPUs at 1 Hz + classifying)")
        else:
            print(f"agent CPU, {n:2d} polling page(s) ({polls / wall:.1f} updates/s): "
                  f"{cpu:.2f}% of one core, {(cpu - base) / n:.2f}% per client")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.agent:
        run_agent(1.0)
        return
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs "
          f"(shared; load clients and agent on the same machine), load avg {os.getloadavg()[0]:.1f}")
    child = subprocess.Popen([sys.executable, __file__, "--agent"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        time.sleep(3.0)  # a few ticks in, so every device has data and a first phase
        bench_metrics(port, args.clients, args.seconds, gz=False)
        bench_metrics(port, args.clients, args.seconds / 2, gz=True)
        # Whole classifier periods (every 5 s) per window, so each window carries the same classifier work.
        bench_page(port, psutil.Process(child.pid), max(10.0, 5.0 * round(args.seconds / 10)))
        final = state(port)
        print(f"sampler over the whole run: {final['ticks']} ticks, {final['skipped']} skipped, "
              f"worst lateness {final['max_late_s'] * 1e3:.1f} ms")
    finally:
        child.terminate()
        child.wait(timeout=15)


if __name__ == "__main__":
    main()
