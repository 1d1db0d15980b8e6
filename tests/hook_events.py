"""Real hook events for view tests: run the instrument tests' PyTorch workloads with the hooks injected."""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from phasescope.instrument import events as ev
from phasescope.instrument.inject import child_env

SCRIPTS = Path(__file__).resolve().parent / "instrument" / "scripts"


def record_hook_events(events_dir: Path, cache_dir: Path) -> dict[str, int]:
    """Train an MLP for 40 steps, then serve 40 inference batches, each in its own hooked process.

    Returns role -> pid. The events land in `events_dir` as `phasescope run` would leave them.
    """
    env = child_env(events_dir, flush_s=0.2)
    env["XDG_CACHE_HOME"] = str(cache_dir)
    pids = {}
    for role, script, arg in (("training", "mlp_train.py", "40"), ("inference", "batch_infer.py", "40")):
        proc = subprocess.Popen([sys.executable, str(SCRIPTS / script), arg], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{script} failed ({proc.returncode}): {err[-2000:]}")
        pids[role] = proc.pid
    return pids


@functools.cache
def shared_hook_events() -> tuple[Path, dict[str, int]]:
    """One recording per test session (two PyTorch start-ups cost seconds): (events dir, role -> pid)."""
    root = Path(tempfile.mkdtemp(prefix="phasescope-hooks-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root / "events", record_hook_events(root / "events", root / "cache")


def as_version1(rows: np.ndarray) -> np.ndarray:
    """The same events as a version 1 log wrote them: seven columns, each forward a FWD_BEGIN row and a
    FWD_END row (begins in start order, ends in end order, among the other rows)."""
    out = []
    for r in rows.tolist():
        if r[0] == ev.FWD:
            out.append(([ev.FWD_BEGIN, r[1], r[2], r[3], 0, 0, 0], r[1]))
            out.append(([ev.FWD_END, r[7], r[2], r[3], r[4], r[5], r[6]], r[7]))
        else:
            out.append((r[:7], r[1]))
    out.sort(key=lambda x: x[1])
    return np.array([r for r, _ in out])
