"""`phasescope demo` for real: two PyTorch child processes, watched by the host source, and none left over."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from phasescope.cli import main

REPO = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"demo: started training pid (\d+), inference pid (\d+)")


def _start_demo(duration: float) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="260")
    return subprocess.Popen(
        [sys.executable, "-m", "phasescope", "demo", "--plain", "--source", "host",
         "--duration", str(duration), "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )


def _child_pids(demo: subprocess.Popen[str]) -> tuple[int, int]:
    assert demo.stdout is not None
    line = demo.stdout.readline()
    match = STARTED.search(line)
    assert match, f"no start line, got {line!r}"
    return int(match.group(1)), int(match.group(2))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: tuple[int, ...], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_demo_runs_two_real_workloads_and_leaves_none(tmp_path: Path) -> None:
    demo = _start_demo(duration=8)
    try:
        train, infer = _child_pids(demo)
        for pid, kind in ((train, "train"), (infer, "infer")):
            proc = psutil.Process(pid)
            assert proc.ppid() == demo.pid
            assert proc.cmdline()[1:4] == ["-m", "phasescope.demo.workloads", kind]
            assert os.getpgid(pid) == pid  # its own process group: a terminal's Ctrl-C goes to the demo only
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, err
    # The host source saw both as torch processes, labelled with their role, with real CPU readings.
    rows = {pid: [ln for ln in out.splitlines() if f"└ {pid} " in ln] for pid in (train, infer)}
    assert rows[train] and rows[infer], out[-3000:]
    assert "demo training" in rows[train][-1] and "torch" in rows[train][-1]
    assert "demo inference" in rows[infer][-1]
    cpu = re.search(r"cpu (\d+)%", rows[train][-1])
    assert cpu and int(cpu.group(1)) > 20, rows[train][-1]  # an endless training loop keeps a core busy
    assert f"demo: stopped {train}, {infer}" in out
    assert _wait_gone((train, infer), 0.5) == []


def test_sigterm_to_the_demo_stops_its_children() -> None:
    demo = _start_demo(duration=60)
    try:
        pids = _child_pids(demo)
        time.sleep(1.0)
        demo.send_signal(signal.SIGTERM)
        demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode != 0  # it was ended, not finished
    assert _wait_gone(pids, 1.0) == []


def test_children_exit_on_their_own_when_the_demo_is_killed() -> None:
    """kill -9 skips every finally and atexit: the workloads notice their parent is gone."""
    demo = _start_demo(duration=60)
    pids: tuple[int, ...] = ()
    try:
        pids = _child_pids(demo)
        demo.kill()
        demo.communicate(timeout=10)
        left = _wait_gone(pids, 20.0)  # they check after each step/request (torch may still be importing)
    finally:
        for pid in pids:  # never leave a stray workload behind, even if the assertion below fails
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
    assert left == []


def test_demo_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["demo", "--plain", "--duration", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install torch==2.13.0" in err[0]
