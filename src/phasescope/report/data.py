"""What a report holds, computed once from the traces: phases, their evidence, KPIs, energy and cost.

Nothing here knows HTML; `report/page.py` only formats what `build` returns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phasescope.classify import decide, verdict
from phasescope.errors import PhasescopeError
from phasescope.kpi.cost import ZERO, Cost, Prices, device_cost, mig_prices, phase_costs
from phasescope.kpi.energy import DEFAULT_GAP_FACTOR, DeviceEnergy, device_energy
from phasescope.kpi.rhythm import trace_kpis
from phasescope.schema import PHASES, Trace, Verdict

TOP_FEATURES = 5  # features listed per segment as its evidence


@dataclass(frozen=True)
class FeatureWeight:
    """One feature's mean contribution (LightGBM SHAP, log-odds) towards a segment's label."""

    feature: str
    weight: float
    windows: int  # windows of the segment in which the feature was among the top contributors


@dataclass
class DeviceReport:
    """Everything the page shows for one device trace."""

    path: str
    trace: Trace
    verdict: Verdict  # `classify.verdict`'s; unknown without windows when the trace was not classified
    evidence: list[list[FeatureWeight]]  # parallel to `segments`
    note: str  # why the trace was not classified, or ""
    stats: dict[str, float]  # whole-trace telemetry KPIs (see `signal_stats`)
    phase_stats: dict[str, dict[str, float]]  # label -> telemetry KPIs inside that label's segments
    energy: DeviceEnergy
    prices: Prices
    cost: Cost
    phase_cost: dict[str, Cost]
    price_note: str = ""  # how a MIG row's prices are its share of the physical GPU's, or ""
    # The telemetry-only KPIs of the device's phase over its segments of that phase (`trace_kpis`, as
    # `classify --json`'s `kpis`): step period and stall share, or busy fraction and bursts
    telemetry_kpis: dict[str, Any] = field(default_factory=dict)

    @property
    def pred(self) -> Any | None:
        """The window predictions (classify.model.WindowPredictions); None when not classified."""
        return self.verdict.windows

    @property
    def segments(self) -> list[decide.Segment]:
        return self.verdict.segments

    @property
    def label(self) -> str:
        return self.verdict.label

    @property
    def confidence(self) -> float:
        return self.verdict.confidence

    @property
    def title(self) -> str:
        dev = self.trace.device
        idx = "" if dev.index is None else f"#{dev.index} "
        return f"{idx}{dev.name or 'device'} ({dev.uuid})"


@dataclass
class ReportData:
    inputs: list[str]
    devices: list[DeviceReport]
    model_version: str
    model_note: str  # why no classification at all, or ""
    created: float = field(default_factory=time.time)
    hooks: dict[str, Any] | None = None  # kpi.run_summary.summarize() of a hook events dir

    def phase_totals(self) -> dict[str, tuple[float, float, Cost]]:
        """label -> (device-seconds, joules, cost), over every device."""
        out: dict[str, tuple[float, float, Cost]] = {}
        for d in self.devices:
            for label, pe in d.energy.phases_or_whole().items():
                s, j, c = out.get(label, (0.0, 0.0, ZERO))
                out[label] = (s + pe.seconds, j + pe.joules, c + d.phase_cost.get(label, ZERO))
        return out


# --------------------------------------------------------------------------- telemetry KPIs


def _stat(values: np.ndarray, fn: Callable[[np.ndarray], Any]) -> float:
    finite = values[np.isfinite(values)]
    return float(fn(finite)) if finite.size else math.nan


def signal_stats(trace: Trace) -> dict[str, float]:
    """Telemetry KPIs every phase has: utilisation, power, memory, temperature; NaN where absent."""
    util, power, mem = trace["gpu_util"], trace["power"], trace["mem_used"]
    return {
        "samples": float(len(trace)),
        "duration_s": trace.duration(),
        "rate_hz": trace.rate_hz(),
        "util_mean": _stat(util, np.mean),
        "util_p95": _stat(util, lambda x: np.percentile(x, 95)),
        "power_mean_w": _stat(power, np.mean),
        "power_max_w": _stat(power, np.max),
        "mem_used_max": _stat(mem, np.max),
        "mem_total": _stat(trace["mem_total"], np.max),
        "temperature_max": _stat(trace["temperature"], np.max),
    }


def _phase_stats(trace: Trace, segs: Sequence[decide.Segment]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for label in {s.label for s in segs}:
        mask = np.zeros(len(trace), dtype=bool)
        for s in segs:
            if s.label == label:
                mask |= (trace.time >= s.start) & (trace.time <= s.end)
        if mask.any():
            out[label] = signal_stats(trace.take(mask))
    return out


# --------------------------------------------------------------------------- evidence


def segment_evidence(pred: Any, seg: decide.Segment, top: int = TOP_FEATURES) -> list[FeatureWeight]:
    """The features that drove a segment: mean contribution towards its label over the windows inside it
    that the model called that label (a window called otherwise argued for something else)."""
    if seg.label not in PHASES:
        return []
    start = np.asarray(pred.start, dtype=np.float64)
    end = np.asarray(pred.end, dtype=np.float64)
    centre = (start + end) / 2.0
    inside = np.flatnonzero((centre >= seg.start) & (centre <= seg.end))
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    n = 0
    for i in inside.tolist():
        if pred.labels[i] != seg.label:
            continue
        n += 1
        for name, value in pred.evidence[i].items():
            sums[name] = sums.get(name, 0.0) + float(value)
            counts[name] = counts.get(name, 0) + 1
    if not n:
        return []
    # Mean over all the segment's windows (a feature absent from a window's top list counts as 0 there).
    ranked = sorted(sums, key=lambda k: -abs(sums[k]))[:top]
    return [FeatureWeight(k, sums[k] / n, counts[k]) for k in ranked]


# --------------------------------------------------------------------------- build


def device_report(
    trace: Trace,
    path: str,
    model: Any | None,
    prices: Prices,
    *,
    gap_factor: float = DEFAULT_GAP_FACTOR,
    model_note: str = "",
    price_note: str = "",
) -> DeviceReport:
    v, note = verdict.unclassified(trace, model_note), model_note
    if model is not None:
        try:
            v = verdict.build(trace, model, evidence=True)  # the report shows each segment's evidence
        except (PhasescopeError, ValueError) as exc:  # one unclassifiable trace must not sink the report
            note = f"not classified: {exc}"
            v = verdict.unclassified(trace, note)
    segs = v.segments
    evidence = [segment_evidence(v.windows, s) for s in segs] if v.windows is not None else []
    energy = device_energy(trace, segs or None, gap_factor=gap_factor)
    spans = [(s.start, s.end) for s in segs if s.label == v.label]
    return DeviceReport(
        path=path,
        trace=trace,
        verdict=v,
        evidence=evidence,
        note=note,
        stats=signal_stats(trace),
        phase_stats=_phase_stats(trace, segs),
        energy=energy,
        prices=prices,
        cost=device_cost(energy, prices),
        phase_cost=phase_costs([energy], prices),
        price_note=price_note,
        telemetry_kpis=trace_kpis(trace, v.label, spans),
    )


def load_model(path: str | None = None) -> tuple[Any | None, str]:
    """The phase model, or None and why not (the report then shows telemetry, energy and cost only).

    A model file the user named must load (its error propagates); the shipped one may be unusable here.
    """
    from phasescope.classify.model import PhaseModel

    if path is not None:
        return PhaseModel.load(path), ""
    try:
        return PhaseModel.load(), ""
    except Exception as exc:  # e.g. lightgbm missing: the rest of the report still stands
        return None, f"classifier not available ({type(exc).__name__}: {exc})"


def build(
    inputs: Sequence[tuple[str, Sequence[Trace]]],
    *,
    model: Any | None = None,
    model_note: str = "",
    prices: Callable[[Trace], Prices] | Mapping[str, Prices] | Prices = Prices(),  # noqa: B008 (frozen)
    gap_factor: float = DEFAULT_GAP_FACTOR,
    hooks: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ReportData:
    """Classify, segment and measure every trace of every input (path, traces).

    MIG rows are priced at their share of the physical GPU's prices (kpi/cost.py `mig_shares`), over all
    inputs together.
    """
    every = [t for _, traces in inputs for t in traces]
    base: dict[str, Prices] = {}
    for trace in every:
        if isinstance(prices, Prices):
            base[trace.device.uuid] = prices
        elif isinstance(prices, Mapping):
            base[trace.device.uuid] = prices.get(trace.device.uuid, Prices())
        else:
            base[trace.device.uuid] = prices(trace)
    shared, notes = mig_prices(base, [t.device for t in every])
    devices = []
    for path, traces in inputs:
        for trace in traces:
            if progress is not None:
                progress(f"{trace.device.label()}")
            uuid = trace.device.uuid
            devices.append(device_report(trace, path, model, shared[uuid], gap_factor=gap_factor,
                                         model_note=model_note, price_note=notes.get(uuid, "")))
    version = str(getattr(model, "version", "")) if model is not None else ""
    return ReportData([p for p, _ in inputs], devices, version, model_note, hooks=hooks)
