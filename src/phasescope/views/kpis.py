"""The one formatter of the telemetry-only KPIs (kpi/rhythm.py `trace_kpis`: a dict per device of figures
`{value, unit, method, confidence, reason}`, plus the `phase` they were computed for): `top`'s cell, the
dashboard's line (`/api/state` carries the text), `report`'s block and `fleet`'s column all read it here.

Which figures a device shows follows the phase of the KPI dict: the step period, steps per hour and stall
share for training; busy fraction, bursts per minute and saturation for inference; SM, tensor and DRAM
activity (a measured proxy for MFU) for any phase where the GPU reports them. A figure with no value is the
missing mark, so a training device with no rhythm reads `step –`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phasescope.views.display import MISSING, fmt_ratio, fmt_seconds, fmt_si

TRAINING = ("step_period_s", "steps_per_hour", "stall_fraction")
INFERENCE = ("busy_fraction", "burst_rate_per_s", "saturated")
ACTIVITY = ("sm_active", "tensor_active", "dram_active")
NAMES = {
    "step_period_s": "step period", "steps_per_hour": "steps per hour", "stall_fraction": "stall share",
    "busy_fraction": "busy fraction", "burst_rate_per_s": "bursts per minute", "saturated": "saturation",
    "sm_active": "SM activity (MFU proxy)", "tensor_active": "tensor activity (MFU proxy)",
    "dram_active": "DRAM activity",
}


@dataclass(frozen=True)
class KpiItem:
    """One figure as shown: a short label, its value as text, and what a tooltip or report says of it."""

    key: str
    name: str  # in full, for a report or a tooltip ("step period")
    label: str  # as a compact line shows it ("step"; "" where the value says it: "saturated")
    text: str
    method: str
    confidence: float | None
    reason: str | None


def _number(figure: Mapping[str, Any] | None) -> float | None:
    v = None if figure is None else figure.get("value")
    if isinstance(v, bool) or v is None:
        return None
    return float(v) if math.isfinite(float(v)) else None


def _text(key: str, figure: Mapping[str, Any] | None) -> tuple[str, str]:
    """(label, value text) of one figure."""
    v = _number(figure)
    if key == "step_period_s":
        return "step", fmt_seconds(v)
    if key == "steps_per_hour":
        return "steps/h", MISSING if v is None else f"{v:.3g}" if v < 1000 else fmt_si(v)
    if key == "stall_fraction":
        return "stall", fmt_ratio(v)
    if key == "busy_fraction":
        return "busy", fmt_ratio(v)
    if key == "burst_rate_per_s":
        return "bursts/min", MISSING if v is None else f"{v * 60:.3g}"
    if key == "saturated":
        flag = None if figure is None else figure.get("value")
        return "", MISSING if not isinstance(flag, bool) else "saturated" if flag else "headroom"
    return {"sm_active": "SM", "tensor_active": "tensor", "dram_active": "DRAM"}[key], fmt_ratio(v)


def kpi_items(kpis: Mapping[str, Any] | None) -> list[KpiItem]:
    """The figures a view shows of one device's telemetry KPIs, in order; [] when there are none to show
    (no dict, an idle or unknown phase with no activity counters, too few samples)."""
    if not kpis:
        return []
    phase = kpis.get("phase")
    keys: tuple[str, ...] = TRAINING if phase == "training" else INFERENCE if phase == "inference" else ()
    if keys and not any(k in kpis for k in keys):  # too few samples: trace_kpis gave no figure at all
        keys = ()
    if _number(kpis.get("step_period_s")) is None:  # no rhythm: 'step –' says it, steps/h would repeat it
        keys = tuple(k for k in keys if k != "steps_per_hour")
    out = []
    for key in (*keys, *(k for k in ACTIVITY if k in kpis)):
        fig = kpis.get(key)
        label, text = _text(key, fig)
        conf = None if fig is None else fig.get("confidence")
        out.append(KpiItem(key, NAMES[key], label, text, "" if fig is None else str(fig.get("method", "")),
                           None if conf is None else float(conf),
                           None if fig is None else fig.get("reason")))
    return out


def kpi_text(kpis: Mapping[str, Any] | None) -> str:
    """One compact line: 'step 17.0 s · steps/h 211 · stall 4%', 'busy 30% · bursts/min 51 · headroom';
    the missing mark when there is nothing to show."""
    items = kpi_items(kpis)
    if not items or all(i.text == MISSING for i in items):
        return MISSING
    return " · ".join(f"{i.label} {i.text}".strip() for i in items)


def kpi_note(item: KpiItem) -> str:
    """What a tooltip or report says of one figure: its method, confidence, and why it has no value."""
    parts = [item.method]
    if item.confidence is not None:
        parts.append(f"confidence {item.confidence:.2f}")
    if item.reason:
        parts.append(f"no value: {item.reason}")
    return "; ".join(p for p in parts if p)
