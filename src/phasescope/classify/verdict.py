"""One trace's verdict, built once: window predictions -> phase segments -> overall label -> confidence, with
why windows were unknown and whether the device's idle is held.

`phasescope classify`, the report, the fleet judge and `verify` all take their `schema.Verdict` from here, so
a label, a confidence or an unknown reason means the same in each. The rules are `classify.decide`'s
(segments, overall label) and `classify.held`'s (held idle); this module runs them in one order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from phasescope.classify import decide
from phasescope.classify.held import DeviceProcesses, Held, judge_spans
from phasescope.classify.model import PhaseModel, WindowPredictions
from phasescope.errors import InputError
from phasescope.schema import HELD_MEM_BYTES, PHASES, Trace, Verdict

NO_SAMPLES = "no samples"  # the unknown reason of a span with no telemetry at all
NO_WINDOWS = "no window could be cut from its samples"
NOT_CLASSIFIED = "not classified"  # no model judged the trace


def build(
    trace: Trace,
    model: PhaseModel,
    *,
    min_confidence: float | None = None,
    min_segment_s: float | None = None,
    processes: DeviceProcesses | None = None,
    held_mem_bytes: float = HELD_MEM_BYTES,
    evidence: bool = False,
) -> Verdict:
    """The verdict of `model` on one device trace.

    The config's thresholds change it only where set: `min_confidence` replaces the model's own `min_proba`
    (windows below it read unknown); with `min_segment_s` no segment is shorter where a neighbour touches it
    (unknown runs under it are bridged, short phase segments merged: `decide.merge_short`). Those set are
    kept in `Verdict.thresholds`. `processes`: the device's recorded process samples (None where the source
    records none); they, or `held_mem_bytes` of memory in use, make an idle span held. `evidence`: keep
    each window's feature contributions, for the view that shows them (the report; classify and the fleet
    do without: they cost about half the prediction)."""
    where = trace.device.label()
    if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
        raise InputError(where, "min_confidence", "a probability between 0 and 1", min_confidence)
    if min_segment_s is not None and not 0.0 <= min_segment_s < math.inf:
        raise InputError(where, "min_segment_s", "a finite number of seconds, 0 or more", min_segment_s)
    used: dict[str, float] = {}
    if min_confidence is not None:
        used["min_confidence"] = min_confidence
        model = model.with_rules(min_proba=min_confidence)
    if min_segment_s is not None:
        used["min_segment_s"] = min_segment_s
    windows = model.predict_trace(trace, evidence=evidence)
    return _assemble(trace, windows, None, min_segment_s, processes, held_mem_bytes, used)


def from_windows(
    trace: Trace, windows: WindowPredictions, span: tuple[float, float] | None = None
) -> Verdict:
    """The verdict on windows already predicted (e.g. `take_windows` of a longer trace's), with the default
    rules; `trace` holds the samples of `span` (default: its own first to last sample)."""
    return _assemble(trace, windows, span, None, None, HELD_MEM_BYTES, {})


def unclassified(trace: Trace, why: str = "") -> Verdict:
    """An unknown verdict for a trace no model judged (none loaded, or its prediction failed): `why`."""
    start, end = _span(trace)
    nan = {ph: math.nan for ph in PHASES}
    return Verdict(trace.device, start, end, decide.UNKNOWN, math.nan, nan, [], {why or NOT_CLASSIFIED: 0},
                   Held(None, None), [], None, "", trace.missing_signals())


def take_windows(windows: WindowPredictions, index: npt.NDArray[np.intp]) -> WindowPredictions:
    """The windows at `index` (e.g. those inside one verification span), everything per window kept."""
    idx = np.asarray(index, dtype=np.intp).tolist()
    return replace(
        windows,
        start=windows.start[idx],
        end=windows.end[idx],
        proba=windows.proba[idx].reshape(len(idx), len(PHASES)),
        labels=[windows.labels[i] for i in idx],
        evidence=[windows.evidence[i] for i in idx if i < len(windows.evidence)],
        reasons=[windows.reasons[i] for i in idx] if windows.reasons else [],
    )


def unknown_reasons(labels: Sequence[str], reasons: Sequence[str]) -> dict[str, int]:
    """Why windows were unknown: each reason (its numbers dropped, so alike reasons count together)
    with how many windows gave it, the most common first."""
    counts: dict[str, int] = {}
    for lab, why in zip(labels, reasons, strict=True):
        if lab == decide.UNKNOWN and why:
            key = re.sub(r":?\s*best probability [\d.]+\s*<\s*[\d.]+", "", why).strip() or "low confidence"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def window_reasons(windows: WindowPredictions) -> list[str]:
    """Why each window is unknown ("" for a called one); all "" where the predictions carry no reasons."""
    return list(windows.reasons) or [""] * len(windows.labels)


def _assemble(
    trace: Trace,
    windows: WindowPredictions,
    span: tuple[float, float] | None,
    min_segment_s: float | None,
    processes: DeviceProcesses | None,
    held_mem_bytes: float,
    thresholds: dict[str, float],
) -> Verdict:
    segs = phase_segments(windows, min_segment_s)
    label = decide.overall_label(segs)
    seg_held = [judge_spans(trace, [(s.start, s.end)], processes, held_mem_bytes) if s.label == "idle"
                else None for s in segs]
    why = unknown_reasons(windows.labels, window_reasons(windows))
    if not len(windows):  # nothing was judged: say why rather than give an unknown without a reason
        why = {NO_SAMPLES if len(trace) == 0 else NO_WINDOWS: 0}
    start, end = span if span is not None else _span(trace)
    return Verdict(
        device=trace.device,
        start=start,
        end=end,
        label=label,
        confidence=confidence(segs, label),
        probabilities=decide.mean_probabilities(windows),
        segments=segs,
        unknown_reasons=why,
        held=_device_held(trace, segs, label, processes, held_mem_bytes),
        segment_held=seg_held,
        windows=windows,
        model_version=windows.model_version,
        missing_signals=list(windows.missing_signals),
        thresholds=thresholds,
    )


def phase_segments(windows: decide.WindowProbs, min_segment_s: float | None = None) -> list[decide.Segment]:
    """The windows' phase segments as every verdict cuts them (`decide.segments`; with `min_segment_s`,
    unknown runs under it bridged and shorter phase segments merged). The live classifier decodes its
    newest windows with this too, so the agent's phase and the fleet's verdict follow one rule."""
    params = decide.SegmentParams()
    if min_segment_s is not None:
        params = replace(params, min_unknown_s=max(params.min_unknown_s, min_segment_s))
    segs = decide.segments(windows, params)
    if min_segment_s is not None:
        segs = decide.merge_short(segs, min_segment_s)
    return segs


def confidence(segs: Sequence[decide.Segment], label: str) -> float:
    """Time-weighted mean probability of `label` over the segments that carry it (NaN when none does)."""
    mine = [s for s in segs if s.label == label and math.isfinite(s.confidence)]
    if not mine:
        return math.nan
    total = sum(max(s.duration, 0.0) for s in mine)
    if total <= 0:
        return float(np.mean([s.confidence for s in mine]))
    return sum(s.confidence * max(s.duration, 0.0) for s in mine) / total


def _device_held(
    trace: Trace,
    segs: Sequence[decide.Segment],
    label: str,
    processes: DeviceProcesses | None,
    held_mem_bytes: float,
) -> Held:
    """Held-ness of the device's verdict: over all its idle time when labelled idle; not held when labelled a
    working phase; not told when the label is unknown."""
    if label == "idle":
        spans = [(s.start, s.end) for s in segs if s.label == "idle"]
        return judge_spans(trace, spans, processes, held_mem_bytes)
    return Held(None if label == decide.UNKNOWN else False, None)


def _span(trace: Trace) -> tuple[float, float]:
    """The trace's first and last sample time; NaN for an empty trace."""
    if len(trace) == 0:
        return math.nan, math.nan
    return float(np.min(trace.time)), float(np.max(trace.time))


__all__ = ["NOT_CLASSIFIED", "NO_SAMPLES", "NO_WINDOWS", "build", "confidence", "from_windows",
           "phase_segments", "take_windows", "unclassified", "unknown_reasons", "window_reasons"]
