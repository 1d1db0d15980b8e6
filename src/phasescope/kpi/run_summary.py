"""The run summary: per process, the phase timeline, counts, KPIs and lint warnings, as plain JSON data."""

from __future__ import annotations

from typing import Any

from phasescope.instrument import events as ev
from phasescope.instrument.lints import lint
from phasescope.instrument.timeline import Timeline, build
from phasescope.kpi.inference import inference_kpis
from phasescope.kpi.training import step_series, training_kpis

SUMMARY_VERSION = 1


def process_summary(tl: Timeline, idle_gap_s: float, with_peak: bool) -> dict[str, Any]:
    training = training_kpis(tl, idle_gap_s=idle_gap_s, with_peak=with_peak)
    inference = inference_kpis(tl)
    return {
        "pid": tl.pid,
        "device": tl.device,
        "device_name": tl.meta.get("device_name", ""),
        "argv": tl.meta.get("argv", []),
        "modules": [{k: r[k] for k in ("name", "params", "param_bytes", "dtype", "device")}
                    for r in tl.meta.get("roots") or []],
        "segments": [s.to_dict(tl.wall_offset) for s in tl.segments],
        "forwards": int(tl.f_idx.size),
        "steps": tl.steps,
        "requests": inference["requests"] if inference else 0,
        "training": training,
        "inference": inference,
        "series": step_series(tl, idle_gap_s) if training else None,
        "warnings": lint(tl),
    }


def summarize(processes: list[ev.ProcessEvents], idle_gap_s: float = 10.0,
              with_peak: bool = True, now: float | None = None) -> dict[str, Any]:
    """Summarise every process that ran at least one forward or optimizer step; `now` (Unix seconds) for a
    live view of runs still going, where forwards whose backward may still come count as neither phase."""
    procs = []
    for pe in processes:
        tl = build(pe, idle_gap_s=idle_gap_s, now=now)
        if tl.f_idx.size or tl.o_id.size:
            procs.append(process_summary(tl, idle_gap_s, with_peak))
    segments = [dict(s, pid=p["pid"], device=p["device"]) for p in procs for s in p["segments"]]
    segments.sort(key=lambda s: s["start"])
    return {
        "version": SUMMARY_VERSION,
        "processes": procs,
        "segments": segments,
        "steps": sum(p["steps"] for p in procs),
        "requests": sum(p["requests"] for p in procs),
        "forwards": sum(p["forwards"] for p in procs),
        "warnings": [dict(w, pid=p["pid"]) for p in procs for w in p["warnings"]],
    }
