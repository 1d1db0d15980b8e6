"""Pull every GPU's series out of a Prometheus-compatible server and build one Trace per device.

1. `/api/v1/series` lists the devices that have any known metric in the range (labels only, cheap).
2. Devices are kept or dropped by shard (`shard.py`), then queried in batches with `query_range`:
   one query per batch names the devices by a uuid regex and asks for every known metric at once, and the
   batch is sized so that one answer stays under `max_samples` samples, and so that there are enough
   batches to keep every worker busy (`plan_fetch(parts=...)`, see `scan.py`).
   The agent's `phasescope_gpu_info` names each MIG instance's physical GPU (`parent_uuid`) and profile;
   they are joined by uuid at discovery, so the instances shard, batch and are priced with their GPU.
3. The step-aligned answers land on one time grid per device; a signal held by several series (both
   metric families, or a pod label that came and went) is filled from the first that has a value.
4. Only real samples go on: a query step finer than the scrape interval repeats each sample (Prometheus
   answers every step with the last sample it holds), and dcgm-exporter collecting every 30 s under a 15 s
   scrape stores each reading twice. A grid point whose every signal equals the point before is such a
   repeat and is dropped, so the classifier sees the data's own interval (`sample_interval_s` in the
   trace's meta), never the query step's. Values that stay the same for `FROZEN_S` are a frozen exporter
   (`frozen_since` in the meta), not a steady GPU: real power readings move between samples.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from phasescope.errors import InputError
from phasescope.fleet import attribution, names
from phasescope.fleet.shard import Shard
from phasescope.prom import names as mn
from phasescope.prom.client import PromClient, Series, escape_regex, selector_body
from phasescope.schema import DeviceInfo, FloatArray, Trace, impossible

# Device limits the features use (power limit, memory size): one instant value per device is enough.
LIMIT_SIGNALS = ("power_limit", "mem_total")
GPU_INFO = mn.GPU_INFO.name  # the agent's MIG parent and profile per device (prom/names.py)
# Series the dcgm-exporter compat rules derive from the agent's own (deploy/prometheus/dcgm_compat.yml):
# the fleet reads the agent's series themselves, so these would only double the queries, and a MIG
# instance the agent names `GPU-.../giN` would come back as a second device keyed `.../giN/giN`. (The
# limits query keeps them: its answers count only for devices found here, agent values first.)
COMPAT_EXCLUDE = 'exporter!="phasescope-compat"'
# A device whose readings have not changed for this long, while its series kept being scraped, is read from
# a frozen exporter (a hung DCGM keeps serving its last values). Five minutes: far longer than any
# collection interval in use (dcgm-exporter's default is 30 s), and a real power reading moves between
# consecutive samples, idle or not.
FROZEN_S = 300.0


@dataclass
class FetchStats:
    devices: int = 0
    queries: int = 0
    series: int = 0
    samples: int = 0
    seconds: float = 0.0


@dataclass
class _Device:
    key: str
    label_name: str  # the label that names it in queries (uuid or UUID)
    labels: dict[str, str] = field(default_factory=dict)
    metrics: set[str] = field(default_factory=set)
    parent: str = ""  # a MIG instance's physical GPU, from the agent's phasescope_gpu_info ("" if none)
    profile: str = ""  # its GPU-instance profile ("3g.40gb"), from the same series
    target: dict[str, str] = field(default_factory=dict)  # its scrape target's own labels (`up`'s), if known

    @property
    def ident(self) -> str:
        """The value of its naming label: dcgm-exporter's UUID is the key without a MIG instance's `/giN`,
        while an agent replaying a dcgm-exporter scrape names an instance `GPU-.../giN` in full."""
        return self.labels.get(self.label_name) or self.key.split("/gi")[0]

    @property
    def gpu(self) -> str:
        """The physical GPU's key: the agent's parent uuid for its MIG instances; dcgm-exporter names the
        parent in the uuid label itself (the key without its `/giN`)."""
        return self.parent or self.ident


def _matchers(*parts: str) -> str:
    return "{" + ",".join(p for p in parts if p) + "}"


def _family_rank(metric: str) -> int:
    return 0 if metric.startswith(names.PREFIX) else 1  # the agent's own names win over dcgm-exporter's


def discover(
    client: PromClient, start: float, end: float, selector: str = "", mmap: names.MetricMap | None = None
) -> list[_Device]:
    mmap = mmap or names.metric_map()
    match = _matchers(f'__name__=~"{mmap.name_regex()}"', COMPAT_EXCLUDE, selector_body(selector))
    devices: dict[str, _Device] = {}
    with client.clock.stage("series"):
        listed = client.series(match, start, end)
    for labels in listed:
        key = names.device_key(labels)
        if key is None:
            continue  # a series that names no device (an aggregate): nothing to classify
        label_name = next(n for n in names.DEVICE_LABELS if labels.get(n))
        d = devices.setdefault(key, _Device(key, label_name))
        d.metrics.add(labels.get("__name__", ""))
        for k, v in labels.items():
            if v and k != "__name__":
                d.labels[k] = v  # later series win: pod labels present on some series only still show
    targets = scrape_targets(client, start, end, {d.labels.get("job", "") for d in devices.values()})
    for d in devices.values():
        d.target = targets.get((d.labels.get("job", ""), d.labels.get("instance", "")), {})
    if any(d.label_name == "uuid" for d in devices.values()):  # the agent's devices: its MIG facts
        with client.clock.stage("gpu_info"):
            mig = gpu_info(client, start, end)
        for key, (parent, profile) in mig.items():
            if key in devices:
                devices[key].parent, devices[key].profile = parent, profile
    # A physical GPU's rows side by side (the agent's MIG uuids sort apart from their parent's):
    # `_batches` keeps them in one batch.
    return sorted(devices.values(), key=lambda d: (d.gpu, d.key))


def scrape_targets(
    client: PromClient, start: float, end: float, jobs: Iterable[str]
) -> dict[tuple[str, str], dict[str, str]]:
    """(job, instance) -> the labels Prometheus gave that scrape target, from its `up` series.

    Under a ServiceMonitor or PodMonitor the target labels `pod`, `namespace` and `container` name the
    exporter's own pod; the exporter's labels of the same names (the GPU's workload) are then renamed
    `exported_*`. A GPU with no workload has no `exported_pod`, and its plain `pod` is the exporter's: knowing
    the target's labels is what tells the two apart (`_workload_label`)."""
    wanted = sorted(j for j in jobs if j)
    if not wanted:
        return {}
    regex = "|".join(escape_regex(j) for j in wanted)
    out: dict[tuple[str, str], dict[str, str]] = {}
    with client.clock.stage("up"):
        listed = client.series(f'{{__name__="up",job=~"{regex}"}}', start, end)
    for labels in listed:
        out[(labels.get("job", ""), labels.get("instance", ""))] = {
            k: v for k, v in labels.items() if k != "__name__"
        }
    return out


def _workload_label(labels: Mapping[str, str], target: Mapping[str, str], candidates: Iterable[str]) -> str:
    """The first of `candidates` set on the series that names the GPU's workload: a label whose value is the
    scrape target's own (the exporter's pod, its namespace) names the exporter, so it is skipped."""
    for n in candidates:
        v = labels.get(n)
        if v and target.get(n) != v:
            return v
    return ""


def gpu_info_from_label_sets(label_sets: Iterable[Mapping[str, str]]) -> dict[str, tuple[str, str]]:
    """device key -> (parent uuid, MIG profile) of the agent's MIG instances, from its `phasescope_gpu_info`
    series. A uuid whose series disagree on the parent over the range (a damaged source) is left out, so it
    is priced as a whole GPU rather than against a parent picked at random."""
    seen: dict[str, set[tuple[str, str]]] = {}
    for labels in label_sets:
        key = names.device_key(labels)
        parent = labels.get("parent_uuid", "")
        if key is not None and parent and parent != key:
            seen.setdefault(key, set()).add((parent, labels.get("mig_profile", "")))
    out: dict[str, tuple[str, str]] = {}
    for key, facts in seen.items():
        parents = {p for p, _ in facts}
        profiles = {m for _, m in facts if m}
        if len(parents) == 1:
            out[key] = (parents.pop(), profiles.pop() if len(profiles) == 1 else "")
    return out


def gpu_info(client: PromClient, start: float, end: float) -> dict[str, tuple[str, str]]:
    """`gpu_info_from_label_sets` over the agent's info series present in [start, end] (one /api/v1/series
    call; no `--selector`: only devices already found are touched). Only MIG instances' series are asked
    for (`parent_uuid!=""`): a fleet without MIG gets an empty answer, not one series per GPU."""
    return gpu_info_from_label_sets(client.series(f'{{__name__="{GPU_INFO}",parent_uuid!=""}}', start, end))


def _batches(devices: list[_Device], points: int, max_samples: int) -> Iterator[list[_Device]]:
    """Groups of devices with one naming label, each asking for at most `max_samples` samples."""
    by_label: dict[str, list[_Device]] = {}
    for d in devices:
        by_label.setdefault(d.label_name, []).append(d)
    for group in by_label.values():
        batch: list[_Device] = []
        size = 0
        for d in group:
            cost = max(len(d.metrics), 1) * points
            # A MIG GPU's instances stay in one batch: their price shares are worked out together.
            if batch and size + cost > max_samples and d.gpu != batch[-1].gpu:
                yield batch
                batch, size = [], 0
            batch.append(d)
            size += cost
        if batch:
            yield batch


def in_shard(devices: list[_Device], shard: Shard | None) -> list[_Device]:
    """The devices this replica owns. The physical GPU's uuid decides, so a MIG GPU's instances stay on one
    replica and share its price there (`kpi.cost.mig_prices`); outside MIG that is the device's own uuid."""
    return devices if shard is None else [d for d in devices if shard.owns(d.gpu)]


def _device_info(d: _Device) -> DeviceInfo:
    lab = d.labels
    gpu = names.first_label(lab, names.INDEX_LABELS)
    extra = {
        k: v
        for k, v in (
            ("pod", _workload_label(lab, d.target, names.POD_LABELS)),
            ("namespace", _workload_label(lab, d.target, names.NAMESPACE_LABELS)),
            ("container", _workload_label(lab, d.target, names.CONTAINER_LABELS)),
            ("instance", lab.get("instance", "")),
            ("job", lab.get("job", "")),
            # MIG slices: its share of the price (dcgm-exporter's label, else the agent's info metric)
            ("GPU_I_PROFILE", lab.get("GPU_I_PROFILE", "") or d.profile),
        )
        if v
    }
    return DeviceInfo(
        uuid=d.key,
        name=names.first_label(lab, names.MODEL_LABELS),
        index=int(gpu) if gpu.isdigit() else None,
        host=names.first_label(lab, names.HOST_LABELS),
        parent_uuid=d.gpu if d.gpu != d.key else None,
        extra=extra,
    )


def build_traces(
    devices: list[_Device],
    series: list[Series],
    start: float,
    step: float,
    n_points: int,
    mmap: names.MetricMap,
    limits: dict[str, dict[str, float]] | None = None,
) -> list[Trace]:
    """One Trace per device on the query grid; grid points where the device had no sample are dropped."""
    grids: dict[str, dict[str, FloatArray]] = {d.key: {} for d in devices}
    for s in sorted(series, key=lambda s: _family_rank(s.labels.get("__name__", ""))):
        key = names.device_key(s.labels)
        target = grids.get(key) if key is not None else None
        mapped = mmap.metrics.get(s.labels.get("__name__", ""))
        if target is None or mapped is None or s.time.size == 0:
            continue
        signal, factor = mapped
        idx = np.rint((s.time - start) / step).astype(np.int64)
        ok = (idx >= 0) & (idx < n_points)
        col = target.get(signal)
        if col is None:
            col = target[signal] = np.full(n_points, np.nan)
        fill = ok.copy()
        fill[ok] = np.isnan(col[idx[ok]])
        col[idx[fill]] = s.values[fill] * factor
    grid_time = start + step * np.arange(n_points, dtype=np.float64)
    out: list[Trace] = []
    for d in devices:
        cols = grids[d.key]
        if not cols:
            continue
        have = np.zeros(n_points, dtype=bool)
        for c in cols.values():
            have |= np.isfinite(c)
        if not have.any():
            continue
        dropped = {}
        for sig, col in cols.items():  # a reading no GPU can give is missing, never computed with
            bad = impossible(sig, col)
            if bad.any():
                col[bad] = np.nan
                dropped[sig] = int(bad.sum())
        time_have = grid_time[have]
        new = fresh(np.column_stack([v[have] for v in cols.values()]))
        kept = {k: v[have][new] for k, v in cols.items()}
        for sig, value in (limits or {}).get(d.key, {}).items():
            kept[sig] = np.full(int(new.sum()), value)
        meta: dict[str, object] = {"source": "prometheus", "step_s": step}
        meta.update(resolution(time_have, new, cols["power"][have] if "power" in cols else None))
        if dropped:
            meta["impossible_values"] = dropped
        out.append(Trace(_device_info(d), time_have[new], kept, meta))
    return out


def fresh(values: FloatArray) -> np.ndarray:
    """Per row of `values` (one row per grid point, one column per signal): True for the rows that are real
    samples, False for repeats of the sample before.

    The liveliest column (the one whose value changes on the largest share of rows: power, as a rule) shows
    how many grid points one real sample spans, `r`. Where `r` is 1 every row is kept. Otherwise a row is kept
    where any value changed, and inside a run of identical rows every `r`-th one, so a steady stretch (an
    idle GPU's zero utilisation, where no power series exists) still has a sample per real interval."""
    n = values.shape[0]
    if n < 2:
        return np.ones(n, dtype=bool)
    same = (values[1:] == values[:-1]) | (np.isnan(values[1:]) & np.isnan(values[:-1]))
    both = np.isfinite(values[1:]) & np.isfinite(values[:-1])
    share = (~same & both).sum(axis=0) / np.maximum(both.sum(axis=0), 1)  # of the rows where it has values
    lively = float(share.max()) if share.size else 0.0
    r = round(1.0 / lively) if lively > 0 else 1
    if r <= 1:
        return np.ones(n, dtype=bool)
    changed = np.concatenate([[True], ~same.all(axis=1)])
    run = np.cumsum(changed) - 1
    starts = np.flatnonzero(changed)
    return (np.arange(n) - starts[run]) % r == 0


def resolution(time: FloatArray, new: np.ndarray, power: FloatArray | None) -> dict[str, float]:
    """`sample_interval_s`: the median spacing of the real samples (NaN with fewer than two); and
    `frozen_since` (Unix s) where the power reading, a value that moves between real samples, last changed
    `FROZEN_S` or more before the device's last grid point: the exporter serves stale values."""
    t_new = time[new]
    out = {"sample_interval_s": float(np.median(np.diff(t_new))) if t_new.size > 1 else float("nan")}
    if power is not None:
        ok = np.isfinite(power)
        p, t = power[ok], time[ok]
        if t.size >= 3:
            moved = np.flatnonzero(p[1:] != p[:-1])
            since = float(t[moved[-1] + 1]) if moved.size else float(t[0])
            if t[-1] - since >= FROZEN_S:
                out["frozen_since"] = since
    return out


def fetch_limits(
    client: PromClient, devices: list[_Device], end: float, range_s: float
) -> dict[str, dict[str, float]]:
    """Latest power limit and memory size per device (one small instant query per metric name)."""
    keys = {d.key for d in devices}
    out: dict[str, dict[str, float]] = {}
    window = f"{max(int(range_s), 1)}s"
    mmap = names.metric_map(LIMIT_SIGNALS)
    for metric, (signal, factor) in sorted(mmap.metrics.items(), key=lambda kv: _family_rank(kv[0])):
        for labels, value in client.query(f"last_over_time({metric}[{window}])", end):
            key = names.device_key(labels)
            if key in keys and np.isfinite(value):
                out.setdefault(key, {}).setdefault(signal, value * factor)
    return out


@dataclass
class FetchPlan:
    """What one pass asks for: the devices in batches, the grid, and each device's limits."""

    start: float
    end: float
    step: float
    n_points: int
    selector_body: str
    mmap: names.MetricMap
    devices: list[_Device]
    batches: list[list[_Device]]
    limits: dict[str, dict[str, float]]
    pods: dict[str, dict[str, str]]  # device key -> the agent's pod attribution (fleet/attribution.py)


_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_WORKLOAD = ("pod", "namespace", "container")


def split_selector(selector: str) -> tuple[list[tuple[str, str, str]], str]:
    """(the matchers on pod/namespace/container, the rest of the selector as a matcher body).

    Those name the GPU's workload, which the series may hold under `exported_*` (a ServiceMonitor's scrape)
    or not at all (the agent's pod-info series): they are applied to each device's workload labels as the
    table shows them (`_workload_matches`), not sent to Prometheus, where `namespace` could match the
    exporter's own namespace instead."""
    body = selector_body(selector)
    found = list(_MATCHER.finditer(body))
    if not body or "".join(m.group(0) for m in found) != body:
        return [], body  # not plain matchers (or none): sent as written
    workload = [(m.group(1), m.group(2), m.group(3).replace('\\"', '"')) for m in found
                if m.group(1) in _WORKLOAD]
    rest = ",".join(m.group(0).strip().rstrip(",") for m in found if m.group(1) not in _WORKLOAD)
    return workload, rest


def _workload_matches(labels: Mapping[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        got = labels.get(name, "")
        hit = got == value if op in ("=", "!=") else re.fullmatch(value, got) is not None
        if hit != (op in ("=", "=~")):
            return False
    return True


def plan_fetch(
    client: PromClient,
    *,
    start: float,
    end: float,
    step: float = 1.0,
    selector: str = "",
    shard: Shard | None = None,
    max_samples: int = 1_000_000,
    parts: int = 1,
) -> FetchPlan:
    """Discover the devices (after the shard) and cut them into batches of at most `max_samples`
    samples, and into at least `parts` batches where there are that many devices, so that
    several workers get even shares."""
    if not end > start:
        raise InputError("--since", "time range", "an end after the start", f"{start}..{end}")
    mmap = names.metric_map()
    workload, body = split_selector(selector)
    devices = discover(client, start, end, body, mmap)
    devices = in_shard(devices, shard)
    with client.clock.stage("attribution"):
        pods = attribution.fetch(client, start, end) if devices else {}
    if workload:
        devices = [d for d in devices if _workload_matches(_workload_of(d, pods), workload)]
    n_points = int(np.floor((end - start) / step + 1e-9)) + 1
    total = sum(max(len(d.metrics), 1) for d in devices) * n_points
    budget = min(max_samples, max(-(-total // max(parts, 1)), 1))
    with client.clock.stage("limits"):
        limits = fetch_limits(client, devices, end, end - start) if devices else {}
    batches = list(_batches(devices, n_points, budget))
    return FetchPlan(start, end, step, n_points, body, mmap, devices, batches, limits, pods)


def _workload_of(d: _Device, pods: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The pod, namespace and container the table will show for `d` (its own series' workload labels, else
    the agent's pod attribution, as `attribution.attach` fills them in)."""
    own = {k: v for k, v in _device_info(d).extra.items() if k in _WORKLOAD}
    return own if own.get("pod") or own.get("namespace") else {**own, **pods.get(d.key, {})}


def fetch_batch(client: PromClient, plan: FetchPlan, batch: list[_Device]) -> tuple[list[Trace], int, int]:
    """One `query_range` for a batch of devices: (their Traces, series, samples)."""
    label = batch[0].label_name
    regex = "|".join(sorted({escape_regex(d.ident) for d in batch}))
    metrics = "|".join(sorted({m for d in batch for m in d.metrics if m in plan.mmap.metrics}))
    query = _matchers(f'__name__=~"{metrics}"', f'{label}=~"{regex}"', COMPAT_EXCLUDE, plan.selector_body)
    series = client.query_range(query, plan.start, plan.end, plan.step)  # its stages: "http", "decode"
    samples = sum(s.time.size for s in series)
    with client.clock.stage("assemble"):
        traces = build_traces(batch, series, plan.start, plan.step, plan.n_points, plan.mmap, plan.limits)
        return attribution.attach(traces, plan.pods), len(series), samples


def fetch_traces(
    client: PromClient,
    *,
    start: float,
    end: float,
    step: float = 1.0,
    selector: str = "",
    shard: Shard | None = None,
    max_samples: int = 1_000_000,
    concurrency: int = 2,
    stats: FetchStats | None = None,
) -> list[Trace]:
    """Every device's Trace over [start, end] at `step` seconds (see the module doc), `concurrency`
    queries in flight. `scan` does not use this: it classifies each batch as it lands."""
    t0 = time.perf_counter()
    stats = stats if stats is not None else FetchStats()
    plan = plan_fetch(
        client, start=start, end=end, step=step, selector=selector, shard=shard, max_samples=max_samples
    )
    stats.devices = len(plan.devices)
    lock = threading.Lock()

    def one(batch: list[_Device]) -> list[Trace]:
        traces, n_series, n_samples = fetch_batch(client, plan, batch)
        with lock:
            stats.queries += 1
            stats.series += n_series
            stats.samples += n_samples
        return traces

    out: list[Trace] = []
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for traces in pool.map(one, plan.batches):
            out.extend(traces)
    stats.seconds = time.perf_counter() - t0
    return out
