"""`phasescope classify PATH...`: classify recorded traces offline, one verdict per device trace.

`--json` prints one object per device trace per line:
    {"path", "device", "label", "probabilities", "missing_signals", "held", "held_by", "segments": [...],
     "windows": [{"start", "end", "label", "p_training"}], ...}
"held" says whether the device's idle is *held* (a loaded model or a CUDA context kept while serving
nothing: `classify.held`, the rule the live view uses): true or false for a device labelled idle, false for
one labelled a working phase, null where it cannot be told (no memory reading in its idle time, or the
label is unknown).
Each idle segment carries its own "held". "held_by" lists the processes seen on the device in that idle time
({"pid", "name"}) where the file recorded processes (a phasescope recording), else null.
plus "thresholds" ({"min_confidence", "min_segment_s"}: the ones set) only when the config file or a flag
sets `[thresholds] min_confidence` / `min_segment_s`; unset, the output is the evaluated rules' alone.
Without it, a short table and a timeline strip per device. A file that cannot be read gets one line on
stderr; the other paths are still classified, and the exit code is non-zero if any failed.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import click
import numpy as np

from phasescope.classify import decide
from phasescope.classify.held import DeviceProcesses, Held, judge_spans, processes_by_device
from phasescope.cli._options import FiniteFloatRange
from phasescope.config import ThresholdConfig
from phasescope.errors import PhasescopeError
from phasescope.schema import Trace

# One char per window in the timeline strip, and its colour.
_GLYPH: dict[str, tuple[str, str]] = {
    "training": ("T", "bold red"),
    "inference": ("I", "bold cyan"),
    "other": ("O", "yellow"),
    "idle": (".", "dim"),
    decide.UNKNOWN: ("?", "magenta"),
}
_STRIP_WIDTH = 96  # longer traces show the majority label of several windows per char
HELD_TEXT = " (held)"  # after "idle" in the human output: idle while holding a model or context


class ClassifyFailed(PhasescopeError):
    """Some inputs could not be classified (each was already named on its own line)."""


@dataclass
class Result:
    """The classification of one device trace, ready to print."""

    path: str
    trace: Trace
    pred: Any  # classify.model.WindowPredictions
    segments: list[decide.Segment]
    label: str
    probabilities: dict[str, float]
    confidence: float
    thresholds: dict[str, float] = field(default_factory=dict)  # the config's thresholds set, as applied
    held: Held = field(default_factory=lambda: Held(None, None))  # the device's idle time: held or not
    segment_held: list[Held | None] = field(default_factory=list)  # per segment; None for a non-idle one

    @property
    def held_idle(self) -> bool:
        """Labelled idle, and that idle is held."""
        return self.label == "idle" and self.held.held is True

    def to_json(self) -> dict[str, Any]:
        dev = self.trace.device
        start = np.asarray(self.pred.start, dtype=np.float64)
        end = np.asarray(self.pred.end, dtype=np.float64)
        p_train = decide.p_training(self.pred)
        reasons = list(getattr(self.pred, "reasons", [])) or [""] * len(self.pred.labels)
        windows = []
        rows = zip(start.tolist(), end.tolist(), self.pred.labels, p_train.tolist(), reasons, strict=True)
        for s, e, lab, p, why in rows:
            w: dict[str, Any] = {"start": float(s), "end": float(e), "label": lab, "p_training": _num(p)}
            if lab == decide.UNKNOWN and why:
                w["reason"] = why  # what a person can act on: too little data, unlike the training data, ...
            windows.append(w)
        out = {
            "path": self.path,
            "device": dev.uuid,
            "device_name": dev.name,
            "gpu_index": dev.index,
            "format": self.trace.meta.get("format"),
            "label": self.label,
            "confidence": _num(self.confidence),
            "probabilities": {k: _num(v) for k, v in self.probabilities.items()},
            "missing_signals": list(self.pred.missing_signals),
            "model_version": self.pred.model_version,
            "unknown_reasons": unknown_reasons(self.pred.labels, reasons),
            "held": self.held.held,
            "held_by": self.held.by,
            "segments": [_segment_dict(s, h) for s, h in
                         zip(self.segments, self.segment_held or [None] * len(self.segments), strict=True)],
            "windows": windows,
        }
        if self.thresholds:  # why windows or segments differ from the model's own rules
            out["thresholds"] = dict(self.thresholds)
        return out


def unknown_reasons(labels: Sequence[str], reasons: Sequence[str]) -> dict[str, int]:
    """Why windows were unknown: each reason (its numbers dropped, so alike reasons count together)
    with how many windows gave it, the most common first."""
    counts: dict[str, int] = {}
    for lab, why in zip(labels, reasons, strict=True):
        if lab == decide.UNKNOWN and why:
            key = re.sub(r":?\s*best probability [\d.]+\s*<\s*[\d.]+", "", why).strip() or "low confidence"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _segment_dict(seg: decide.Segment, held: Held | None) -> dict[str, Any]:
    out = seg.to_dict()
    if held is not None:  # an idle segment: held or not, and by what where known
        out["held"] = held.held
        out["held_by"] = held.by
    return out


def classify_trace(
    model: Any,
    trace: Trace,
    path: str,
    window: float | None,
    stride: float | None,
    thresholds: ThresholdConfig | None = None,
    processes: DeviceProcesses | None = None,
) -> Result:
    """One trace's verdict. `thresholds` (the config's) changes it only where `min_confidence` or
    `min_segment_s` is set: windows whose best probability is below min_confidence read unknown (it
    replaces the model's own `min_proba`), and no segment is shorter than min_segment_s where a neighbour
    touches it (unknown runs under it are bridged, short phase segments merged: `decide.merge_short`).
    `processes`: the device's recorded process samples (a phasescope recording's), None where the file
    records none; they name what holds an idle device."""
    used: dict[str, float] = {}
    params = decide.SegmentParams()
    if thresholds is not None and thresholds.min_confidence is not None:
        used["min_confidence"] = thresholds.min_confidence
        model = model.with_rules(min_proba=thresholds.min_confidence)
    if thresholds is not None and thresholds.min_segment_s is not None:
        used["min_segment_s"] = thresholds.min_segment_s
        params = replace(params, min_unknown_s=max(params.min_unknown_s, thresholds.min_segment_s))
    pred = _predict(model, trace, window, stride)
    segs = decide.segments(pred, params)
    if "min_segment_s" in used:
        segs = decide.merge_short(segs, used["min_segment_s"])
    label = decide.overall_label(segs)
    seg_held = [judge_spans(trace, [(s.start, s.end)], processes) if s.label == "idle" else None
                for s in segs]
    return Result(path, trace, pred, segs, label, decide.mean_probabilities(pred), _confidence(segs, label),
                  used, _device_held(trace, segs, label, processes), seg_held)


def _device_held(
    trace: Trace, segs: Sequence[decide.Segment], label: str, processes: DeviceProcesses | None
) -> Held:
    """Held-ness of the device's verdict: over all its idle time when labelled idle; not held when labelled a
    working phase; not told when the label is unknown."""
    if label == "idle":
        return judge_spans(trace, [(s.start, s.end) for s in segs if s.label == "idle"], processes)
    return Held(None if label == decide.UNKNOWN else False, None)


def _predict(model: Any, trace: Trace, window: float | None, stride: float | None) -> Any:
    """The model's window predictions; --window/--stride override its window settings for this call."""
    if window is not None or stride is not None:
        model = with_windows(model, window, stride)
    return model.predict_trace(trace)


