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


def child_env(events_dir: str | Path, flush_s: float = 2.0,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process whose PyTorch hooks write events into `events_dir`."""
    env = dict(os.environ if base is None else base)
    # The child must import this same phasescope: put its source root on the path too, after the inject dir.
    pkg_root = str(INJECT_DIR.parents[2])
    parts = [str(INJECT_DIR), pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env[EVENTS_DIR_ENV] = str(events_dir)
    env[FLUSH_ENV] = str(flush_s)
    return env
