"""The hook event log: one flat float64 buffer of fixed-width rows, written to disk as .npz chunks.

A row is (kind, t, a, b, c, d, flags, e). One `list.append(tuple)` per event keeps the hot path to a single
C call (atomic under the GIL, so a flushing thread never sees half a row); a background thread compacts the
tuples into float64 arrays. A forward (one outermost module call) is one row, written when it ends, with
its start in `t` and its end in `e`.
`t` is `time.monotonic()`; each chunk carries the (wall, monotonic) anchor taken when it was written, so
readers map events to Unix time, the clock telemetry uses.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from phasescope.errors import InputError
from phasescope.identity import host_name

ROW = 8  # kind, t, a, b, c, d, flags, e
ROW_V1 = 7  # version 1 logs: no `e` column, a forward written as FWD_BEGIN + FWD_END rows

# Event kinds (column 0). Meaning of t, a, b, c, d, e per kind (t: when the event happened, unless stated):
# FWD: t=start, a=root id, b=forward index, c=batch size, d=sequence length (token inputs), flags, e=end
FWD = 10.0
FWD_BEGIN = 1.0  # version 1 only: a=root id, b=forward index
FWD_END = 2.0  # version 1 only: a=root id, b=forward index, c=batch size, d=sequence length, flags
BWD_BEGIN = 3.0  # a=forward index of the first graph reached
BWD_FWD = 4.0  # a=forward index whose output graph the backward pass reached
BWD_END = 5.0
OPT_BEGIN = 6.0  # a=optimizer id, b=step number of that optimizer
OPT_END = 7.0  # a=optimizer id, b=step number
FLOP_SAMPLE_BEGIN = 8.0  # a=optimizer id, b=step number the sample covers
FLOP_SAMPLE_END = 9.0  # a=optimizer id, b=step number
# t=when `backward()` was called on a one-element tensor, a=its value (the loss; an AMP GradScaler's scaled
# loss is recorded unscaled). Written once the value is on the host, so after later rows: sort by t to read.
LOSS = 11.0

# Bits of `flags` on FWD (version 1: FWD_END): the autograd and module state the forward ran under.
GRAD_ENABLED = 1
INFERENCE_MODE = 2
MODULE_TRAINING = 4
TOKEN_INPUT = 8  # first input is an integer tensor of token IDs, shape (batch, seq, ...)
HAS_GRAPH = 16  # output carries an autograd graph (grad_fn)
RAISED = 32  # the forward raised an exception
# Not a forward of its own (a loss or metric module, or a module called on a forward's output): the module
# holds no state, or its first input carries an autograd graph. Its time is work; it is no forward, no batch.
DOWNSTREAM = 64

EVENTS_DIR_ENV = "PHASESCOPE_EVENTS_DIR"
FLUSH_ENV = "PHASESCOPE_FLUSH_S"
FORMAT = "phasescope-hook-events"
VERSION = 2  # 1: seven columns, FWD_BEGIN / FWD_END rows (still read)


def device_for_host() -> str:
    return f"host:{host_name()}"


class EventBuffer:
    """Rows as they come (`rows.append(tuple)`, ~70 ns, the cheapest thing a hook can do: `array.extend`
    of a tuple costs ~300 ns), compacted into float64 chunks off the hot path.

    `compact()` (the recorder's background thread, every flush interval) turns the appended tuples into one
    (n, ROW) array, so a long run holds 64 bytes per event, not Python objects. `take_new()` hands back the
    rows not taken yet and drops them from memory (a flushed log lives on disk); `snapshot()` copies all.
    Appends are single C calls under the GIL, and compaction slices off only the first n rows it counted,
    so rows appended meanwhile by any thread stay.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[float, ...]] = []
        self._chunks: list[npt.NDArray[np.float64]] = []
        self._lock = threading.Lock()  # between compacting / taking threads; appends never take it

    def __len__(self) -> int:
        return sum(c.shape[0] for c in self._chunks) + len(self.rows)

    def compact(self) -> None:
        with self._lock:
            self._compact()

    def _compact(self) -> None:
        n = len(self.rows)
        if n:
            chunk = np.array(self.rows[:n], dtype=np.float64).reshape(-1, ROW)
            del self.rows[:n]
            self._chunks.append(chunk)

    def take_new(self) -> npt.NDArray[np.float64]:
        with self._lock:
            self._compact()
            chunks, self._chunks = self._chunks, []
        return np.concatenate(chunks) if chunks else np.empty((0, ROW))

    def snapshot(self) -> npt.NDArray[np.float64]:
        with self._lock:
            tail = np.array(self.rows[:len(self.rows)], dtype=np.float64).reshape(-1, ROW)
            return np.concatenate([*self._chunks, tail])

    def clear(self) -> None:
        with self._lock:
            del self.rows[:]  # the same list: hooks hold its bound append
            self._chunks = []


