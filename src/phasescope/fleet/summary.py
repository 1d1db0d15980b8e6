"""Fleet totals: GPUs per phase, by host and by Kubernetes namespace/pod, and held-idle waste."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from phasescope.fleet.judge import HELD_IDLE, DeviceVerdict
from phasescope.schema import PHASES
from phasescope.views.kpis import kpi_text

COLUMNS: tuple[str, ...] = ("training", "inference", "other", "idle", HELD_IDLE, "unknown")
_HEAD = {
    "training": "train",
    "inference": "serve",
    "other": "other",
    "idle": "idle",
    HELD_IDLE: "held-idle",
    "unknown": "unknown",
}


def counts(verdicts: Sequence[DeviceVerdict], by: str | None = None) -> dict[str, dict[str, int]]:
    """group -> phase -> GPUs; `by` is 'host', 'namespace', 'pod' or None (one group, 'fleet')."""
    out: dict[str, dict[str, int]] = {}
    for v in verdicts:
        if by is None:
            group = "fleet"
        elif by == "pod":
            group = f"{v.namespace}/{v.pod}" if v.pod else ""
        else:
            group = str(getattr(v, by))
        if by in ("pod", "namespace") and not group:
            continue  # only devices that carry the label
        row = out.setdefault(group, dict.fromkeys(COLUMNS, 0))
        row[v.label if v.label in row else "unknown"] += 1
    return dict(sorted(out.items()))


def waste(verdicts: Sequence[DeviceVerdict]) -> dict[str, Any]:
    hours = sum(v.seconds.get(HELD_IDLE, 0.0) for v in verdicts) / 3600.0
    priced = [v.held_idle_cost.total_usd for v in verdicts if v.held_idle_cost.total_usd is not None]
    kwh = sum(v.held_idle_joules for v in verdicts) / 3.6e6
    return {
        "held_idle_gpu_hours": hours,
        "held_idle_kwh": kwh,
        "held_idle_usd": sum(priced) if priced else None,
    }


def waste_usd_text(verdicts: Sequence[DeviceVerdict]) -> str:
    """The held-idle cost as the text output and the --serve page show it: ", $X", or why it is unknown.

    Unknown is not always "no price": with only a $/kWh price, held-idle time without a power reading has an
    unknown energy cost and nothing to price its time by, and setting --price-kwh again would not help."""
    usd = waste(verdicts)["held_idle_usd"]
    unknown = [v for v in verdicts
               if v.seconds.get(HELD_IDLE, 0.0) > 0 and v.held_idle_cost.total_usd is None]
    unmeasured = [v for v in unknown if v.priced]  # priced, yet None: energy unmeasured, no $/GPU-hour
    why = (
        "held-idle energy unmeasured (no power reading); set --price-gpu-hour to price its time"
        if unmeasured else "set --price-gpu-hour / --price-kwh to price it"
    )
    if usd is None:
        return f" (cost unknown: {why})" if unmeasured else f" ({why})"
    if unknown:  # the sum leaves these GPUs out: say so rather than show it as the whole waste
        return f", ${usd:,.2f} plus {len(unknown)} GPU(s) of unknown cost ({why})"
    return f", ${usd:,.2f}"


def summary(verdicts: Sequence[DeviceVerdict]) -> dict[str, Any]:
    return {
        "gpus": len(verdicts),
        "phases": counts(verdicts).get("fleet", dict.fromkeys(COLUMNS, 0)),
        "by_host": counts(verdicts, "host"),
        "by_namespace": counts(verdicts, "namespace"),
        "by_pod": counts(verdicts, "pod"),
        "waste": waste(verdicts),
    }


def _table(title: str, first: str, groups: dict[str, dict[str, int]]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(first)
    for c in COLUMNS:
        table.add_column(_HEAD[c], justify="right")
    table.add_column("GPUs", justify="right")
    for group, row in groups.items():
        table.add_row(
            group or "-", *[str(row[c]) if row[c] else "." for c in COLUMNS], str(sum(row.values()))
        )
    return table


def phase_text(label: str, held: bool | None) -> str:
    """A device's phase as the devices table says it: held idle is "idle (held)", as `phasescope classify`
    prints it; held-ness not told (no memory series) reads "idle" alone."""
    return "idle (held)" if label == HELD_IDLE or (label == "idle" and held) else label


def render(verdicts: Sequence[DeviceVerdict], console: Console, show_devices: bool = True) -> None:
    s = summary(verdicts)
    console.print(_table(f"{s['gpus']} GPUs by host", "host", s["by_host"]))
    if s["by_namespace"]:
        console.print(_table("by namespace", "namespace", s["by_namespace"]))
    if s["by_pod"]:
        console.print(_table("by pod", "namespace/pod", s["by_pod"]))
    w = s["waste"]
    console.print(
        f"held-idle: {w['held_idle_gpu_hours']:.2f} GPU-hours, {w['held_idle_kwh']:.2f} kWh"
        + waste_usd_text(verdicts),
        markup=False,
    )
    if show_devices:
        dev = Table(title="devices", title_justify="left")
        for c in ("host", "gpu", "uuid", "model", "pod", "phase", "now", "conf", "KPIs (telemetry)", "every",
                  "why unknown"):
            dev.add_column(c)
        for v in sorted(verdicts, key=lambda v: (v.host, v.gpu if v.gpu is not None else -1, v.uuid)):
            dev.add_row(
                v.host,
                "" if v.gpu is None else str(v.gpu),
                v.uuid,
                v.model,
                f"{v.namespace}/{v.pod}" if v.pod else "",
                phase_text(v.label, v.held),
                phase_text(v.current, v.held_idle),
                "" if not math.isfinite(v.confidence) else f"{v.confidence:.2f}",
                kpi_text(v.kpis),
                "" if not math.isfinite(v.sample_interval_s) else f"{v.sample_interval_s:g}s",
                v.reason,
            )
        console.print(dev)
        unknown = [v for v in verdicts if v.label == "unknown" and v.reason]
        if unknown:  # the table may cut the reason; say the commonest one in full
            ((top, n),) = Counter(v.reason for v in unknown).most_common(1)
            console.print(f"{len(unknown)} GPU(s) unknown; the commonest reason ({n}): {top}", markup=False,
                          soft_wrap=True)


__all__ = ["COLUMNS", "PHASES", "counts", "phase_text", "render", "summary", "waste", "waste_usd_text"]
