"""A FIFO (or any non-regular file) given as input is refused in one line before it is opened.

`classify`, `report`, `cost`, `verify` and `audit` used to block forever on the first read of a named pipe
nobody writes to, and so did `--config`; `--model`, `--pubkey` and `verify --store` said "no such file"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from phasescope.errors import InputError
from phasescope.sources.replay import check_file, read


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "gpu.csv"
    os.mkfifo(path)
    return path


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A hang is the fault: the timeout turns it into a failure instead of a stuck suite.
    return subprocess.run([sys.executable, "-m", "phasescope", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(
    "args",
    [
        ["classify", "{fifo}"],
        ["report", "{fifo}", "-o", "out.html"],
        ["cost", "energy", "{fifo}"],
        ["verify", "--declare", "no-training", "--input", "{fifo}"],
        ["verify", "--declare", "no-training", "--since", "1h", "--store", "{fifo}"],
        ["audit", "{fifo}", "--trust-bundle-key"],
        ["audit", "{fifo}", "--chain-only", "--trust-bundle-key"],
        ["classify", "--model", "{fifo}", "{trace}"],
        ["cost", "energy", "--config", "{fifo}", "{trace}"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_each_command_refuses_a_fifo_in_one_line(
    args: list[str], fifo: Path, tmp_path: Path, shared_data: Path
) -> None:
    trace = shared_data / "sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv"
    proc = _run(tmp_path, *[a.format(fifo=fifo, trace=trace) for a in args])
    assert proc.returncode == 2, proc.stderr[-600:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert proc.stderr.strip() == (
        f"phasescope: {fifo}: file: expected a regular file (written out, not a pipe or device), "
        "got 'a FIFO (named pipe)'"
    )


def test_audit_refuses_a_fifo_as_pubkey(tmp_path: Path, fifo: Path) -> None:
    bundle = tmp_path / "bundle.jsonl"
    bundle.write_text("")
    proc = _run(tmp_path, "audit", str(bundle), "--pubkey", str(fifo))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-600:]
    assert "got 'a FIFO (named pipe)'" in proc.stderr


def test_every_reader_entry_refuses_non_regular_files(tmp_path: Path, fifo: Path) -> None:
    """The one check every reader goes through, for auto-detection and for each forced format."""
    with pytest.raises(InputError, match="FIFO"):
        read(fifo)
    for fmt in ("nvidia-smi-csv", "nvidia-smi-dmon", "dcgm-prom", "sensorguard", "alibaba", "spar",
                "phasescope"):
        with pytest.raises(InputError, match="FIFO"):
            read(fifo, fmt)
    with pytest.raises(InputError, match="character device"):
        check_file("/dev/null")
    link = tmp_path / "link.csv"
    link.symlink_to(fifo)  # a symlink to a pipe is a pipe
    with pytest.raises(InputError, match="FIFO"):
        check_file(link)
