"""`phasescope demo` shows each workload's phase KPIs live: the children run with the hooks injected."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"demo: started training pid (\d+), inference pid (\d+)")


def test_demo_rows_show_training_and_inference_kpis() -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PHASESCOPE_EVENTS_DIR", None)
    out = subprocess.run(
        [sys.executable, "-m", "phasescope", "demo", "--plain", "--source", "host", "--duration", "16",
         "--interval", "1"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=90,
    ).stdout
    match = STARTED.search(out)
    assert match, out[-3000:]
    lines = out.splitlines()
    training = [ln for ln in lines if f"└ {match.group(1)} " in ln]
    inference = [ln for ln in lines if f"└ {match.group(2)} " in ln]
    assert any("samp/s" in ln and "step " in ln for ln in training), out[-3000:]
    assert any("req/s" in ln and "p99 " in ln for ln in inference), out[-3000:]
    # A training forward whose backward had not been read yet once showed as an inference request.
    assert not any("req/s" in ln for ln in training), out[-3000:]
