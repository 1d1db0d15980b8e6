"""Start the demo workloads as child processes and make sure none outlives the demo.

Four layers, because any one can be skipped: `stop()` in the caller's finally, an atexit hook, each child
in its own process group (so a signal to the group reaches anything it spawned, and Ctrl-C in the terminal
goes to us, not to them), and the children's own check that their parent is still alive (covers kill -9).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from phasescope.errors import PhasescopeError

TERMINATE_TIMEOUT_S = 5.0


class DemoError(PhasescopeError):
    """The demo cannot start its workloads."""


@dataclass
class Child:
    role: str  # "training" or "inference"
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class DemoChildren:
    """The running workloads. Use as a context manager, or call `stop()` yourself."""

    children: list[Child] = field(default_factory=list)
    log_dir: Path | None = None
    events_dir: Path | None = None  # where the children's hook events go (None: no hooks)
    _logs: list[IO[bytes]] = field(default_factory=list)

    @staticmethod
    def require_torch() -> None:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise DemoError(
                "the demo workloads need PyTorch: install it with `pip install torch==2.13.0` "
                "(CPU build) or `pip install 'phasescope[torch]'`"
            )

    def start(
        self, device: str = "cpu", rate: float = 20.0, batch: int = 64, hooks: bool = True
    ) -> DemoChildren:
        """Start both workloads; with `hooks`, PyTorch hooks write their events to `events_dir` (as under
        `phasescope run`), so the live view shows step time, samples/s, MFU, requests/s and latency."""
        self.require_torch()
        self.log_dir = Path(tempfile.mkdtemp(prefix="phasescope-demo-"))
        env = None
        if hooks:
            from phasescope.instrument.inject import child_env

            self.events_dir = self.log_dir / "events"
            env = child_env(self.events_dir, flush_s=1.0)
        atexit.register(self.stop)
        try:
            for role, kind, extra in (
                ("training", "train", ["--batch", str(batch)]),
                ("inference", "infer", ["--rate", str(rate)]),
            ):
                log_path = self.log_dir / f"{kind}.log"
                log = open(log_path, "wb")  # noqa: SIM115 (kept open for the child's lifetime)
                self._logs.append(log)
                cmd = [sys.executable, "-m", "phasescope.demo.workloads", kind,
                       "--parent", str(os.getpid()), "--device", device, "--nice", "10", *extra]
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,  # own process group: killpg reaches all of it, and only it
                    env=env,
                )
                self.children.append(Child(role, proc, log_path))
        except BaseException:
            self.stop()
            raise
        return self

    def pids(self) -> dict[int, str]:
        return {c.pid: c.role for c in self.children}

    def failed(self) -> list[str]:
        """One line per child that has exited on its own, with the tail of its log."""
        out = []
        for c in self.children:
            rc = c.proc.poll()
            if rc is not None:
                tail = c.log.read_text(errors="replace").strip().splitlines()[-1:] if c.log.exists() else []
                out.append(f"demo {c.role} (pid {c.pid}) exited with {rc}" + (f": {tail[0]}" if tail else ""))
        return out

    def stop(self, timeout: float = TERMINATE_TIMEOUT_S) -> None:
        """SIGTERM each process group, wait up to `timeout`, then SIGKILL what is left. Safe to call twice."""
        live = [c for c in self.children if c.proc.poll() is None]
        for c in live:
            _signal_group(c.proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for c in live:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(c.proc, signal.SIGKILL)
                c.proc.wait()
        for log in self._logs:
            log.close()
        self._logs.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> DemoChildren:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