@dataclass
class ProcessEvents:
    """All hook events of one process, columnar, plus what the process knew about its modules."""

    pid: int
    rows: npt.NDArray[np.float64]  # (n, ROW); t in monotonic seconds
    wall_offset: float  # wall = t + wall_offset
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return str(self.meta.get("device") or device_for_host())

    def column(self, kind: float) -> npt.NDArray[np.float64]:
        return self.rows[self.rows[:, 0] == kind]


def write_chunk(directory: Path, pid: int, seq: int, rows: npt.NDArray[np.float64],
                meta: dict[str, Any]) -> None:
    """Write new rows as one .npz chunk and the process's metadata as JSON, both atomically (tmp + rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    anchor = np.array([time.time(), time.monotonic()], dtype=np.float64)
    if rows.size:
        tmp = directory / f".events-{pid}-{seq:06d}.npz.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, rows=rows, anchor=anchor)
        os.replace(tmp, directory / f"events-{pid}-{seq:06d}.npz")
    doc = {"format": FORMAT, "version": VERSION, "pid": pid, "anchor": anchor.tolist(), **meta}
    tmpj = directory / f".meta-{pid}.json.tmp"
    tmpj.write_text(json.dumps(doc))
    os.replace(tmpj, directory / f"meta-{pid}.json")


def read_rows(chunk: Path) -> npt.NDArray[np.float64]:
    """One .npz chunk's rows as (n, ROW) float64; a version 1 chunk (seven columns) gets a zero `e` column."""
    try:
        with np.load(chunk, allow_pickle=False) as z:
            rows = np.asarray(z["rows"], dtype=np.float64)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(chunk, "events", "an .npz chunk with a 'rows' array", str(exc)) from exc
    if rows.ndim == 2 and rows.shape[1] == ROW_V1:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], ROW - ROW_V1))], axis=1)
    if rows.ndim != 2 or rows.shape[1] != ROW:
        raise InputError(chunk, "rows", f"shape (n, {ROW}) (version 1: (n, {ROW_V1}))", rows.shape)
    return rows


def load_events(directory: str | Path) -> list[ProcessEvents]:
    """Read every process's events from an events directory (what `phasescope run` hands the child)."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(root, "events directory", "a directory written by phasescope hooks",
                         "no such directory")
    out: list[ProcessEvents] = []
    for meta_path in sorted(root.glob("meta-*.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(meta_path, "metadata", "JSON written by phasescope hooks", str(exc)) from exc
        if meta.get("format") != FORMAT:
            raise InputError(meta_path, "format", FORMAT, meta.get("format"))
        pid = int(meta["pid"])
        chunks = [read_rows(chunk) for chunk in sorted(root.glob(f"events-{pid}-*.npz"))]
        rows = np.concatenate(chunks) if chunks else np.empty((0, ROW))
        anchor = meta.get("anchor") or [time.time(), time.monotonic()]
        out.append(ProcessEvents(pid, rows, float(anchor[0]) - float(anchor[1]), meta))
    return out
