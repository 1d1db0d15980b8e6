"""This host as the live views need it beside the source's samples: its RAM, for a process's %MEM.

The one place in the live layer that asks psutil; the state itself only holds what it is given.
"""

from __future__ import annotations

import psutil


def host_ram_bytes() -> float:
    """This host's physical RAM in bytes (what `top`'s %MEM divides a process's RSS by)."""
    return float(psutil.virtual_memory().total)
