"""The injected sitecustomize: hooks only once the program imports torch; the shadowed one still runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_phasescope_root_never_shadows_the_programs_own_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed (not editable), phasescope's root is a whole site-packages: on the child's PYTHONPATH it
    came before the child's stdlib and site-packages, so its numpy, torch, ... shadowed the program's."""
    import phasescope
    from phasescope.instrument import inject

    root = tmp_path / "site-packages"  # a phasescope install root that also holds a module named json
    root.mkdir()
    (root / "phasescope").symlink_to(Path(phasescope.__file__).parent, target_is_directory=True)
    (root / "json").mkdir()
    (root / "json" / "__init__.py").write_text("raise ImportError('shadowed by phasescope\\'s root')\n")
    monkeypatch.setattr(inject, "INJECT_DIR", root / "phasescope" / "instrument" / "inject")
    env = child_env(tmp_path / "events")
    code = ("import json, sys\nprint(json.__file__)\nprint(sys.path[-1])\n"
            "import torch\nfrom phasescope.instrument import current\nassert current() is not None\n")
    proc = _run(code, env)
    assert proc.returncode == 0, proc.stderr
    json_file, last = proc.stdout.split()
    assert not json_file.startswith(str(root)) and last == str(root)
