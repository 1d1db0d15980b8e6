"""`phasescope classify PATH...`: classify recorded traces offline, one verdict per device trace.

`--json` prints one object per device trace per line:
    {"path", "device", "label", "probabilities", "missing_signals", "held", "held_by", "segments": [...],
     "windows": [{"start", "end", "label", "p_training"}], "kpis": {...}, ...}
"kpis" holds the telemetry-only KPIs of the device's phase over its segments of that phase
(`kpi.rhythm.trace_kpis`): each figure a {"value", "unit", "method", "confidence"} object.
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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import click
import numpy as np

from phasescope.classify import decide, verdict
from phasescope.classify.held import DeviceProcesses, Held, processes_by_device
from phasescope.cli._options import Duration, FiniteFloatRange
from phasescope.config import ThresholdConfig
from phasescope.errors import PhasescopeError
from phasescope.kpi import rhythm
from phasescope.schema import Trace, Verdict
from phasescope.views.palette import look

# One char per window in the timeline strip, in its phase's colour (views/palette.py, as every view): the
# letter tells the phase apart where colour does not (a monochrome terminal, colour-blind eyes).
_GLYPH: dict[str, tuple[str, str]] = {
    label: (ch, f"bold {look(label).fill}")
    for label, ch in (("training", "T"), ("inference", "I"), ("other", "O"), ("idle", "."),
                      (decide.UNKNOWN, "?"))
}
_STRIP_WIDTH = 96  # longer traces show the majority label of several windows per char
HELD_TEXT = " (held)"  # after "idle" in the human output: idle while holding a model or context


class ClassifyFailed(PhasescopeError):
    """Some inputs could not be classified (each was already named on its own line)."""


@dataclass
class Result:
    """One device trace's verdict (`classify.verdict`), with the file it came from, ready to print."""

    path: str
    trace: Trace
    verdict: Verdict

    @property
    def pred(self) -> Any:
        """The verdict's window predictions (classify.model.WindowPredictions): `classify` always has them."""
        assert self.verdict.windows is not None, "classify_trace always runs the model"
        return self.verdict.windows

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        dev = v.device
        start = np.asarray(self.pred.start, dtype=np.float64)
        end = np.asarray(self.pred.end, dtype=np.float64)
        p_train = decide.p_training(self.pred)
        reasons = verdict.window_reasons(self.pred)
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
            "label": v.label,
            "confidence": _num(v.confidence),
            "probabilities": {k: _num(p) for k, p in v.probabilities.items()},
            "missing_signals": list(v.missing_signals),
            "model_version": v.model_version,
            "unknown_reasons": dict(v.unknown_reasons),
            "held": v.held.held,
            "held_by": v.held.by,
            "segments": [_segment_dict(s, h) for s, h in zip(v.segments, v.segment_held, strict=True)],
            "windows": windows,
        }
        if v.thresholds:  # why windows or segments differ from the model's own rules
            out["thresholds"] = dict(v.thresholds)
        # Telemetry-only KPIs of the verdict's phase, over its segments (kpi/rhythm.py)
        spans = [(s.start, s.end) for s in v.segments if s.label == v.label]
        out["kpis"] = rhythm.trace_kpis(self.trace, v.label, spans)
        return out


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
    """One trace's verdict (`classify.verdict.build`). `thresholds` (the config's) change it only where
    `min_confidence` or `min_segment_s` is set; --window/--stride override the model's window settings.
    `processes`: the device's recorded process samples (a phasescope recording's), None where the file
    records none; they name what holds an idle device."""
    if window is not None or stride is not None:
        model = with_windows(model, window, stride)
    t = thresholds or ThresholdConfig()
    v = verdict.build(trace, model, min_confidence=t.min_confidence, min_segment_s=t.min_segment_s,
                      processes=processes)
    return Result(path, trace, v)


def with_windows(model: Any, window: float | None, stride: float | None) -> Any:
    """A copy of `model` that cuts windows of `window` seconds every `stride` seconds (None: keep)."""
    cfg = model.config
    cfg = replace(cfg, window_s=cfg.window_s if window is None else window,
                  stride_s=cfg.stride_s if stride is None else stride)
    return model.with_config(cfg)


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
            v = r.verdict
            t0 = float(r.pred.start[0]) if len(r.pred.labels) else 0.0
            style = _GLYPH.get(v.label, _GLYPH[decide.UNKNOWN])[1]
            conf = "-" if not math.isfinite(v.confidence) else f"{v.confidence:.2f}"
            phase = v.label + (HELD_TEXT if v.held_idle else "")
            table.add_row(_device_text(r.trace), Text(phase, style=style), conf,
                          _missing_text(v.missing_signals),
                          _segments_text(v.segments, t0, v.segment_held))
        console.print(table)
        for r in rs:
            head = f"  {_device_text(r.trace).split()[0]:>4} "
            strip = Text(head, style="dim")
            width = max(10, min(_STRIP_WIDTH, console.width - len(head) - 1))
            for ch, style in timeline(r.pred.labels, width):
                strip.append(ch, style=style)
            console.print(strip, no_wrap=True, overflow="crop")
            why = r.verdict.unknown_reasons
            if r.verdict.label == decide.UNKNOWN and why:  # say why, so the unknown can be acted on
                top = next(iter(why))
                count = f" ({why[top]} windows)" if why[top] else ""  # 0: no window at all
                console.print(Text(f"  unknown: {top}{count}", style="dim"))
    legend = "  ".join(f"{c} {lab}" for lab, (c, _) in _GLYPH.items())
    console.print(Text(f"timeline: one char per window (or per group of windows): {legend}", style="dim"))
    used = next((r.verdict.thresholds for r in results if r.verdict.thresholds), {})
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
@click.option("--window", type=Duration(), default=None,
              help="Window length, e.g. 30s (default: the model's).")
@click.option("--stride", type=Duration(), default=None,
              help="Stride between windows, e.g. 5s (default: the model's).")
@click.option("--min-confidence", type=FiniteFloatRange(0, 1), default=None,
              help="Windows whose best probability is below this read unknown (default: the config file's "
                   "[thresholds] min_confidence; unset, the model's own 0.5).")
@click.option("--min-segment", "min_segment_s", type=Duration(min_open=False), default=None,
              help="Shortest segment, e.g. 90s; shorter ones join a touching neighbour (default: the config "
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
