"""`/metrics`: a custom prometheus_client Collector that builds all values fresh from the agent per scrape.

Nothing is cached between scrapes and no Gauge objects are kept in sync by the sampler: a scrape reads the
latest tick, the current phase readings and the energy meters, so a device that vanished simply stops
appearing, and a missing reading is an absent sample (Prometheus practice), never a made-up 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from phasescope.schema import PHASES, SIGNAL_NAMES
from phasescope.serve import metric_names as mn
from phasescope.sources.base import SIGNAL_COLUMN

if TYPE_CHECKING:
    from phasescope.serve.agent import Agent


def _family(metric: mn.MetricName, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if metric.kind == "counter":
        return CounterMetricFamily(metric.family, metric.help, labels=labels)
    return GaugeMetricFamily(metric.name, metric.help, labels=labels)


class PhasescopeCollector:
    """Device signals, phase, per-phase time and energy, source health and this scrape's own duration."""

    def __init__(self, agent: Agent, host: str = "") -> None:
        self.agent = agent
        self.host = host  # label for devices whose source names no host

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families vary with the devices present

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        agent = self.agent
        labels = list(mn.DEVICE_LABELS)
        signals = {s: _family(mn.SIGNAL_METRICS[s], labels) for s in SIGNAL_NAMES}
        proba = _family(mn.PHASE_PROBABILITY, [*labels, "phase"])
        confidence = _family(mn.PHASE_CONFIDENCE, labels)
        current = _family(mn.PHASE_CURRENT, [*labels, "phase"])
        seconds = _family(mn.PHASE_SECONDS, [*labels, "phase"])
        energy = _family(mn.PHASE_ENERGY, [*labels, "phase"])
        by_device = agent.energy_by_device()
        for info, latest, reading, _lost in agent.devices():
            index = "" if info.index is None else str(info.index)
            key = [info.uuid, index, info.name, info.host or self.host]
            for s, fam in signals.items():
                v = float(latest[SIGNAL_COLUMN[s]])
                if math.isfinite(v):
                    fam.add_metric(key, v)
            phase = reading.phase if reading else "unknown"
            for p in (*PHASES, "unknown"):
                current.add_metric([*key, p], 1.0 if p == phase else 0.0)
            if reading is not None:
                for p, v in reading.proba.items():
                    if math.isfinite(v):
                        proba.add_metric([*key, p], v)
                if math.isfinite(reading.confidence):
                    confidence.add_metric(key, reading.confidence)
            for p, (joules, secs, _covered) in sorted(by_device.get(info.uuid, {}).items()):
                seconds.add_metric([*key, p], secs)
                energy.add_metric([*key, p], joules)
        yield from (f for f in signals.values() if f.samples)
        yield from (proba, confidence, current, seconds, energy)

        up = _family(mn.SOURCE_UP, ["source"])
        up.add_metric([agent.source.name], 1.0 if agent.source_up() else 0.0)
        yield up
        errors = _family(mn.SOURCE_ERRORS, ["source", "call"])
        for call, n in sorted(agent.source.error_counts().items()):
            errors.add_metric([agent.source.name, call], float(n))
        yield errors
        ticks = _family(mn.SAMPLER_TICKS, [])
        ticks.add_metric([], float(agent.sampler.stats.ticks))
        yield ticks
        skipped = _family(mn.SAMPLER_SKIPPED, [])
        skipped.add_metric([], float(agent.sampler.stats.skipped))
        yield skipped
        duration = _family(mn.SCRAPE_DURATION, [])
        duration.add_metric([], time.perf_counter() - started)
        yield duration


def registry_for(agent: Agent, host: str = "") -> CollectorRegistry:
    """A registry of its own (not the process-global default): our collector plus the agent process's CPU and
    memory, so a scrape also shows what the agent itself costs."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PhasescopeCollector(agent, host))
    ProcessCollector(registry=registry)
    return registry
