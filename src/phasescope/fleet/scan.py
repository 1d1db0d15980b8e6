"""One fleet pass: fetch every device's series from Prometheus, classify them, time both halves."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phasescope.classify.model import PhaseModel
from phasescope.fleet.collect import FetchStats, fetch_traces
from phasescope.fleet.judge import DEFAULT_HELD_MEM_BYTES, DeviceVerdict, judge_all
from phasescope.fleet.prom import PromClient
from phasescope.fleet.shard import Shard
from phasescope.fleet.summary import summary
from phasescope.kpi.cost import Prices


@dataclass
class ScanOptions:
    url: str
    since_s: float = 3600.0
    end: float | None = None  # Unix seconds; None = now
    step_s: float = 1.0
    selector: str = ""
    shard: Shard | None = None
    held_mem_bytes: float = DEFAULT_HELD_MEM_BYTES
    max_samples: int = 4_000_000
    concurrency: int = 2
    timeout_s: float = 120.0


@dataclass
class ScanResult:
    start: float
    end: float
    verdicts: list[DeviceVerdict]
    stats: FetchStats
    query_s: float
    classify_s: float
    model_version: str
    shard: str = ""
    finished_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "shard": self.shard,
            "model_version": self.model_version,
            "timing": {"query_s": round(self.query_s, 3), "classify_s": round(self.classify_s, 3)},
            "fetched": {
                "devices": self.stats.devices,
                "queries": self.stats.queries,
                "series": self.stats.series,
                "samples": self.stats.samples,
            },
            "summary": summary(self.verdicts),
            "devices": [v.to_dict() for v in self.verdicts],
        }


def scan(
    opts: ScanOptions, model: PhaseModel | None = None, prices: Callable[[str], Prices] | None = None
) -> ScanResult:
    model = model or PhaseModel.load()
    end = opts.end if opts.end is not None else time.time()
    start = end - opts.since_s
    stats = FetchStats()
    t0 = time.perf_counter()
    with PromClient(opts.url, timeout_s=opts.timeout_s) as client:
        traces = fetch_traces(
            client,
            start=start,
            end=end,
            step=opts.step_s,
            selector=opts.selector,
            shard=opts.shard,
            max_samples=opts.max_samples,
            concurrency=opts.concurrency,
            stats=stats,
        )
    t1 = time.perf_counter()
    verdicts = judge_all(traces, model, prices, opts.held_mem_bytes)
    t2 = time.perf_counter()
    return ScanResult(
        start, end, verdicts, stats, t1 - t0, t2 - t1, model.version, str(opts.shard) if opts.shard else ""
    )
