"""The directory `phasescope run` puts first on the child's PYTHONPATH: its sitecustomize installs the hooks.

`child_env(events_dir)` is the whole injection contract, so other commands (`record --label-from-hooks`)
can run a program the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from phasescope.instrument.events import EVENTS_DIR_ENV, FLUSH_ENV

INJECT_DIR = Path(__file__).resolve().parent
# Where the child finds phasescope itself: sitecustomize.py appends it to the end of sys.path (it repeats
# the literal name: it runs before phasescope can be imported).
PKG_ROOT_ENV = "PHASESCOPE_PKG_ROOT"


def child_env(events_dir: str | Path, flush_s: float = 2.0,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process whose PyTorch hooks write events into `events_dir`."""
    env = dict(os.environ if base is None else base)
    # Only the inject dir goes on PYTHONPATH. The root phasescope is imported from goes to the end of the
    # child's sys.path (sitecustomize.py): on PYTHONPATH it would come before the child's own stdlib and
    # site-packages, and for an installed (not editable) phasescope that root is a whole site-packages,
    # whose numpy, torch, ... would shadow the program's own.
    parts = [str(INJECT_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env[PKG_ROOT_ENV] = str(INJECT_DIR.parents[2])
    env[EVENTS_DIR_ENV] = str(events_dir)
    env[FLUSH_ENV] = str(flush_s)
    return env
