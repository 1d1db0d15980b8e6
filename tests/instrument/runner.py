"""Runs the workload scripts under `phasescope run` in a subprocess and reads back its JSON summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def run_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(cache_dir)  # one CPU-peak measurement per session, outside the user's home
    env.pop("PHASESCOPE_EVENTS_DIR", None)
    return env


Result = tuple[subprocess.CompletedProcess[str], dict[str, Any]]


def phasescope_run(tmp_path: Path, env: dict[str, str], script: str, *args: str, source: str = "none",
                   extra: tuple[str, ...] = (), timeout: float = 60) -> Result:
    out = tmp_path / f"{Path(script).stem}.json"
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", source, "--json", str(out),
           "--report", str(tmp_path / "report.html"), *extra,
           "--", sys.executable, str(SCRIPTS / script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return proc, doc
