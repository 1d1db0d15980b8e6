"""Write Traces as OpenMetrics text, to backfill a recording into Prometheus:

    phasescope.fleet.openmetrics.write(traces, "data.om", family="phasescope")
    promtool tsdb create-blocks-from openmetrics data.om /prometheus/data

`family` picks the metric names: "phasescope" (the agent's, `serve.metric_names`) or "dcgm"
(dcgm-exporter's, `sources.replay.dcgm_prom.FIELDS`, in that exporter's units and labels). OpenMetrics
wants each metric family contiguous and each series' timestamps increasing; both hold here since a
family is written for every trace before the next family starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Literal

import numpy as np

from phasescope.schema import PAPER_SIGNALS, SIGNALS, Trace
from phasescope.serve.metric_names import SIGNAL_METRICS
from phasescope.sources.replay.dcgm_prom import FIELDS as DCGM_FIELDS

Family = Literal["phasescope", "dcgm"]


def _dcgm_field(signal: str) -> tuple[str, float] | None:
    for name, (sig, factor) in DCGM_FIELDS.items():
        if sig == signal:
            return name, factor
    return None


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(trace: Trace, family: Family) -> str:
    d = trace.device
    gpu = "" if d.index is None else str(d.index)
    if family == "dcgm":
        pairs = [
            ("gpu", gpu),
            ("UUID", d.uuid),
            ("device", f"nvidia{gpu or 0}"),
            ("modelName", d.name),
            ("Hostname", d.host),
        ]
    else:
        pairs = [("uuid", d.uuid), ("gpu", gpu), ("model", d.name), ("host", d.host)]
    pairs += [(k, d.extra[k]) for k in ("pod", "namespace", "container") if d.extra.get(k)]
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def write_stream(
    traces: Sequence[Trace],
    out: IO[str],
    family: Family = "phasescope",
    signals: Iterable[str] = PAPER_SIGNALS,
) -> int:
    """Write OpenMetrics text; returns the number of samples written."""
    n = 0
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
            prefix = f"{name}{{{_labels(t, family)}}} "
            values = np.round(col[ok] / factor, 6)
            times = np.round(t.time[ok], 3)
            out.write(
                "".join(
                    f"{prefix}{v:.10g} {ts:.3f}\n"
                    for v, ts in zip(values.tolist(), times.tolist(), strict=True)
                )
            )
            n += int(ok.sum())
    out.write("# EOF\n")
    return n


def write(
    traces: Sequence[Trace],
    path: str | Path,
    family: Family = "phasescope",
    signals: Iterable[str] = PAPER_SIGNALS,
) -> int:
    with open(path, "w", encoding="utf-8") as f:
        return write_stream(traces, f, family, signals)
