"""Real components for the fleet tests: Debian's prometheus, phasescope agents replaying real traces.

Everything started here is a child process that `Procs.stop()` ends (SIGTERM, then SIGKILL), by pid.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from phasescope.schema import SIGNAL_NAMES, DeviceInfo, TickBatch, Trace
from phasescope.sources.replay import read
from phasescope.store.recording import RecordingWriter

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def need_tool(path: str) -> str:
    """The tool's path; skip when it is absent, unless CI demands the system tools."""
    found = shutil.which(path) or (path if Path(path).exists() else None)
    if found is None:
        if os.environ.get("PHASESCOPE_REQUIRE_SYSTEM_TOOLS"):
            pytest.fail(f"{path} is required (PHASESCOPE_REQUIRE_SYSTEM_TOOLS is set) but absent")
        pytest.skip(f"{path} not installed")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def labelled_trace(shared_data: Path, path: str, gpu_index: int) -> tuple[Trace, dict[str, str]]:
    """The labelled span of one labels.csv row, as a Trace."""
    with open(shared_data / "labels.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["path"] == path and int(r["gpu_index"]) == gpu_index)
    trace = next(t for t in read(shared_data / path) if t.device.index == gpu_index)
    if row["t_from"]:
        trace = trace.slice_time(float(row["t_from"]), float(row["t_to"]))
    return trace, row


def write_recording(trace: Trace, device: DeviceInfo, out: Path) -> Path:
    """`trace` as a phasescope recording under a new identity, in a tmp dir (shared data stays out)."""
    values = np.column_stack([trace[s] for s in SIGNAL_NAMES])
    with RecordingWriter(out, source_spec="test", interval_s=1.0, host=device.host) as w:
        for i in range(len(trace)):
            w.write(TickBatch(float(trace.time[i]), [device], values[i : i + 1]))
    return out


class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        fh = open(log, "wb")  # noqa: SIM115 - closed with the process in stop()
        p = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        p._log = fh  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
            p._log.close()  # type: ignore[attr-defined]


def agent_command(recording: Path, port: int) -> list[str]:
    """`phasescope serve` replaying `recording` at speed 1 in a loop (the agreed agent interface); until
    that command exists, a minimal stand-in exporter with the same metric names."""
    spec = f"replay:{recording}?speed=1&loop=1"
    if (REPO / "src/phasescope/cli/serve.py").exists():
        return [sys.executable, "-m", "phasescope", "serve", "--source", spec, "--port", str(port)]
    return [sys.executable, str(Path(__file__).with_name("stand_in_agent.py")), spec, str(port)]


def prometheus_config(targets: list[str], interval: str = "1s") -> str:
    quoted = ", ".join(f"'{t}'" for t in targets)
    return (
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        "  - job_name: phasescope\n"
        f"    static_configs:\n      - targets: [{quoted}]\n"
    )


def backfill(traces: list[Trace], tmp: Path, family: str,
             targets: dict[str, dict[str, str]] | None = None) -> Path:
    """`promtool tsdb create-blocks-from openmetrics` of the traces into tmp/tsdb (`targets`: host -> the
    scrape target's labels, as `fleet.openmetrics.write` applies them)."""
    from phasescope.fleet.openmetrics import write

    exe = need_tool(PROMTOOL)
    om = tmp / "backfill.om"
    write(traces, om, family, targets=targets)  # type: ignore[arg-type]
    tsdb = tmp / "tsdb"
    out = subprocess.run(
        [exe, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    om.unlink()
    return tsdb


def start_prometheus(procs: Procs, tmp: Path, config: str, port: int) -> str:
    exe = need_tool(PROMETHEUS)
    cfg = tmp / "prometheus.yml"
    cfg.write_text(config)
    procs.start(
        [
            exe,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=3650d",
            "--log.level=warn",
        ],
        tmp / "prometheus.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/-/ready", 30, tmp / "prometheus.log")
    return url


def wait_http(url: str, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise AssertionError(f"{url} not up after {timeout_s}s\n{tail}")
