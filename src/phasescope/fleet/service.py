"""`phasescope fleet --serve`: re-classify the fleet on a schedule and serve the results.

- `/metrics`: per-GPU phase probabilities and current phase, GPUs per phase, held-idle waste, and how
  long each pass took (query vs classify), for Prometheus to scrape back;
- `/`: a fleet page, one row per GPU with its phase timeline over the range, and the held-idle waste;
- `/api/fleet`: the last pass as JSON (the same document as `phasescope fleet --json`).

A pass runs in a background thread; the views read the last finished pass, so a scrape never waits on
Prometheus. A failing pass keeps the previous results and sets `phasescope_fleet_up` to 0.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from phasescope.classify.model import PhaseModel
from phasescope.errors import PhasescopeError
from phasescope.fleet.judge import HELD_IDLE
from phasescope.fleet.scan import ScanOptions, ScanResult, scan
from phasescope.fleet.summary import COLUMNS, summary
from phasescope.kpi.cost import Prices
from phasescope.schema import PHASES

DEVICE_LABELS = ["uuid", "gpu", "model", "host", "pod", "namespace"]


@dataclass
class _State:
    result: ScanResult | None = None
    error: str = ""
    passes: int = 0
    failures: int = 0


class FleetService:
    """Runs `scan` every `every_s` seconds in a thread; thread-safe reads of the last result."""

    def __init__(
        self,
        opts: ScanOptions,
        every_s: float = 60.0,
        prices: Callable[[str], Prices] | None = None,
        model: PhaseModel | None = None,
        scan_fn: Callable[..., ScanResult] = scan,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.opts = opts
        self.say = say  # gets each new reason a pass failed (the service's log), once until it changes
        self.every_s = every_s
        self.prices = prices
        self.model = model or PhaseModel.load()
        self._scan = scan_fn
        self._state = _State()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[ScanResult], None]] = []

    def on_result(self, fn: Callable[[ScanResult], None]) -> None:
        self._listeners.append(fn)

    def run_once(self) -> None:
        try:
            result = self._scan(self.opts, model=self.model, prices=self.prices)
        except PhasescopeError as exc:  # Prometheus down or refusing: keep the last result, say why
            self._failed(str(exc))
            return
        except Exception as exc:  # a bug must not end the schedule silently while /metrics says up
            self._failed(f"fleet pass failed: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._state.result = result
            self._state.error = ""
            self._state.passes += 1
        for fn in self._listeners:
            fn(result)

    def _failed(self, error: str) -> None:
        with self._lock:
            new = error != self._state.error
            self._state.error = error
            self._state.failures += 1
        if new and self.say is not None:
            self.say(error)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                began = time.monotonic()
                self.run_once()
                self._stop.wait(max(0.0, self.every_s - (time.monotonic() - began)))

        self._thread = threading.Thread(target=loop, name="phasescope-fleet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> _State:
        with self._lock:
            return _State(self._state.result, self._state.error, self._state.passes, self._state.failures)


class FleetCollector:
    """prometheus_client collector over the service's last pass (values built fresh per scrape)."""

    def __init__(self, service: FleetService) -> None:
        self.service = service

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        st = self.service.snapshot()
        up = GaugeMetricFamily("phasescope_fleet_up", "1 when the last fleet pass succeeded, else 0")
        up.add_metric([], 0.0 if st.error or st.result is None else 1.0)
        yield up
        shard = self.service.opts.shard
        info = GaugeMetricFamily(
            "phasescope_fleet_shard_info", "This replica's shard (index of count)", labels=["shard", "shards"]
        )
        info.add_metric([str(shard.index) if shard else "0", str(shard.count) if shard else "1"], 1.0)
        yield info
        r = st.result
        if r is None:
            return
        proba = GaugeMetricFamily(
            "phasescope_fleet_gpu_phase_probability",
            "Probability of each phase in the GPU's newest judged window",
            labels=[*DEVICE_LABELS, "phase"],
        )
        current = GaugeMetricFamily(
            "phasescope_fleet_gpu_phase",
            "1 for the GPU's phase over the range (incl. held_idle, unknown), else 0",
            labels=[*DEVICE_LABELS, "phase"],
        )
        held = GaugeMetricFamily(
            "phasescope_fleet_gpu_held_idle_seconds",
            "Seconds of the range the GPU sat idle while held",
            labels=DEVICE_LABELS,
        )
        interval = GaugeMetricFamily(
            "phasescope_fleet_gpu_sample_interval_seconds",
            "Spacing of the GPU's real samples in the range (repeats dropped; not the query step)",
            labels=DEVICE_LABELS,
        )
        stale = GaugeMetricFamily(
            "phasescope_fleet_gpu_stale",
            "1 when the GPU's exporter served the same readings for minutes (frozen; not classified), else 0",
            labels=DEVICE_LABELS,
        )
        why = GaugeMetricFamily(
            "phasescope_fleet_gpu_unknown_reason_info",
            "1 for each GPU whose phase is unknown, with why (the commonest reason of its windows)",
            labels=[*DEVICE_LABELS, "reason"],
        )
        for v in r.verdicts:
            key = [v.uuid, "" if v.gpu is None else str(v.gpu), v.model, v.host, v.pod, v.namespace]
            if math.isfinite(v.sample_interval_s):
                interval.add_metric(key, v.sample_interval_s)
            stale.add_metric(key, 1.0 if v.stale else 0.0)
            if v.label == "unknown":
                why.add_metric([*key, v.reason or "not told"], 1.0)
            for p in PHASES:
                x = v.probabilities.get(p, math.nan)
                if math.isfinite(x):
                    proba.add_metric([*key, p], x)
            for p in COLUMNS:
                current.add_metric([*key, p], 1.0 if v.label == p else 0.0)
            held.add_metric(key, v.seconds.get(HELD_IDLE, 0.0))
        yield from (proba, current, held, interval, stale, why)
        s = summary(r.verdicts)
        gpus = GaugeMetricFamily("phasescope_fleet_gpus", "GPUs per phase over the range", labels=["phase"])
        for p, n in s["phases"].items():
            gpus.add_metric([p], float(n))
        yield gpus
        w = s["waste"]
        yield GaugeMetricFamily(
            "phasescope_fleet_held_idle_gpu_hours",
            "GPU-hours held but idle over the range",
            value=w["held_idle_gpu_hours"],
        )
        if w["held_idle_usd"] is not None:
            yield GaugeMetricFamily(
                "phasescope_fleet_held_idle_usd",
                "Cost of the held-idle time over the range (USD)",
                value=w["held_idle_usd"],
            )
        dur = GaugeMetricFamily(
            "phasescope_fleet_pass_seconds",
            "Duration of the last pass: total, and by part summed over workers",
            labels=["part"],
        )
        dur.add_metric(["total"], r.wall_s)  # query and classify overlap across workers: they sum above it
        dur.add_metric(["query"], r.query_s)
        dur.add_metric(["classify"], r.classify_s)
        yield dur
        yield GaugeMetricFamily(
            "phasescope_fleet_pass_timestamp_seconds", "When the last pass finished", value=r.finished_at
        )


def metrics_text(service: FleetService) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FleetCollector(service))
    return generate_latest(reg)
