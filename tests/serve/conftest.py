"""Helpers for the serve tests: system tools (promtool, chromium) and a real `phasescope serve` subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from phasescope.classify.model import PhaseModel
from phasescope.schema import TickBatch

PROMTOOL = "/usr/bin/promtool"
CHROMIUM = "/usr/bin/chromium"
# A real RTX 3090 run (sensorguard): GPU 4 idles ~50 s, then the training run migrates onto it (labels.csv).
MIGRATION_RUN = "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r01/nvml.csv"
SERVING = re.compile(r"serving (http://\S+/)")


def system_tool(path: str) -> str:
    """`path` if it exists; else skip, unless CI requires system tools (PHASESCOPE_REQUIRE_SYSTEM_TOOLS)."""
    if Path(path).exists():
        return path
    if os.environ.get("PHASESCOPE_REQUIRE_SYSTEM_TOOLS"):
        pytest.fail(f"{path} is required (PHASESCOPE_REQUIRE_SYSTEM_TOOLS is set) but missing")
    pytest.skip(f"{path} not installed")


def promtool_check(text: bytes) -> str:
    """What `promtool check metrics` prints about `text` (empty = clean); its exit status must agree."""
    tool = system_tool(PROMTOOL)
    done = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    out = (done.stdout + done.stderr).decode()
    assert (done.returncode == 0) == (out.strip() == ""), out
    return out


def feed(agent: object, batches: Iterator[TickBatch]) -> None:
    """Drive an Agent's tick handler directly (no thread, no clock), each batch as the sampler hands it."""
    for batch in batches:
        agent.on_tick(batch)  # type: ignore[attr-defined]


@contextmanager
def serve_process(args: list[str], tmp_path: Path, timeout: float = 60.0) -> Iterator[str]:
    """Run `phasescope serve --port 0 ARGS`; yields its base URL once it listens; stops it afterwards."""
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "phasescope", "serve", "--port", "0", *args],
            stdout=subprocess.DEVNULL, stderr=err,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            m = SERVING.search(log.read_text(errors="replace"))
            if m:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"serve did not start (rc {proc.poll()}): {log.read_text()}")
            time.sleep(0.05)
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


def samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> (labels, value) of every sample of a /metrics page."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out