def with_windows(model: Any, window: float | None, stride: float | None) -> Any:
    """A copy of `model` that cuts windows of `window` seconds every `stride` seconds (None: keep)."""
    cfg = model.config
    cfg = replace(cfg, window_s=cfg.window_s if window is None else window,
                  stride_s=cfg.stride_s if stride is None else stride)
    return model.with_config(cfg)


def _confidence(segs: Sequence[decide.Segment], label: str) -> float:
    """Time-weighted mean probability of `label` over the segments that carry it."""
    mine = [s for s in segs if s.label == label and math.isfinite(s.confidence)]
    total = sum(max(s.duration, 0.0) for s in mine)
    if not mine:
        return float("nan")
    if total <= 0:
        return float(np.mean([s.confidence for s in mine]))
    return sum(s.confidence * max(s.duration, 0.0) for s in mine) / total


def _num(v: float) -> float | None:
    return decide.finite_or_none(float(v))  # float(): numpy scalars are not all JSON-serialisable


# --- human output ------------------------------------------------------------------------------------


def timeline(labels: Sequence[str], width: int = _STRIP_WIDTH) -> list[tuple[str, str]]:
    """(char, style) per window, or per bin of windows (the bin's most common label) when there are many."""
    n = len(labels)
    if n == 0:
        return []
    bins = min(n, width)
    edges = np.linspace(0, n, bins + 1).round().astype(int)
    out: list[tuple[str, str]] = []
    for lo, hi in itertools.pairwise(edges.tolist()):
        chunk = list(labels[lo:hi])
        # Majority label; ties go to the first seen, so a lone odd window inside a bin does not show.
        top = max(dict.fromkeys(chunk), key=chunk.count)
        out.append(_GLYPH.get(top, _GLYPH[decide.UNKNOWN]))
    return out


