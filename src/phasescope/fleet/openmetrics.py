"""Write Traces as OpenMetrics text, to backfill a recording into Prometheus:

    phasescope.fleet.openmetrics.write(traces, "data.om", family="phasescope")
    promtool tsdb create-blocks-from openmetrics data.om /prometheus/data

`family` picks the metric names: "phasescope" (the agent's, `serve.metric_names`) or "dcgm"
(dcgm-exporter's, `sources.replay.dcgm_prom.FIELDS`, in that exporter's units and labels). OpenMetrics
wants each metric family contiguous and each series' timestamps increasing; both hold here since a
family is written for every trace before the next family starts. The phasescope family also carries the
agent's `phasescope_gpu_info` for MIG instances (parent GPU, profile); the dcgm family names an instance as
dcgm-exporter does (its GPU's `UUID`, `GPU_I_ID`, `GPU_I_PROFILE`), so a backfilled MIG GPU is priced once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

import numpy as np

from phasescope.kpi.cost import mig_parent, mig_profile
from phasescope.prom.names import GPU_INFO, SIGNAL_METRICS
from phasescope.schema import PAPER_SIGNALS, SIGNALS, Trace
from phasescope.sources.replay.dcgm_prom import FIELDS as DCGM_FIELDS

Family = Literal["phasescope", "dcgm"]


def _dcgm_field(signal: str) -> tuple[str, float] | None:
    for name, (sig, factor) in DCGM_FIELDS.items():
        if sig == signal:
            return name, factor
    return None


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _instance_ids(traces: Sequence[Trace]) -> dict[str, str]:
    """MIG instance uuid -> its GPU_I_ID for the dcgm family: the recording's own where it has one, else
    its place among its GPU's instances here (1, 2, ...): what tells them apart under the parent's UUID."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for t in traces:
        d = t.device
        parent = mig_parent(d)
        if parent:
            seen[parent] = seen.get(parent, 0) + 1
            out[d.uuid] = d.extra.get("GPU_I_ID") or str(seen[parent])
    return out


def _labels(trace: Trace, family: Family, gi: str = "", target: Mapping[str, str] | None = None) -> str:
    d = trace.device
    gpu = "" if d.index is None else str(d.index)
    if family == "dcgm":
        pairs = [
            ("gpu", gpu),
            # dcgm-exporter names a MIG instance by its GPU's UUID and the GPU instance (fleet/names.py).
            ("UUID", (d.parent_uuid or d.uuid) if gi else d.uuid),
            ("device", f"nvidia{gpu or 0}"),
            ("modelName", d.name),
            ("Hostname", d.host),
        ]
        if gi:
            pairs += [("GPU_I_ID", gi), ("GPU_I_PROFILE", mig_profile(d))]
    else:
        pairs = [("uuid", d.uuid), ("gpu", gpu), ("model", d.name), ("host", d.host)]
    pairs += [(k, d.extra[k]) for k in ("pod", "namespace", "container") if d.extra.get(k)]
    if target:
        pairs = [(f"exported_{k}" if k in target else k, v) for k, v in pairs] + list(target.items())
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def write_stream(
    traces: Sequence[Trace],
    out: IO[str],
    family: Family = "phasescope",
    signals: Iterable[str] = PAPER_SIGNALS,
    targets: Mapping[str, Mapping[str, str]] | None = None,
) -> int:
    """Write OpenMetrics text; returns the number of samples written."""
    n = 0
    targets = targets or {}
    gis = _instance_ids(traces) if family == "dcgm" else {}
    for sig in signals:
        if family == "dcgm":
            mapped = _dcgm_field(sig)
            if mapped is None:
                continue
            name, factor = mapped
        else:
            name, factor = SIGNAL_METRICS[sig].name, 1.0
        out.write(f"# TYPE {name} gauge\n# HELP {name} {SIGNALS[sig].help}\n")
        for t in traces:
            col = t[sig]
            ok = np.isfinite(col) & np.isfinite(t.time)
            if not ok.any():
                continue
            target = targets.get(t.device.host)
            prefix = f"{name}{{{_labels(t, family, gis.get(t.device.uuid, ''), target)}}} "
            values = np.round(col[ok] / factor, 6)
            times = np.round(t.time[ok], 3)
            out.write(
                "".join(
                    f"{prefix}{v:.10g} {ts:.3f}\n"
                    for v, ts in zip(values.tolist(), times.tolist(), strict=True)
                )
            )
            n += int(ok.sum())
    if family == "phasescope":
        n += _write_gpu_info(traces, out)
    n += _write_up(traces, out, targets)
    out.write("# EOF\n")
    return n


def _write_up(traces: Sequence[Trace], out: IO[str], targets: Mapping[str, Mapping[str, str]]) -> int:
    """`up` = 1 for each scrape target, at every time one of its host's traces has a sample."""
    hosts = sorted({t.device.host for t in traces if t.device.host in targets})
    if not hosts:
        return 0
    out.write("# TYPE up gauge\n# HELP up Whether the scrape target answered.\n")
    n = 0
    for host in hosts:
        mine = [t.time[np.isfinite(t.time)] for t in traces if t.device.host == host]
        times = np.unique(np.concatenate(mine))
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in targets[host].items())
        out.write("".join(f"up{{{body}}} 1 {ts:.3f}\n" for ts in np.round(times, 3).tolist()))
        n += int(times.size)
    return n


def _write_gpu_info(traces: Sequence[Trace], out: IO[str]) -> int:
    """The agent's `phasescope_gpu_info` for each MIG instance, at its trace's sample times, so the fleet
    finds its parent GPU and profile as it does on a live agent (a whole GPU needs none: empty labels)."""
    mig = [t for t in traces if mig_parent(t.device) and np.isfinite(t.time).any()]
    if not mig:
        return 0
    out.write(f"# TYPE {GPU_INFO.name} gauge\n# HELP {GPU_INFO.name} {GPU_INFO.help}\n")
    n = 0
    for t in mig:
        d = t.device
        extra = f'parent_uuid="{_escape(mig_parent(d))}",mig_profile="{_escape(mig_profile(d))}"'
        prefix = f"{GPU_INFO.name}{{{_labels(t, 'phasescope')},{extra}}} 1 "
        times = np.round(t.time[np.isfinite(t.time)], 3).tolist()
        out.write("".join(f"{prefix}{ts:.3f}\n" for ts in times))
        n += len(times)
    return n


def write(
    traces: Sequence[Trace],
    path: str | Path,
    family: Family = "phasescope",
    signals: Iterable[str] = PAPER_SIGNALS,
    targets: Mapping[str, Mapping[str, str]] | None = None,
) -> int:
    with open(path, "w", encoding="utf-8") as f:
        return write_stream(traces, f, family, signals, targets)
