"""Classify each fleet device's Trace, and tell idle GPUs that nobody holds from held-but-idle ones.

Phase calls are the shipped model's, through the same verdict as `phasescope classify` (`classify.verdict`:
segments, overall label, held idle per segment). An idle segment counts as *held*
when the device kept at least `held_mem_bytes` of memory allocated through it (a process, or a pod
that requested the GPU, still owns it; the median over the segment, `classify.held`) or when a pod label
is attached to the device's series. A bare driver context is a few hundred MiB (453-728 MiB on the idle
RTX 3090s in ../shared/data), so the default bar is `schema.HELD_MEM_BYTES`, 1 GiB, the live view's too.
Without a memory series and a pod, an idle segment's held-ness cannot be told: `held` is None, and its
time counts as idle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phasescope.classify import decide, verdict
from phasescope.classify.model import PhaseModel
from phasescope.kpi.cost import Cost, Prices, cost_of, mig_prices
from phasescope.kpi.energy import device_energy
from phasescope.kpi.rhythm import trace_kpis
from phasescope.schema import HELD_MEM_BYTES, PHASES, Trace, Verdict

HELD_IDLE = "held_idle"
DEFAULT_HELD_MEM_BYTES = HELD_MEM_BYTES


@dataclass
class DeviceVerdict:
    uuid: str
    host: str
    model: str
    gpu: int | None
    pod: str
    namespace: str
    label: str  # the phase holding most of the range (decide.overall_label; idle or held_idle), or "unknown"
    current: str  # the phase of the last segment
    held_idle: bool  # the current phase is idle and the device is held
    # The range's idle is held (label held_idle) or not (label idle); False for a working label; None where it
    # cannot be told (idle with no memory series and no pod; or unknown), as `classify --json`'s "held".
    held: bool | None
    confidence: float  # mean probability of `current` over its segment (NaN when unknown)
    probabilities: dict[str, float]  # of the last judged window (NaN when none)
    segments: list[decide.Segment]
    seconds: dict[str, float]  # per phase (+ held_idle, unknown) over the range
    held_idle_cost: Cost = field(default_factory=lambda: Cost(None, None))
    held_idle_joules: float = 0.0
    samples: int = 0
    missing_signals: list[str] = field(default_factory=list)
    price_note: str = ""  # a MIG instance's share of its physical GPU's price (kpi/cost.py), or ""
    # Some price applied: then a None `held_idle_cost` is unmeasured held-idle energy, not "unpriced".
    priced: bool = False
    segment_held: list[bool | None] = field(default_factory=list)  # per segment; None: not idle, or not told
    # The real samples' spacing (fleet/collect.py), not the query step; NaN where not known.
    sample_interval_s: float = math.nan
    reason: str = ""  # why the label is unknown (the commonest window reason, or a frozen exporter); else ""
    stale: bool = False  # the exporter served the same readings for minutes: not classified
    # signal -> values outside its physical range (schema.RANGES), read as missing (fleet/collect.py)
    impossible_values: dict[str, int] = field(default_factory=dict)
    # Telemetry-only KPIs of the range's phase over its segments of that phase (`trace_kpis`, as
    # `classify --json`'s `kpis`); {} for a stale exporter
    kpis: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "host": self.host,
            "model": self.model,
            "gpu": self.gpu,
            "pod": self.pod,
            "namespace": self.namespace,
            "label": self.label,
            "current": self.current,
            "held_idle": self.held_idle,
            "held": self.held,
            "confidence": _num(self.confidence),
            "probabilities": {k: _num(v) for k, v in self.probabilities.items()},
            "seconds": dict(self.seconds),
            "held_idle_gpu_hours": self.seconds.get(HELD_IDLE, 0.0) / 3600.0,
            "held_idle_kwh": self.held_idle_joules / 3.6e6,
            "held_idle_cost": self.held_idle_cost.to_dict(),
            "price_note": self.price_note,
            "samples": self.samples,
            "missing_signals": list(self.missing_signals),
            "sample_interval_s": _num(self.sample_interval_s),
            "reason": self.reason,
            "stale": self.stale,
            "impossible_values": dict(self.impossible_values),
            "kpis": {k: _num(v) if isinstance(v, float) else v for k, v in self.kpis.items()},
            "segments": [_segment_dict(s, h) for s, h in
                         zip(self.segments, self.segment_held or [None] * len(self.segments), strict=True)],
        }


def _segment_dict(seg: decide.Segment, held: bool | None) -> dict[str, Any]:
    out = seg.to_dict()
    if seg.label == "idle":
        out["held"] = held
    return out


def _num(x: float) -> float | None:
    return decide.finite_or_none(round(float(x), 4))  # 4 digits: a fleet JSON has thousands of them


def _segment_held(v: Verdict, pod: str) -> list[bool | None]:
    """Per segment: an idle one held (its memory, as the verdict judged it, or a pod on the device) or not,
    None where it cannot be told; None for every other segment."""
    return [None if h is None else True if pod else h.held for h in v.segment_held]


def _held_segments(
    segs: list[decide.Segment], held: list[bool | None]
) -> list[tuple[float, float, str]]:
    """Segments as (start, end, label) with the held idle segments relabelled `held_idle`."""
    return [(s.start, s.end, HELD_IDLE if h else s.label) for s, h in zip(segs, held, strict=True)]


def _range_held(label: str, segs: list[decide.Segment], held: list[bool | None]) -> bool | None:
    """The range's held flag for its fleet label (after `_fleet_label`)."""
    if label == HELD_IDLE:
        return True
    if label != "idle":
        return None if label == decide.UNKNOWN else False
    told = [h for s, h in zip(segs, held, strict=True) if s.label == "idle" and h is not None]
    return False if told else None  # idle: held time was the lesser part, or not told at all


