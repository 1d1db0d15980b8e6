"""`/metrics`: a custom prometheus_client Collector that builds all values fresh from the agent per scrape.

Nothing is cached between scrapes and no Gauge objects are kept in sync by the sampler: a scrape reads the
latest tick, the current phase readings and the energy meters, so a device that vanished simply stops
appearing, and a missing reading is an absent sample (Prometheus practice), never a made-up 0.

`phasescope_gpu_info` (one series per GPU) names a MIG instance's parent GPU and profile, from the
source's DeviceInfo (NVML: the parent handle and the instance's name "... MIG 3g.40gb"), the GPU's PCI bus id
where the source names one, and its Kubernetes node (`NODE_NAME`, else the host label).

Pod attribution: each GPU process's host PID goes through `ContainerResolver` (/proc/PID/cgroup) and comes
out as the info metrics `phasescope_gpu_pod_info` / `phasescope_gpu_process_info` (see metric_names.py);
the other series keep their fixed label set. The one thing kept between scrapes is that mapping, redone
when the GPU processes change or after ATTRIBUTION_TTL_S. The host pseudo-device is exported as
`phasescope_host_*` only: CPU figures under a GPU name would make every GPU count include the CPU.

GPU health (ECC, remapped rows, PCIe replays, memory temperature, XIDs) comes from the source's last health
read (`Agent.health()`); a counter the GPU does not offer has no series. A lost GPU keeps its last values: its
last XID is why it was lost.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from phasescope.kpi.cost import mig_parent, mig_profile
from phasescope.prom import names as mn
from phasescope.schema import PHASES, SIGNAL_COLUMN, SIGNAL_NAMES, GpuHealth, ProcessSample
from phasescope.sources.containers import ContainerResolver, merge_labels
from phasescope.sources.host import is_host_device
from phasescope.sources.process_kind import ENGINE_ROLES

if TYPE_CHECKING:
    from phasescope.serve.agent import Agent


_Family = GaugeMetricFamily | CounterMetricFamily


def _family(metric: mn.MetricName, labels: list[str]) -> _Family:
    if metric.kind == "counter":
        return CounterMetricFamily(metric.family, metric.help, labels=labels)
    return GaugeMetricFamily(metric.name, metric.help, labels=labels)


class _HealthFamilies:
    """The health metric families of one scrape, filled per device."""

    def __init__(self, labels: list[str]) -> None:
        self.ecc = _family(mn.GPU_ECC_ERRORS, [*labels, "type", "scope"])
        self.rows = _family(mn.GPU_REMAPPED_ROWS, [*labels, "cause"])
        self.pending = _family(mn.GPU_ROW_REMAP_PENDING, labels)
        self.failure = _family(mn.GPU_ROW_REMAP_FAILURE, labels)
        self.replays = _family(mn.GPU_PCIE_REPLAYS, labels)
        self.mem_temp = _family(mn.GPU_MEM_TEMPERATURE, labels)
        self.xids = _family(mn.GPU_XID_ERRORS, labels)
        self.last_xid = _family(mn.GPU_LAST_XID, labels)
        self.critical_xids = _family(mn.GPU_CRITICAL_XID_ERRORS, labels)
        self.last_critical_xid = _family(mn.GPU_LAST_CRITICAL_XID, labels)

    def add(self, key: list[str], h: GpuHealth) -> None:
        for kind, scopes in sorted(h.ecc.items()):
            for scope, n in sorted(scopes.items()):
                self.ecc.add_metric([*key, kind, scope], float(n))
        for cause, n in sorted(h.remapped_rows.items()):
            self.rows.add_metric([*key, cause], float(n))
        for fam, flag in ((self.pending, h.remap_pending), (self.failure, h.remap_failure)):
            if flag is not None:
                fam.add_metric(key, 1.0 if flag else 0.0)
        for fam, v in ((self.replays, h.pcie_replays), (self.mem_temp, h.mem_temperature_c),
                       (self.xids, h.xid_errors), (self.last_xid, h.last_xid),
                       (self.critical_xids, h.critical_xid_errors),
                       (self.last_critical_xid, h.last_critical_xid)):
            if v is not None:
                fam.add_metric(key, float(v))

    def families(self) -> Iterator[Metric]:
        fams = (self.ecc, self.rows, self.pending, self.failure, self.replays, self.mem_temp, self.xids,
                self.last_xid, self.critical_xids, self.last_critical_xid)
        yield from (f for f in fams if f.samples)


def _add_telemetry_kpis(families: dict[str, _Family], confidence: _Family, key: list[str],
                        kpis: dict[str, Any]) -> None:
    """One device's telemetry-only KPIs (`trace_kpis` figures) into their gauges: a figure with no value
    (None: no rhythm, another phase's figure) has no sample, never a made-up 0; a flag is 1 or 0."""
    for name, fam in families.items():
        fig = kpis.get(name)
        value = fig.get("value") if isinstance(fig, dict) else None
        if isinstance(value, bool):
            fam.add_metric(key, 1.0 if value else 0.0)
        elif value is not None and math.isfinite(float(value)):
            fam.add_metric(key, float(value))
            if name == "step_period_s" and fig is not None and fig.get("confidence") is not None:
                confidence.add_metric(key, float(fig["confidence"]))


ATTRIBUTION_TTL_S = 10.0
# Per GPU: the pod/namespace/container its containers agree on (None: none named), and (pid, labels)
# per containerised process.
_DevicePods = tuple[list[str] | None, list[tuple[str, list[str]]]]


class PhasescopeCollector:
    """Device signals, phase, the training-started alarm, per-phase time and energy, pod attribution, source
    health and this scrape's own duration."""

    def __init__(self, agent: Agent, host: str = "", resolver: ContainerResolver | None = None) -> None:
        self.agent = agent
        self.host = host  # label for devices whose source names no host
        # Off Linux, or with no containers, every lookup finds nothing and the info metrics stay empty.
        self.resolver = resolver if resolver is not None else ContainerResolver()
        self._cache: tuple[tuple[tuple[str, int], ...], float, dict[str, _DevicePods]] | None = None

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
        idle_held = _family(mn.IDLE_HELD, labels)
        held_uuids = set(agent.state.idle_held())
        alarm = _family(mn.TRAINING_ALARM, labels)
        alarm_start = _family(mn.TRAINING_ALARM_START, labels)
        alarm_on = agent.classifier.alarm_enabled  # off: no series at all, rather than a made-up 0
        seconds = _family(mn.PHASE_SECONDS, [*labels, "phase"])
        energy = _family(mn.PHASE_ENERGY, [*labels, "phase"])
        gpu_info = _family(mn.GPU_INFO, [*labels, *mn.GPU_INFO_LABELS])
        pod_info = _family(mn.GPU_POD_INFO, [*labels, *mn.POD_LABELS])
        process_info = _family(mn.GPU_PROCESS_INFO, [*labels, "pid", *mn.POD_LABELS])
        kpi_families = {k: _family(m, labels) for k, m in mn.TELEMETRY_KPI_METRICS.items()}
        period_confidence = _family(mn.STEP_PERIOD_CONFIDENCE, labels)
        telemetry_kpis = agent.state.telemetry_kpis()
        evidence = agent.state.evidence()
        disagreement = _family(mn.PHASE_DISAGREEMENT, labels)
        engine_info = _family(mn.ENGINE_INFO, [*labels, "engine", "role"])
        host_labels = list(mn.HOST_LABELS)
        host_signals = {s: _family(m, host_labels) for s, m in mn.HOST_METRICS.items()}
        by_device = agent.energy_results()
        health = agent.health()
        health_families = _HealthFamilies(labels)
        pods = self._attribution(agent.state.processes())
        node = os.environ.get("NODE_NAME", "").strip()  # the Kubernetes node (downward API), else the host
        for info, latest, reading, _lost in agent.devices():
            if is_host_device(info):
                for s, fam in host_signals.items():
                    v = float(latest[SIGNAL_COLUMN[s]])
                    if math.isfinite(v):
                        fam.add_metric([info.host or self.host, info.name], v)
                continue
            index = "" if info.index is None else str(info.index)
            key = [info.uuid, index, info.name, info.host or self.host]
            # A MIG instance's parent and profile: what prices a MIG GPU once in the fleet (kpi/cost.py).
            parent = mig_parent(info)
            gpu_info.add_metric(
                [*key, parent, mig_profile(info) if parent else "", info.extra.get("pci_bus_id", ""),
                 node or key[3]], 1.0)
            h = health.get(info.uuid)
            if h is not None:
                health_families.add(key, h)
            for s, fam in signals.items():
                v = float(latest[SIGNAL_COLUMN[s]])
                if math.isfinite(v):
                    fam.add_metric(key, v)
            phase = reading.phase if reading else "unknown"
            for p in (*PHASES, "unknown"):
                current.add_metric([*key, p], 1.0 if p == phase else 0.0)
            idle_held.add_metric(key, 1.0 if info.uuid in held_uuids else 0.0)
            if reading is not None:
                for p, v in reading.proba.items():
                    if math.isfinite(v):
                        proba.add_metric([*key, p], v)
                if math.isfinite(reading.confidence):
                    confidence.add_metric(key, reading.confidence)
                if alarm_on:
                    alarm.add_metric(key, 1.0 if reading.training_alarm else 0.0)
                    if reading.training_alarm and reading.alarm_at is not None:
                        alarm_start.add_metric(key, reading.alarm_at)
            _add_telemetry_kpis(kpi_families, period_confidence, key, telemetry_kpis.get(info.uuid, {}))
            claim = evidence.get(info.uuid)
            if claim is not None:
                disagreement.add_metric(key, 1.0 if claim.disagrees else 0.0)
                for engine in claim.engines:
                    engine_info.add_metric([*key, engine, ENGINE_ROLES.get(engine, "")], 1.0)
            dev_energy = by_device.get(info.uuid)
            for p, pe in sorted((dev_energy.phases if dev_energy else {}).items()):
                seconds.add_metric([*key, p], pe.seconds)
                if pe.measured:  # no power or energy reading in this phase yet: absent, not a made-up 0 J
                    energy.add_metric([*key, p], pe.joules)
            merged, named_procs = pods.get(info.uuid, (None, []))
            for pid, values in named_procs:
                process_info.add_metric([*key, pid, *values], 1.0)
            if merged is not None:
                pod_info.add_metric([*key, *merged], 1.0)
        yield from (f for f in signals.values() if f.samples)
        yield from (proba, confidence, current, idle_held, seconds, energy)
        yield from (f for f in (alarm, alarm_start) if f.samples)
        yield from (f for f in (*kpi_families.values(), period_confidence) if f.samples)
        yield from (f for f in (gpu_info, pod_info, process_info, disagreement, engine_info) if f.samples)
        yield from health_families.families()
        yield from (f for f in host_signals.values() if f.samples)

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

    def _attribution(self, processes: dict[str, list[ProcessSample]]) -> dict[str, _DevicePods]:
        """uuid -> _DevicePods. Recomputed when the set of (device, pid) changes, and at least every
        ATTRIBUTION_TTL_S so that a reused PID, or names the runtime wrote late, show up. Scrapes in between
        read no /proc files."""
        key = tuple(sorted((u, p.pid) for u, procs in processes.items() for p in procs))
        cached = self._cache
        now = time.monotonic()
        if cached is not None and cached[0] == key and now - cached[1] < ATTRIBUTION_TTL_S:
            return cached[2]
        out: dict[str, _DevicePods] = {}
        for uuid, pids in itertools.groupby(key, key=lambda kv: kv[0]):
            atts = []
            named_procs = []
            for _, pid in pids:
                att = self.resolver.attribute(pid)
                named = att.labels() if att is not None else {}
                if att is not None and named:  # plain Docker, or no names yet: says nothing useful
                    atts.append(att)
                    named_procs.append((str(pid), [named.get(k, "") for k in mn.POD_LABELS]))
            merged = merge_labels(atts)
            if named_procs:
                out[uuid] = ([merged.get(k, "") for k in mn.POD_LABELS] if merged else None, named_procs)
        self._cache = (key, now, out)  # one assignment: concurrent scrapes at worst compute it twice
        return out


def registry_for(
    agent: Agent, host: str = "", resolver: ContainerResolver | None = None
) -> CollectorRegistry:
    """A registry of its own (not the process-global default): our collector plus the agent process's CPU and
    memory, so a scrape also shows what the agent itself costs. `resolver` maps GPU processes to pods
    (default: this host's /proc and container runtime files)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PhasescopeCollector(agent, host, resolver))
    ProcessCollector(registry=registry)
    return registry
