"""One fleet pass: fetch every device's series from Prometheus, classify them, time both halves.

The parent process lists the devices and cuts them into batches (`collect.plan_fetch`). With several
workers, each batch then goes to a worker process that queries it and classifies it, so that while
Prometheus answers one worker's query another classifies the batch it has just received. The
workers are forked from the parent, so they share its loaded model and price table instead of
rebuilding them. With one worker, or one batch, everything runs in the parent, batch after batch.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from phasescope.classify.model import PhaseModel
from phasescope.errors import PhasescopeError, SourceError
from phasescope.fleet.collect import FetchPlan, FetchStats, fetch_batch, plan_fetch
from phasescope.fleet.judge import DEFAULT_HELD_MEM_BYTES, DeviceVerdict, judge_all
from phasescope.fleet.shard import Shard
from phasescope.fleet.summary import summary
from phasescope.kpi.cost import Prices
from phasescope.prom.client import PromClient, StageClock

# Batches per worker: several, so that a worker that drew slow batches does not leave the others idle
# at the end of the pass.
BATCHES_PER_WORKER = 4


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one, as in a container)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (0 where the OS has no getrusage)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux kilobytes


@dataclass
class ScanOptions:
    url: str
    since_s: float = 3600.0
    end: float | None = None  # Unix seconds; None = now
    step_s: float = 1.0
    selector: str = ""
    shard: Shard | None = None
    held_mem_bytes: float = DEFAULT_HELD_MEM_BYTES
    max_samples: int = 1_000_000
    workers: int = 0  # processes that query and classify batches; 0 = the CPUs available
    timeout_s: float = 120.0


@dataclass
class ScanResult:
    start: float
    end: float
    verdicts: list[DeviceVerdict]
    stats: FetchStats
    query_s: float  # listing the devices, plus each batch's query and decoding, summed over workers
    classify_s: float  # each batch's classification, summed over workers
    model_version: str
    shard: str = ""
    finished_at: float = field(default_factory=time.time)
    wall_s: float = 0.0  # the pass end to end; below query_s + classify_s when workers overlap
    workers: int = 1
    query_cpu_s: float = 0.0  # CPU time of this side (not the server's) in the query part
    classify_cpu_s: float = 0.0
    # Wall and CPU seconds per stage, summed over the workers: the listing calls ("series", "up", "gpu_info",
    # "attribution", "limits"), then per batch "http" (Prometheus evaluating and sending), "decode",
    # "assemble" (the Traces) and "classify" (model, segments and the fleet verdict).
    stages: StageClock = field(default_factory=StageClock)
    # Peak resident memory of the busiest worker process (of this process with one worker), what a replica
    # must budget per worker on top of the parent.
    worker_peak_rss_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "shard": self.shard,
            "model_version": self.model_version,
            "timing": {
                "wall_s": round(self.wall_s, 3),
                "query_s": round(self.query_s, 3),
                "classify_s": round(self.classify_s, 3),
                "query_cpu_s": round(self.query_cpu_s, 3),
                "classify_cpu_s": round(self.classify_cpu_s, 3),
                "workers": self.workers,
                "stages": self.stages.to_dict(),
                "worker_peak_rss_bytes": self.worker_peak_rss_bytes,
            },
            "fetched": {
                "devices": self.stats.devices,
                "queries": self.stats.queries,
                "series": self.stats.series,
                "samples": self.stats.samples,
            },
            "summary": summary(self.verdicts),
            "devices": [v.to_dict() for v in self.verdicts],
        }


@dataclass
class _BatchResult:
    verdicts: list[DeviceVerdict]
    series: int
    samples: int
    query_s: float
    classify_s: float
    query_cpu_s: float
    classify_cpu_s: float
    stages: StageClock
    peak_rss_bytes: int


@dataclass
class _Job:
    client: PromClient
    plan: FetchPlan
    model: PhaseModel
    prices: Callable[[str], Prices] | None
    held_mem_bytes: float

    def run(self, i: int) -> _BatchResult:
        outer, self.client.clock = self.client.clock, StageClock()  # this batch's stages alone
        try:
            w0, c0 = time.perf_counter(), time.process_time()
            traces, n_series, n_samples = fetch_batch(self.client, self.plan, self.plan.batches[i])
            w1, c1 = time.perf_counter(), time.process_time()
            with self.client.clock.stage("classify"):
                verdicts = judge_all(traces, self.model, self.prices, self.held_mem_bytes)
            w2, c2 = time.perf_counter(), time.process_time()
            stages = self.client.clock
        finally:
            self.client.clock = outer
        return _BatchResult(
            verdicts, n_series, n_samples, w1 - w0, w2 - w1, c1 - c0, c2 - c1, stages, peak_rss_bytes()
        )


_WORKER_JOB: _Job | None = None  # set once in each worker process


def _worker_init(opts: ScanOptions, plan: FetchPlan, model: PhaseModel, prices: Any) -> None:
    global _WORKER_JOB
    # Ctrl-C is the parent's to handle (it ends the pool); a worker that also caught it would print a
    # traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    client = PromClient(opts.url, timeout_s=opts.timeout_s)  # its own connection, not the parent's
    _WORKER_JOB = _Job(client, plan, model, prices, opts.held_mem_bytes)


def _worker_run(i: int) -> _BatchResult:
    assert _WORKER_JOB is not None
    try:
        return _WORKER_JOB.run(i)
    except PhasescopeError as exc:  # re-raised in the parent; InputError cannot be rebuilt from pickle
        raise SourceError(str(exc)) from None


def _in_workers(
    opts: ScanOptions, plan: FetchPlan, model: PhaseModel, prices: Any, n: int
) -> list[_BatchResult]:
    # fork: the workers inherit the parsed model and the price callable instead of receiving copies.
    # Parse every booster here first: they are parsed lazily, and parsing in a forked child after the
    # parent's OpenMP has run can hang (libgomp does not survive fork).
    model.warm_up()
    ctx = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(n, ctx, initializer=_worker_init, initargs=(opts, plan, model, prices))
    try:
        with pool:
            return list(pool.map(_worker_run, range(len(plan.batches))))
    except KeyboardInterrupt:  # do not wait for the batches already handed out
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    except BrokenProcessPool:
        raise SourceError(
            f"fleet: a worker process died while classifying {len(plan.devices)} devices "
            "(out of memory? try fewer --workers or a smaller --batch-samples)"
        ) from None


def scan(
    opts: ScanOptions, model: PhaseModel | None = None, prices: Callable[[str], Prices] | None = None
) -> ScanResult:
    model = model or PhaseModel.load()
    end = opts.end if opts.end is not None else time.time()
    start = end - opts.since_s
    workers = opts.workers if opts.workers > 0 else available_cpus()
    if "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    stats = FetchStats()
    t0, c0 = time.perf_counter(), time.process_time()
    with PromClient(opts.url, timeout_s=opts.timeout_s) as client:
        plan = plan_fetch(
            client,
            start=start,
            end=end,
            step=opts.step_s,
            selector=opts.selector,
            shard=opts.shard,
            max_samples=opts.max_samples,
            parts=workers * BATCHES_PER_WORKER if workers > 1 else 1,
        )
        plan_s, plan_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        stages = client.clock  # the listing calls'; each batch brings its own
        workers = min(workers, len(plan.batches))
        results: list[_BatchResult] | Iterator[_BatchResult]
        if workers > 1:
            results = _in_workers(opts, plan, model, prices, workers)
        else:
            job = _Job(client, plan, model, prices, opts.held_mem_bytes)
            results = [job.run(i) for i in range(len(plan.batches))]
    stats.devices = len(plan.devices)
    verdicts: list[DeviceVerdict] = []
    query_s, query_cpu_s, classify_s, classify_cpu_s = plan_s, plan_cpu_s, 0.0, 0.0
    worker_rss = 0
    for r in results:
        verdicts.extend(r.verdicts)
        stats.queries += 1
        stats.series += r.series
        stats.samples += r.samples
        query_s += r.query_s
        query_cpu_s += r.query_cpu_s
        classify_s += r.classify_s
        classify_cpu_s += r.classify_cpu_s
        stages.add(r.stages)
        worker_rss = max(worker_rss, r.peak_rss_bytes)
    wall_s = time.perf_counter() - t0
    stats.seconds = wall_s
    return ScanResult(
        start,
        end,
        verdicts,
        stats,
        query_s,
        classify_s,
        model.version,
        str(opts.shard) if opts.shard else "",
        wall_s=wall_s,
        workers=max(workers, 1),
        query_cpu_s=query_cpu_s,
        classify_cpu_s=classify_cpu_s,
        stages=stages,
        worker_peak_rss_bytes=worker_rss,
    )
