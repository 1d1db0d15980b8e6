"""Check a declared use against one device's telemetry: a verdict per device and time window.

Rules (fixed before any evaluation, never tuned on reported figures):
- The model classifies 30 s windows; `classify.decide.segments` cuts them into phase segments with
  hysteresis. A segment of a phase the claim forbids, carried by at least `min_segment_windows` windows,
  makes the window **inconsistent**. For claims that exclude training, so does the streaming
  `TrainingAlarm` (CUSUM on the training log-odds) firing anywhere in the window.
- Otherwise, when less than `min_judged` of the classifier windows could be called, or the telemetry
  covers less than `min_covered` of the window, the verdict is **unverifiable**: absence of evidence
  from thin data is not evidence of compliance.
- Otherwise **consistent**.
- `max-flop=N`: **consistent** when the FLOP upper bound is at most N, **inconsistent** when the lower
  bound exceeds N, else **unverifiable** (see `flops`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from phasescope.classify import decide
from phasescope.classify.model import PhaseModel, WindowPredictions
from phasescope.classify.verdict import from_windows, take_windows
from phasescope.schema import Trace
from phasescope.verify.assurance import assurance_text
from phasescope.verify.claims import Claim
from phasescope.verify.coverage import Coverage, coverage
from phasescope.verify.flops import FlopEstimate, estimate_flop, thresholds

VERDICTS = ("consistent", "inconsistent", "unverifiable")


@dataclass(frozen=True)
class CheckParams:
    min_segment_windows: int = 2  # one stray window never makes a verdict
    min_judged: float = 0.5  # share of classifier windows the model must be able to call
    min_covered: float = 0.5  # share of the window the samples must cover
    top_features: int = 5

    def __post_init__(self) -> None:
        # audit builds these from a bundle's JSON: a string or a list there must not reach a comparison
        for name in ("min_segment_windows", "top_features"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TypeError(f"{name}: expected a whole number >= 0, got {v!r}")
        for name in ("min_judged", "min_covered"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise TypeError(f"{name}: expected a share from 0 to 1, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WindowVerdict:
    """The verdict on one claim for one device over one time window, with what it rests on."""

    device: str
    device_name: str
    start: float
    end: float
    claim: str
    verdict: str  # one of VERDICTS
    reasons: list[str]
    phase_seconds: dict[str, float]  # time per segment label (phases and "unknown")
    probabilities: dict[str, float]  # mean window probability over the windows the model called
    drivers: dict[str, float]  # feature -> mean log-odds contribution towards the windows' called phases
    alarm_at: float | None  # first "training started" alarm in the window (window end time)
    coverage: Coverage
    model_version: str
    flop: FlopEstimate
    flop_thresholds: dict[str, str]
    assurance: str
    segments: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return strict_json(
            {
                "device": self.device,
                "device_name": self.device_name,
                "start": self.start,
                "end": self.end,
                "claim": self.claim,
                "verdict": self.verdict,
                "reasons": list(self.reasons),
                "phase_seconds": dict(self.phase_seconds),
                "probabilities": dict(self.probabilities),
                "drivers": dict(self.drivers),
                "alarm_at": self.alarm_at,
                "coverage": self.coverage.to_dict(),
                "model_version": self.model_version,
                "flop": self.flop.to_dict(),
                "flop_thresholds": dict(self.flop_thresholds),
                "assurance": self.assurance,
                "segments": list(self.segments),
            }
        )


def strict_json(obj: Any) -> Any:
    """NaN/inf -> None, so the dict is strict JSON (and canonical for hashing)."""
    if isinstance(obj, float):
        return decide.finite_or_none(obj)
    if isinstance(obj, dict):
        return {str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, np.generic):
        return strict_json(obj.item())
    return obj


def _drivers(pred: WindowPredictions, idx: np.ndarray, top: int) -> dict[str, float]:
    total: dict[str, float] = {}
    n = 0
    for i in idx:
        ev = pred.evidence[i] if i < len(pred.evidence) else {}
        if ev:
            n += 1
            for k, v in ev.items():
                total[k] = total.get(k, 0.0) + float(v)
    if not n:
        return {}
    best = sorted(total, key=lambda k: -abs(total[k]))[:top]
    return {k: round(total[k] / n, 4) for k in best}


def verification_windows(t0: float, t1: float, window_s: float | None) -> list[tuple[float, float]]:
    """[start, end] spans: the whole range, or consecutive `window_s` spans (the last may be shorter)."""
    if window_s is None or window_s <= 0 or t1 - t0 <= window_s:
        return [(t0, t1)]
    edges = [*np.arange(t0, t1, window_s).tolist(), t1]
    return [(float(a), float(b)) for a, b in itertools.pairwise(edges) if b > a]


def check_trace(
    trace: Trace,
    claim: Claim,
    model: PhaseModel,
    window_s: float | None = None,
    params: CheckParams | None = None,
) -> list[WindowVerdict]:
    """Verdicts for one device trace: one per verification window (the whole trace when window_s is None)."""
    p = params or CheckParams()
    if len(trace) == 0:
        return []
    order = np.argsort(trace.time, kind="stable")
    trace = trace.take(order)
    pred = model.predict_trace(trace, evidence=True)
    centre = (pred.start + pred.end) / 2.0
    spans = verification_windows(float(trace.time[0]), float(trace.time[-1]), window_s)
    out = []
    for k, (ws, we) in enumerate(spans):
        last = k == len(spans) - 1
        in_win = (centre >= ws) & ((centre <= we) if last else (centre < we))
        idx = np.flatnonzero(in_win)
        # Half-open spans (the last one closed), so no sample is counted in two windows' FLOP.
        part = trace.take((trace.time >= ws) & ((trace.time <= we) if last else (trace.time < we)))
        out.append(_judge(part, claim, model, pred, idx, ws, we, p))
    return out


def _judge(
    trace: Trace,
    claim: Claim,
    model: PhaseModel,
    pred: WindowPredictions,
    idx: np.ndarray,
    ws: float,
    we: float,
    p: CheckParams,
) -> WindowVerdict:
    sub = take_windows(pred, idx)  # the windows centred in this span, judged as one verdict
    v = from_windows(trace, sub, (ws, we))
    segs = v.segments
    cov = coverage(trace, ws, we, len(idx), int((~decide.unknown_mask(sub)).sum()))
    phase_s: dict[str, float] = {}
    for s in segs:
        phase_s[s.label] = phase_s.get(s.label, 0.0) + max(s.duration, 0.0)
    alarm = decide.first_alert(sub) if len(idx) else None
    flop = estimate_flop(trace, (ws, we))
    reasons: list[str] = []
    verdict = "consistent"
    if claim.kind == "max-flop":
        assert claim.max_flop is not None
        side = flop.versus(claim.max_flop)
        if side == "above":
            verdict = "inconsistent"
            reasons.append(f"FLOP lower bound {flop.lower:.3g} exceeds the declared {claim.max_flop:.3g}")
        elif side == "below":
            reasons.append(f"FLOP upper bound {flop.upper:.3g} is within the declared {claim.max_flop:.3g}")
        else:
            verdict = "unverifiable"
            reasons.append(
                f"FLOP band {flop.lower:.3g}..{flop.upper:.3g} straddles the declared {claim.max_flop:.3g}"
                if flop.method != "none"
                else flop.note
            )
    else:
        bad = [s for s in segs if s.label in claim.forbidden and s.n_windows >= p.min_segment_windows]
        if bad:
            verdict = "inconsistent"
            for lab in sorted({s.label for s in bad}):
                secs = sum(s.duration for s in bad if s.label == lab)
                conf = np.mean([s.confidence for s in bad if s.label == lab])
                reasons.append(f"{lab} for {secs:.0f} s (mean p={conf:.2f}), which '{claim.text}' excludes")
        if claim.excludes_training and alarm is not None:
            verdict = "inconsistent"
            reasons.append(f"training alarm fired at t={alarm:.0f}")
        if (
            claim.kind == "training"
            and verdict == "consistent"
            and cov.windows_judged
            and "training" not in phase_s
        ):
            verdict = "inconsistent"
            reasons.append("no training segment at all")
        if verdict == "consistent":
            if cov.windows == 0 or cov.judged_fraction < p.min_judged:
                verdict = "unverifiable"
                why = sorted({r for r in sub.reasons if r})
                reasons.append(
                    f"the model could call only {cov.windows_judged} of {cov.windows} windows"
                    + (f" ({'; '.join(why[:2])})" if why else "")
                )
            elif cov.covered_fraction < p.min_covered:
                verdict = "unverifiable"
                reasons.append(f"telemetry covers only {cov.covered_fraction:.0%} of the window")
            else:
                reasons.append(f"no forbidden phase in {cov.windows_judged} judged windows")
    return WindowVerdict(
        device=trace.device.uuid,
        device_name=trace.device.name or str(trace.meta.get("gpu_model", "")),
        start=ws,
        end=we,
        claim=claim.text,
        verdict=verdict,
        reasons=reasons,
        phase_seconds=phase_s,
        probabilities=v.probabilities,
        drivers=_drivers(pred, idx, p.top_features),
        alarm_at=alarm,
        coverage=cov,
        model_version=model.version,
        flop=flop,
        flop_thresholds=thresholds(flop),
        assurance=assurance_text(claim, cov, model.version, flop),
        segments=[s.to_dict() for s in segs],
    )


def check_traces(
    traces: Sequence[Trace],
    claim: Claim,
    model: PhaseModel,
    window_s: float | None = None,
    params: CheckParams | None = None,
) -> list[WindowVerdict]:
    out: list[WindowVerdict] = []
    for t in traces:
        out.extend(check_trace(t, claim, model, window_s, params))
    return out


def flop_total(verdicts: Sequence[WindowVerdict], budget: float | None = None) -> dict[str, Any]:
    """Sum of the FLOP bands over all devices and windows (a run's total), against a budget and thresholds."""
    ok = [v.flop for v in verdicts if v.flop.method != "none"]
    missing = len(verdicts) - len(ok)
    tot = FlopEstimate(
        float(sum(f.estimate for f in ok)) if ok else float("nan"),
        float(sum(f.lower for f in ok)) if ok else float("nan"),
        float(sum(f.upper for f in ok)) if ok and not missing else float("inf") if ok else float("nan"),
        "sum" if ok else "none",
        float(sum(f.seconds for f in ok)),
        f"{len(ok)} device-windows"
        + (f"; {missing} without a FLOP estimate (upper bound unknown)" if missing else ""),
    )
    res: dict[str, Any] = {"flop": tot.to_dict(), "thresholds": thresholds(tot)}
    if budget is not None:
        res["budget"] = budget
        res["versus_budget"] = tot.versus(budget)
    return strict_json(res)
