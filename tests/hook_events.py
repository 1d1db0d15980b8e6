"""Real hook events for view tests: run the instrument tests' PyTorch workloads with the hooks injected."""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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
