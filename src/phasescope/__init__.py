"""phasescope: phase-aware observability for AI accelerators."""

from __future__ import annotations

from typing import Any

from phasescope.version import __version__

__all__ = ["__version__", "instrument", "measure"]


def instrument(**kwargs: Any) -> Any:
    """Install the in-process PyTorch hooks (see phasescope.instrument)."""
    from phasescope.instrument import install

    return install(**kwargs)


def measure(name: str = "window", **kwargs: Any) -> Any:
    """Time, energy and cost of a named window of code: `with phasescope.measure("epoch") as w: ...`, then
    `w.result` (see phasescope.monitor; `Monitor` there for begin_window/end_window)."""
    from phasescope.monitor import measure as _measure

    return _measure(name, **kwargs)
