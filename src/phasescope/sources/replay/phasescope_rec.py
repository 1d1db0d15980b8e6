"""Reader of phasescope's own recordings: a closed `<file>` or the `<file>.partial/` of a running or
crashed recorder (a torn IPC tail is read up to its last complete batch). The format lives in
`phasescope.store.recording`; this module is the reader interface the replay registry expects."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from phasescope.errors import InputError
from phasescope.schema import Trace
from phasescope.store.recording import read_recording
from phasescope.store.recording import sniff as _sniff

NAME = "phasescope"


def sniff(path: str | Path) -> bool:
    return _sniff(path)


def read(path: str | Path, options: Mapping[str, str] | None = None) -> list[Trace]:
    for key in options or {}:
        raise InputError(path, f"option {key!r}", "no options (format 'phasescope' takes none)")
    traces = read_recording(path)
    for tr in traces:  # as every reader: the run is the file's stem, and a recording is timed on Unix seconds
        tr.meta.setdefault("run", Path(path).stem)
        tr.meta.setdefault("clock", "unix")
    return traces
