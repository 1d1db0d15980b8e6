"""The injected sitecustomize: hooks only once the program imports torch; the shadowed one still runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from phasescope.instrument import events as ev
from phasescope.instrument.inject import child_env


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_torch_is_not_imported_on_the_programs_behalf(tmp_path: Path) -> None:
    env = child_env(tmp_path / "events")
    proc = _run("import sys; print('torch' in sys.modules)", env)
    assert proc.stdout.strip() == "False", proc.stderr
    assert not (tmp_path / "events").exists()


def test_hooks_installed_when_program_imports_torch(tmp_path: Path) -> None:
    env = child_env(tmp_path / "events", flush_s=0)
    code = ("import torch\nfrom phasescope.instrument import current\nassert current() is not None\n"
            "with torch.no_grad():\n    torch.nn.Linear(2, 2)(torch.ones(1, 2))\n")
    proc = _run(code, env)
    assert proc.returncode == 0, proc.stderr
    (pe,) = ev.load_events(tmp_path / "events")
    assert (pe.rows[:, 0] == ev.FWD).sum() == 1


def test_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    env = child_env(tmp_path / "events")
    env["PYTHONPATH"] += ":" + str(own)
    proc = _run("import os; print(os.environ.get('OWN_SITECUSTOMIZE'))", env)
    assert proc.stdout.strip() == "ran", proc.stderr
