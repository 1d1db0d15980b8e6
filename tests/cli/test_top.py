"""`phasescope top --once / --plain` end to end through the real CLI, sources and sampler."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from phasescope.cli import main
from phasescope.display import MISSING
from tests.live_helpers import TRAINING_RUN

GEMM_ON_GPU1 = "sensorguard-rtx3090/20260825_hpc_gemm_verifier-gpu1_s3_r03/nvml.csv"


def _device_lines(out: str, n_devices: int) -> list[str]:
    return [ln for ln in out.splitlines() if re.search(r"│ #\d ", ln)][-n_devices:]


def test_once_on_a_replayed_training_run(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--interval", "0.1", "--source", spec]) == 0
    out = capsys.readouterr().out
    lines = _device_lines(out, 2)
    assert len(lines) == 2 and lines[0].startswith("│ #0 ") and lines[1].startswith("│ #1 ")
    for line in lines:
        assert f"/ {MISSING}" in line  # no memory total / power limit in this log
        assert re.search(r"│ \d+%\s+│", line)  # utilisation is present
    assert "replay · 2 device(s) · tick 2" in out


def test_plain_ends_when_a_replay_ends(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"replay:{shared_data / GEMM_ON_GPU1}?speed=300"  # 338 recorded seconds in about 1.1 s
    t0 = time.monotonic()
    assert main(["top", "--plain", "--interval", "0.1", "--sort", "util", "--source", spec]) == 0
    assert time.monotonic() - t0 < 20
    out = capsys.readouterr().out
    assert "replay finished" in out
    tables = out.count("Device / process")
    assert tables >= 5  # one table per tick
    busy = [ln for ln in out.splitlines() if "│ #1 " in ln]
    assert any(re.search(r"│ 9\d%|│ 100%", ln) for ln in busy)  # the GEMM really shows up


def test_plain_on_the_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--plain", "--source", "host", "--interval", "0.2", "--duration", "0.7"]) == 0
    out = capsys.readouterr().out
    assert out.count("Device / process") >= 2 and "logical cores" in out
    assert "host · 1 device(s)" in out


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("bogus", "--source: spec: expected auto, nvml, host or replay"),
        ("replay:/nonexistent/run.csv", "/nonexistent/run.csv"),
        ("replay:x.csv?speed=-1", "speed"),
    ],
)
def test_bad_source_is_one_line(spec: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--once", "--source", spec]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]


def test_once_on_gpus_through_nvml(fake_nvml, shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.live_helpers import training_traces

    fake_nvml(training_traces(shared_data), mem_total_bytes=24 * 2**30)
    assert main(["top", "--once", "--interval", "0.1", "--source", "nvml"]) == 0
    out = capsys.readouterr().out
    lines = _device_lines(out, 2)
    assert len(lines) == 2 and all("/ 24.0 GiB" in ln for ln in lines)
    assert "nvml+host · 2 device(s)" in out


def test_auto_without_nvml_falls_back_to_the_host(fake_nvml, shared_data: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import pynvml

    from tests.live_helpers import training_traces

    fake_nvml(training_traces(shared_data), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert main(["top", "--once", "--interval", "0.1"]) == 0
    captured = capsys.readouterr()
    assert "host · 1 device(s)" in captured.out
    notice = [ln for ln in captured.err.splitlines() if "NVML" in ln]
    assert len(notice) == 1 and "--source host" in notice[0]