def _fleet_label(label: str, seconds: dict[str, float]) -> str:
    """The range's label, with idle split into idle and held_idle by which took more of the idle time."""
    if label == "idle" and seconds.get(HELD_IDLE, 0.0) > seconds.get("idle", 0.0):
        return HELD_IDLE
    return label


def _stale(trace: Trace, since: float, price_note: str, priced: bool) -> DeviceVerdict:
    """A device whose exporter froze at `since`: unknown, its seconds not split into phases, and why."""
    frozen_s = float(trace.time[-1] - since) if len(trace) else 0.0
    d, extra = trace.device, trace.device.extra
    return DeviceVerdict(
        uuid=d.uuid, host=d.host, model=d.name, gpu=d.index, pod=extra.get("pod", ""),
        namespace=extra.get("namespace", ""), label=decide.UNKNOWN, current=decide.UNKNOWN, held_idle=False,
        held=None, confidence=math.nan, probabilities={ph: math.nan for ph in PHASES}, segments=[],
        seconds={}, samples=len(trace), missing_signals=trace.missing_signals(), price_note=price_note,
        priced=priced, sample_interval_s=float(trace.meta.get("sample_interval_s", math.nan)),
        reason=f"stale: the exporter has served the same readings for {frozen_s:.0f} s (frozen exporter?)",
        stale=True,
        impossible_values=dict(trace.meta.get("impossible_values", {})),
    )


def judge(
    trace: Trace,
    model: PhaseModel,
    prices: Prices | None = None,
    held_mem_bytes: float = DEFAULT_HELD_MEM_BYTES,
    price_note: str = "",
) -> DeviceVerdict:
    if "frozen_since" in trace.meta:
        return _stale(trace, float(trace.meta["frozen_since"]), price_note,
                      prices is not None and prices.priced)
    v = verdict.build(trace, model, held_mem_bytes=held_mem_bytes, evidence=False)
    pred = v.windows
    assert pred is not None, "verdict.build always runs the model"
    segs = v.segments
    extra = trace.device.extra
    pod = extra.get("pod", "")
    seg_held = _segment_held(v, pod)
    labelled = _held_segments(segs, seg_held)
    energy = device_energy(trace, labelled)
    seconds = {k: e.seconds for k, e in energy.phases.items()}
    held = energy.phases.get(HELD_IDLE)
    current = segs[-1].label if segs else decide.UNKNOWN
    proba = {ph: math.nan for ph in PHASES}
    known = np.flatnonzero(np.isfinite(pred.proba).all(axis=1)) if len(pred) else np.zeros(0, dtype=int)
    if known.size:
        proba = {ph: float(pred.proba[known[-1], i]) for i, ph in enumerate(PHASES)}
    cost = Cost(None, None)
    # Priced: a GPU never held idle costs $0 (not "unpriced"); held-idle energy without a reading is None.
    if prices is not None:
        cost = (
            cost_of(0.0, 0.0, prices)
            if held is None
            else cost_of(held.seconds, held.joules, prices, measured=held.measured)
        )
    label = _fleet_label(v.label, seconds)
    return DeviceVerdict(
        uuid=trace.device.uuid,
        host=trace.device.host,
        model=trace.device.name,
        gpu=trace.device.index,
        pod=pod,
        namespace=extra.get("namespace", ""),
        label=label,
        current=current,
        held_idle=bool(labelled) and labelled[-1][2] == HELD_IDLE,
        held=_range_held(label, segs, seg_held),
        confidence=segs[-1].confidence if segs else math.nan,
        probabilities=proba,
        segments=segs,
        seconds=seconds,
        held_idle_cost=cost,
        held_idle_joules=held.joules if held is not None else 0.0,
        samples=len(trace),
        missing_signals=list(v.missing_signals),
        price_note=price_note,
        priced=prices is not None and prices.priced,
        segment_held=seg_held,
        sample_interval_s=float(trace.meta.get("sample_interval_s", math.nan)),
        reason=next(iter(v.unknown_reasons), "") if label == decide.UNKNOWN else "",
        impossible_values=dict(trace.meta.get("impossible_values", {})),
        kpis=trace_kpis(trace, v.label, [(s.start, s.end) for s in segs if s.label == v.label]),
    )


def judge_all(
    traces: Iterable[Trace],
    model: PhaseModel | None = None,
    prices: Callable[[str], Prices] | None = None,
    held_mem_bytes: float = DEFAULT_HELD_MEM_BYTES,
) -> list[DeviceVerdict]:
    """`judge` for each trace; `prices` maps a device's model name to its Prices (None: not priced).

    A MIG instance's held-idle time is priced at its share of the physical GPU (kpi/cost.py `mig_prices`,
    as `phasescope cost`), so the instances of one GPU held idle for an hour cost one GPU-hour, not one
    each. Shares are worked out over `traces` together: pass a GPU's instances in one call.
    """
    m = model or PhaseModel.load()
    traces = list(traces)
    if prices is None:
        return [judge(t, m, None, held_mem_bytes) for t in traces]
    shared, notes = mig_prices({t.device.uuid: prices(t.device.name) for t in traces},
                               [t.device for t in traces])
    return [judge(t, m, shared[t.device.uuid], held_mem_bytes, notes.get(t.device.uuid, "")) for t in traces]
