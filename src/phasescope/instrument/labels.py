"""Ground-truth labels from hook events, in the columns of shared/data/labels.csv.

Hook events share the telemetry's wall clock and device identity (CUDA UUID as NVML spells it, or
`host:<hostname>` as the host source does), so each phase segment becomes one labelled span of a recording.
This is what `phasescope record --label-from-hooks` calls after recording a command run through
`phasescope.instrument.inject.child_env()`.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.instrument.events import ProcessEvents, load_events
from phasescope.instrument.timeline import phase_segments
from phasescope.schema import DeviceInfo, FloatArray

LABEL_COLUMNS: tuple[str, ...] = ("path", "gpu_index", "t_from", "t_to", "label", "family", "gpu", "source",
                                  "rate_hz", "signals", "run", "notes")


def label_rows(events: str | Path | list[ProcessEvents], recording_path: str, devices: Sequence[DeviceInfo],
               *, family: str = "", run: str = "", rate_hz: float | str = "", signals: str = "",
               source: str = "phasescope-hooks", idle_gap_s: float = 10.0,
               min_span_s: float = 0.0) -> list[dict[str, Any]]:
    """One row per phase segment of every process, on the recording's device index.

    A process's device is matched by UUID; a CPU-only process (`host:<name>`) falls back to the only device of
    a one-device recording. Segments on devices the recording does not hold are left out.
    `t_from` / `t_to` are Unix seconds, the clock of phasescope recordings.
    """
    procs = load_events(events) if isinstance(events, (str, Path)) else events
    index_of = {d.uuid: _index(d, i) for i, d in enumerate(devices)}
    name_of = {d.uuid: d.name for d in devices}
    rows: list[dict[str, Any]] = []
    for seg in phase_segments(procs, idle_gap_s=idle_gap_s):
        uuid = seg["device"]
        if uuid not in index_of and uuid.startswith("host:") and len(devices) == 1:
            uuid = devices[0].uuid
        if uuid not in index_of or seg["end"] - seg["start"] < min_span_s:
            continue
        rows.append({
            "path": recording_path, "gpu_index": index_of[uuid], "t_from": f"{seg['start']:.3f}",
            "t_to": f"{seg['end']:.3f}", "label": seg["phase"], "family": family, "gpu": name_of[uuid],
            "source": source, "rate_hz": rate_hz, "signals": signals, "run": run or Path(recording_path).stem,
            "notes": f"from hooks: pid {seg['pid']}, {seg['steps']} steps, {seg['forwards']} forwards",
        })
    return rows


def _index(d: DeviceInfo, position: int) -> int:
    return d.index if d.index is not None else position


def split_unsampled(rows: list[dict[str, Any]], devices: Sequence[DeviceInfo],
                    times: Mapping[str, FloatArray]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows whose span holds a sample of their device, rows whose span holds none), by the recording's
    sample `times` per device UUID. `phasescope eval` / `train-model` refuse a row without a sample (e.g.
    a 0.1 s evaluation tail recorded at 1 Hz), so such rows must not be written."""
    uuid_of = {_index(d, i): d.uuid for i, d in enumerate(devices)}
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for row in rows:
        t = times.get(uuid_of.get(row["gpu_index"], ""), np.empty(0))
        inside = (t >= float(row["t_from"])) & (t <= float(row["t_to"]))  # as the label reader slices
        (kept if inside.any() else dropped).append(row)
    return kept, dropped


def write_labels_csv(rows: list[dict[str, Any]], out: str | Path, append: bool = True) -> Path:
    """Write rows under the labels.csv header. Appending to an existing table puts them under its own header
    (a site's table may order its columns differently, or hold only the required `path,label`: then the
    columns it lacks are added, its rows reading empty there, which is what a missing column means)."""
    path = Path(out)
    if not (append and path.exists() and path.stat().st_size > 0):
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(LABEL_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)
        return path
    with open(path, newline="", encoding="utf-8-sig") as fh:
        header = next(csv.reader(fh), [])
    missing = [c for c in LABEL_COLUMNS if c not in header]
    if missing:  # rewritten whole, with the new columns (renamed into place: never half a table)
        with open(path, newline="", encoding="utf-8-sig") as fh:
            old = list(csv.DictReader(fh))
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=header + missing, restval="", extrasaction="ignore")
            writer.writeheader()
            writer.writerows(old)
            writer.writerows(rows)
        os.replace(tmp, path)
        return path
    with open(path, "rb") as fb:
        fb.seek(-1, os.SEEK_END)
        unterminated = fb.read(1) not in b"\r\n"  # a hand-edited last line: the first row must not join it
    with open(path, "a", newline="") as fh:
        if unterminated:
            fh.write("\r\n")
        csv.DictWriter(fh, fieldnames=header, restval="").writerows(rows)
    return path
