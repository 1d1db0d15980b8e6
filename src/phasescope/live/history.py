"""Recent history from a live store for the live views (`top --store`, `serve --store`): the watched
devices' last minutes into `LiveState`'s rings before the first tick, and the live classifier replayed
over them so the phase shows at once.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from phasescope.errors import InputError
from phasescope.live.state import DEFAULT_HISTORY, LiveState
from phasescope.schema import DeviceInfo, Trace

if TYPE_CHECKING:
    from phasescope.live.classify import LiveClassifier
    from phasescope.store.live import Store

DEFAULT_HISTORY_S = 600.0  # what `top --store` loads on start (--history)
MAX_RING = 7200  # samples per device held for a long --history (2 h at 1 Hz; ~1.7 MB a device)
BACKFILL_S = 300.0  # the classifier replays at most this much of the loaded history: bounded start-up work


@dataclass
class HistoryLoad:
    """What `top` took from a live store on start: history traces, and the store it writes to (if any)."""

    path: Path
    traces: list[Trace]
    writer: Store | None = None

    def capacity(self, history_s: float, interval_s: float) -> int:
        """Ring size: the whole --history at the sampling rate, or all that was loaded (within MAX_RING)."""
        loaded = max((len(t) for t in self.traces), default=0)
        return int(min(MAX_RING, max(DEFAULT_HISTORY, math.ceil(history_s / interval_s), loaded)))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _problem(path: Path, exc: Exception) -> str:
    """An InputError names the file itself; SQLite's and the OS's errors do not."""
    return str(exc) if isinstance(exc, InputError) else f"{path}: {exc}"


def _short_uuid(uuid: str) -> str:
    return uuid if len(uuid) <= 16 else uuid[:15] + "…"


def recent_traces(
    store: Store,
    devices: Sequence[DeviceInfo],
    history_s: float,
    say: Callable[[str], None],
    now: float,
) -> tuple[list[Trace], bool]:
    """The watched `devices`' samples of the last `history_s` seconds (up to `now`) in `store`, and whether
    reading failed. A damaged store and devices in it that are not watched now each give one line through
    `say`; neither raises."""
    where = f"history: {store.path}"
    traces: list[Trace] = []
    failed = False
    try:
        if history_s > 0:
            traces = store.query(start=now - history_s, end=now)  # later stamps: a replay ran ahead
    except (InputError, sqlite3.Error) as exc:  # e.g. a damaged block, a malformed page
        say(f"history: {_problem(store.path, exc)}: nothing loaded")
        failed = True
    watched = {d.uuid for d in devices}
    others = sorted({t.device.uuid for t in traces} - watched)
    if others:
        names = ", ".join(_short_uuid(u) for u in others[:3]) + (f" and {len(others) - 3} more"
                                                                  if len(others) > 3 else "")
        say(f"{where}: {len(others)} device(s) in it are not watched now, left out: {names}")
    return [t for t in traces if t.device.uuid in watched], failed


def loaded_note(path: Path, traces: Sequence[Trace], now: float) -> str:
    """'history: PATH: N samples of K device(s) from the last M min' (traces not empty)."""
    n = sum(len(t) for t in traces)
    span = now - min(float(t.time[0]) for t in traces)
    return f"history: {path}: {n} samples of {len(traces)} device(s) from the last {span / 60:.1f} min"


def open_history(
    path: Path,
    devices: Sequence[DeviceInfo],
    history_s: float,
    write: bool,
    say: Callable[[str], None],
    now: float | None = None,
) -> HistoryLoad | None:
    """Open the live store at `path` for `top`: the last `history_s` seconds (up to `now`) of the watched
    `devices`, and, with `write`, the store to write new ticks to.

    Nothing here stops `top`: a missing file (created when writing, else skipped), a file that is not a
    store or is of a newer layout, devices in it that are not watched now, and a store another process
    writes now (`serve`/`record --store`: then `top` only reads it, so no device gets two writers) each
    give one line through `say`. None when nothing is usable.
    """
    from phasescope.store.live import Store

    now = time.time() if now is None else now
    where = f"history: {path}"
    exists = path.is_file()
    if not exists and not write:
        say(f"{where}: no such store, nothing loaded (phasescope serve/record --store PATH writes one)")
        return None
    try:
        reader = Store(path, read_only=True) if exists else None
    except InputError as exc:
        say(f"history: {exc}: going on without the store")
        return None
    traces: list[Trace] = []
    other = None
    failed = False
    if reader is not None:
        try:
            other = reader.active_writer() if write else None
            traces, failed = recent_traces(reader, devices, history_s, say, now)
        except (InputError, sqlite3.Error) as exc:  # active_writer on a malformed meta table
            say(f"history: {_problem(path, exc)}: nothing loaded")
            failed = True
        finally:
            reader.close()
    writer = None
    if write:
        if other is not None:
            say(f"{where}: process {other['pid']} is writing it now (serve or record --store?): "
                "top only reads it")
        else:
            try:
                writer = Store(path)
            except (InputError, OSError, sqlite3.Error) as exc:
                say(f"history: {_problem(path, exc)}: new samples are not stored")
    writing = "; new samples are written to it" if writer is not None else ""
    if traces:
        say(loaded_note(path, traces, now) + writing)
    elif not exists:
        if writer is not None:  # else the line above said why nothing is stored
            say(f"{where}: a new store, nothing to load yet{writing}")
    elif not failed and history_s > 0:
        say(f"{where}: nothing from the last {history_s / 60:g} min for the watched devices{writing}")
    if not traces and writer is None:
        return None
    return HistoryLoad(path, traces, writer)


def backfill_phases(state: LiveState, classifier: LiveClassifier) -> None:
    """Run the live classifier over the preloaded history on its own clock, as if it had come live, so the
    phase, its confidence and its start show before the first new sample.

    The last BACKFILL_S seconds only; in the newest window every `every_s` as live, before it every half
    window (each run judges a whole window, so the older phases and their start are still seen, to half a
    window, at a fraction of the runs).
    """
    spans = [t[np.isfinite(t)] for t in (state.history_times(u) for u in state.device_uuids())]
    spans = [t for t in spans if t.size]
    if not spans:
        return
    end = max(float(t[-1]) for t in spans)
    start = max(min(float(t[0]) for t in spans), end - BACKFILL_S)
    every = classifier.every_s
    stride = max(every, classifier.window_s / 2)
    recent = max(start, end - classifier.window_s)
    older = np.arange(start + stride, recent, stride)
    for now in [*older.tolist(), *np.arange(recent + every, end, every).tolist(), end]:
        classifier.update(state, now=now)
    for uuid in state.device_uuids():
        r = classifier.reading(uuid)
        if r is not None:
            state.set_phase(uuid, r.phase, r.confidence, r.since, r.held, r.training_alarm)