def _span(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _segments_text(
    segs: Sequence[decide.Segment], t0: float, held: Sequence[Held | None] = (), limit: int = 4
) -> str:
    marks = [HELD_TEXT if h is not None and h.held else "" for h in held] or [""] * len(segs)
    parts = [f"{s.label}{m} {_span(s.start - t0)}-{_span(s.end - t0)}"
             for s, m in zip(segs[:limit], marks[:limit], strict=True)]
    if len(segs) > limit:
        parts.append(f"+{len(segs) - limit} more")
    return ", ".join(parts) or "-"


def _missing_text(missing: Sequence[str]) -> str:
    """Missing signals, with the PCIe and clock pairs folded into one word each."""
    names = list(missing)
    for pair, word in ((("pcie_tx", "pcie_rx"), "pcie"), (("sm_clock", "mem_clock"), "clocks")):
        if all(p in names for p in pair):
            names = [n for n in names if n not in pair] + [word]
    return ", ".join(names) or "-"


def _device_text(trace: Trace) -> str:
    dev = trace.device
    idx = f"#{dev.index}" if dev.index is not None else "#-"
    name = dev.name.replace("NVIDIA ", "").replace("GeForce ", "") if dev.name else ""
    return f"{idx} {name}".strip()


def print_human(results: Sequence[Result]) -> None:
    """Per file: its path, a table row per device, then a timeline strip per device."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    by_path: dict[str, list[Result]] = {}
    for r in results:
        by_path.setdefault(r.path, []).append(r)
    for path, rs in by_path.items():
        console.print(Text(_short_path(path, max(20, console.width - 1)), style="bold"))
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="dim")
        for col in ("device", "phase", "conf", "missing", "segments"):
            table.add_column(col, overflow="fold")
        for r in rs:
            t0 = float(r.pred.start[0]) if len(r.pred.labels) else 0.0
            style = _GLYPH.get(r.label, _GLYPH[decide.UNKNOWN])[1]
            conf = "-" if not math.isfinite(r.confidence) else f"{r.confidence:.2f}"
            phase = r.label + (HELD_TEXT if r.held_idle else "")
            table.add_row(_device_text(r.trace), Text(phase, style=style), conf,
                          _missing_text(r.pred.missing_signals),
                          _segments_text(r.segments, t0, r.segment_held))
        console.print(table)
        for r in rs:
            head = f"  {_device_text(r.trace).split()[0]:>4} "
            strip = Text(head, style="dim")
            width = max(10, min(_STRIP_WIDTH, console.width - len(head) - 1))
            for ch, style in timeline(r.pred.labels, width):
                strip.append(ch, style=style)
            console.print(strip, no_wrap=True, overflow="crop")
            if r.label == decide.UNKNOWN:  # say why, so the unknown can be acted on
                why = unknown_reasons(r.pred.labels, list(getattr(r.pred, "reasons", [])) or
                                      [""] * len(r.pred.labels))
                if why:
                    top = next(iter(why))
                    console.print(Text(f"  unknown: {top} ({why[top]} windows)", style="dim"))
    legend = "  ".join(f"{c} {lab}" for lab, (c, _) in _GLYPH.items())
    console.print(Text(f"timeline: one char per window (or per group of windows): {legend}", style="dim"))
    used = next((r.thresholds for r in results if r.thresholds), {})
    if used:
        text = ", ".join(f"{k} {v:g}" for k, v in used.items())
        console.print(Text(f"thresholds set (config or flags): {text}", style="dim"))


def _recorded_processes(path: str, traces: Sequence[Trace]) -> dict[str, DeviceProcesses] | None:
    """uuid -> process samples where the file kept them (a phasescope recording with process rows); None
    for every other format, and for a recording without process rows (nothing tells who held a GPU)."""
    if not traces or traces[0].meta.get("format") != "phasescope":
        return None
    from phasescope.store.recording import read_processes

    table = read_processes(path)
    if table.num_rows == 0:
        return None
    by_device = processes_by_device(table)
    empty = DeviceProcesses(np.zeros(0), np.zeros(0, dtype=np.int64), [])
    return {t.device.uuid: by_device.get(t.device.uuid, empty) for t in traces}


def _short_path(path: str, limit: int = 48) -> str:
    return path if len(path) <= limit else "..." + path[-(limit - 3):]


# --- command -----------------------------------------------------------------------------------------


@click.command("classify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("--format", "fmt", default="auto", show_default=True,
              help="File format: auto, or a reader name (see docs/FORMATS.md), with options after ':'.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per device trace per line.")
@click.option("--model", "model_path", default=None, type=click.Path(dir_okay=False, path_type=str),
              help="Model file (default: the model shipped with phasescope).")
@click.option("--window", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="Window length in seconds (default: the model's).")
@click.option("--stride", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="Stride between windows in seconds (default: the model's).")
@click.option("--min-confidence", type=FiniteFloatRange(0, 1), default=None,
              help="Windows whose best probability is below this read unknown (default: the config file's "
                   "[thresholds] min_confidence; unset, the model's own 0.5).")
@click.option("--min-segment", "min_segment_s", type=FiniteFloatRange(min=0), default=None,
              help="Shortest segment in seconds; shorter ones join a touching neighbour (default: the config "
                   "file's [thresholds] min_segment_s; unset, none is merged).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (its [thresholds]; default: $PHASESCOPE_CONFIG or the user's).")
def command(paths: tuple[str, ...], fmt: str, as_json: bool, model_path: str | None,
            window: float | None, stride: float | None, min_confidence: float | None,
            min_segment_s: float | None, config_path: str | None) -> None:
    """Classify recorded traces: training, inference, other compute or idle, per device and over time.

    \b
    Examples:
      phasescope classify run.parquet
      phasescope classify nvml.csv gpu_log.csv --json
    """
    from phasescope import config as configmod
    from phasescope.classify.model import PhaseModel
    from phasescope.sources.replay import read

    thresholds = configmod.load(config_path).override(
        thresholds__min_confidence=min_confidence, thresholds__min_segment_s=min_segment_s
    ).thresholds
    model = PhaseModel.load(model_path)
    failures: list[PhasescopeError] = []
    results: list[Result] = []
    for path in paths:
        try:
            traces = read(path, fmt)
            procs = _recorded_processes(path, traces)
            out = [classify_trace(model, t, path, window, stride, thresholds,
                                  procs.get(t.device.uuid) if procs is not None else None) for t in traces]
        except PhasescopeError as exc:
            failures.append(exc)
            if len(paths) > 1:
                click.echo(f"phasescope: {exc}", err=True)
            continue
        if as_json:
            for r in out:
                click.echo(json.dumps(r.to_json(), allow_nan=False))
        else:
            results.extend(out)
    if results:
        print_human(results)
    if failures:
        if len(paths) == 1:
            raise failures[0]
        raise ClassifyFailed(f"{len(failures)} of {len(paths)} inputs could not be classified")
