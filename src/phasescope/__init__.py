"""phasescope: phase-aware observability for AI accelerators."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def instrument(**kwargs: Any) -> Any:
    """Install the in-process PyTorch hooks (see phasescope.instrument)."""
    from phasescope.instrument import install

    return install(**kwargs)
