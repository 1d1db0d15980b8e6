"""In-process PyTorch hooks: exact phase (training / inference) and the KPIs each phase is judged by.

`install()` is what `phasescope.instrument()` and `phasescope run` call. Importing this package does not
import torch; `install()` does.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phasescope.instrument.events import EVENTS_DIR_ENV, FLUSH_ENV

if TYPE_CHECKING:
    from phasescope.instrument.hooks import Recorder

_recorder: Recorder | None = None


def install(events_dir: str | Path | None = None, flush_s: float | None = None, flop_sample_step: int = 1,
            count_flops: bool = True) -> Recorder:
    """Install the global hooks once per process and return the Recorder (a second call returns the same one).

    events_dir: where to write event chunks (default: $PHASESCOPE_EVENTS_DIR; none = keep in memory only).
    flush_s: how often a background thread writes new events (default $PHASESCOPE_FLUSH_S or 2 s).
    flop_sample_step: the optimizer step whose FLOPs and memory are measured (0-based; at least 1, so the
        optimizer state exists by then).
    """
    global _recorder
    if _recorder is not None:
        return _recorder
    from phasescope.instrument.hooks import Recorder

    if events_dir is None:
        events_dir = os.environ.get(EVENTS_DIR_ENV) or None
    if flush_s is None:
        flush_s = float(os.environ.get(FLUSH_ENV, "2") or 2)
    rec = Recorder(events_dir, flush_s=flush_s, flop_sample_step=flop_sample_step, count_flops=count_flops)
    rec.install()
    _recorder = rec
    return rec


def uninstall() -> Recorder | None:
    """Remove the hooks, write what is left, and return the Recorder (None if none was installed)."""
    global _recorder
    rec, _recorder = _recorder, None
    if rec is not None:
        rec.uninstall()
    return rec


def current() -> Recorder | None:
    return _recorder


def summary(**kwargs: Any) -> dict[str, Any]:
    """The run summary (segments, counts, KPIs, warnings) of the hooks installed in this process."""
    from phasescope.kpi.run_summary import summarize

    if _recorder is None:
        raise RuntimeError("phasescope hooks are not installed: call phasescope.instrument() first")
    return summarize([_recorder.process_events()], **kwargs)


__all__ = ["current", "install", "summary", "uninstall"]


class _CallableModule(types.ModuleType):
    """Importing this subpackage rebinds `phasescope.instrument` from the function in phasescope/__init__.py
    to
    this module; making the module callable keeps `phasescope.instrument()` working after that."""

    def __call__(self, **kwargs: Any) -> Recorder:
        return install(**kwargs)


sys.modules[__name__].__class__ = _CallableModule
