"""Ground-truth labels from hook events, in the columns of shared/data/labels.csv.

Hook events share the telemetry's wall clock and device identity (CUDA UUID as NVML spells it, or
`host:<hostname>` as the host source does), so each phase segment becomes one labelled span of a recording.
This is what `phasescope record --label-from-hooks` calls after recording a command run through
`phasescope.instrument.inject.child_env()`.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phasescope.instrument.analysis import summarize
from phasescope.instrument.events import ProcessEvents, load_events
from phasescope.schema import DeviceInfo

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
    summary = summarize(procs, idle_gap_s=idle_gap_s, with_peak=False)
    index_of = {d.uuid: (d.index if d.index is not None else i) for i, d in enumerate(devices)}
    name_of = {d.uuid: d.name for d in devices}
    rows: list[dict[str, Any]] = []
    for seg in summary["segments"]:
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


def write_labels_csv(rows: list[dict[str, Any]], out: str | Path, append: bool = True) -> Path:
    """Write rows under the labels.csv header (appending to an existing file keeps its header)."""
    path = Path(out)
    exists = append and path.exists() and path.stat().st_size > 0
    with open(path, "a" if exists else "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(LABEL_COLUMNS))
        if not exists:
            writer.writeheader()
        writer.writerows(rows)
    return path
