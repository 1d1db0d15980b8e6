"""Idle that is *held*, judged on a recorded trace: a GPU holding a loaded model or a CUDA context while it
serves nothing is idle, and paid for.

The live view (`live_state.LiveState.idle_held`) calls an idle device held when a process is on it or
`schema.HELD_MEM_BYTES` of its memory is in use. Over a recorded span the same bar applies to the *median*
memory in use through the span (a brief spike while a model loads or frees does not make a span held), and,
where the recording kept them (a phasescope recording's process samples), to the processes seen on the device
in the span. Where the trace has neither, held-ness cannot be told: None, never a guessed False.
`phasescope classify` and `phasescope fleet` both judge by this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from phasescope.schema import HELD_MEM_BYTES, Trace

Span = tuple[float, float]


def _inside(time: npt.NDArray[np.float64], spans: Sequence[Span]) -> npt.NDArray[np.bool_]:
    mask = np.zeros(time.shape, dtype=bool)
    for start, end in spans:
        mask |= (time >= start) & (time <= end)
    return mask


def memory_held(trace: Trace, spans: Sequence[Span], threshold: float = HELD_MEM_BYTES) -> bool | None:
    """Whether the median memory in use over the samples inside `spans` (closed intervals) is at least
    `threshold`; None when the trace has no memory reading there (no `mem_used` column, or only NaN)."""
    mem = trace.columns.get("mem_used")
    if mem is None:
        return None
    inside = _inside(trace.time, spans) & np.isfinite(mem)
    if not inside.any():
        return None
    return bool(float(np.median(mem[inside])) >= threshold)


@dataclass(frozen=True)
class DeviceProcesses:
    """The process samples a recording kept for one device: one entry per (sample time, process)."""

    time: npt.NDArray[np.float64]
    pid: npt.NDArray[np.int64]
    name: list[str]

    def holders(self, spans: Sequence[Span]) -> list[dict[str, Any]]:
        """The processes seen inside `spans`, each once ({"pid", "name"}), in the order first seen."""
        seen: dict[int, str] = {}
        for i in np.flatnonzero(_inside(self.time, spans)).tolist():
            seen.setdefault(int(self.pid[i]), self.name[i])
        return [{"pid": pid, "name": name} for pid, name in seen.items()]


def processes_by_device(table: Any) -> dict[str, DeviceProcesses]:
    """uuid -> its process samples, from a recording's process table (`recording.read_processes`: columns
    time, device, pid, name). Rows without a device are left out."""
    if table is None or table.num_rows == 0:
        return {}
    time = np.asarray(table.column("time").to_numpy(zero_copy_only=False), dtype=np.float64)
    pid = np.asarray(table.column("pid").to_numpy(zero_copy_only=False), dtype=np.int64)
    uuids = np.asarray(table.column("device").to_pylist(), dtype=object)
    names = np.asarray([n or "" for n in table.column("name").to_pylist()], dtype=object)
    out: dict[str, DeviceProcesses] = {}
    for uuid in dict.fromkeys(u for u in uuids.tolist() if u):
        rows = uuids == uuid
        out[uuid] = DeviceProcesses(time[rows], pid[rows], [str(n) for n in names[rows]])
    return out


@dataclass(frozen=True)
class Held:
    """Whether a stretch of idle is held, and by what where the recording tells."""

    held: bool | None  # None: neither memory nor processes recorded, it cannot be told
    by: list[dict[str, Any]] | None  # the processes seen on the device ([] none), or None: none recorded


def judge_spans(
    trace: Trace,
    spans: Sequence[Span],
    processes: DeviceProcesses | None = None,
    threshold: float = HELD_MEM_BYTES,
) -> Held:
    """Whether the device was held through `spans` (its idle time): by memory, or by a process on it.

    `processes`: the device's recorded process samples, None where the source records none."""
    by = processes.holders(spans) if processes is not None else None
    held = memory_held(trace, spans, threshold)
    if by:  # a process on the device holds it, whatever the memory says (as live_state's rule)
        held = True
    elif held is None and by is not None:
        held = False  # no memory reading, but the processes were recorded: none was there
    return Held(held, by)


__all__ = ["DeviceProcesses", "Held", "judge_spans", "memory_held", "processes_by_device"]
