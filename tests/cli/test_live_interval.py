"""`ledger`, `verify --source` and `run --source` sample a replay at its own recorded rate unless --interval
says otherwise.

A 1 Hz recording replayed at speed=10 plays a sample every 0.1 s; sampling it every 1 s (the old default)
kept one sample in ten, so a training run read as too thin to judge.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from phasescope.cli import cli, main
from phasescope.cli.run import command as run_command

SPAR = "spar-a100/bert_sst2_amp_NVIDIA_A100_SXM4_40GB_90abf7ca_20260309_182528.parquet"  # 27 s, 1 Hz


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_ledger_replay_keeps_every_sample_by_default(shared_data: Path, tmp_path: Path) -> None:
    led = tmp_path / "ledger.jsonl"
    src = f"replay:{shared_data / SPAR}?speed=10"
    assert main(["ledger", "-o", str(led), "--source", src, "--duration", "10", "--batch", "5"]) == 0
    batches = [r for r in map(json.loads, led.read_text().splitlines()) if r["kind"] == "batch"]
    samples = sum(len(r["body"]["t"]) for r in batches)
    assert samples >= 20  # of the file's 27; every 1 s of wall time would give about 3


def test_verify_source_replay_keeps_every_sample_by_default(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = f"replay:{shared_data / SPAR}?speed=10"
    main(["verify", "--declare", "no-training", "--json", "--source", src, "--duration", "10"])
    verdicts = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"device"')]
    assert len(verdicts) == 1
    assert verdicts[0]["coverage"]["samples"] >= 20
    assert verdicts[0]["coverage"]["rate_hz"] == pytest.approx(1.0, rel=0.2)  # the recording's own rate


def test_run_watches_a_replay_at_its_own_rate_by_default(shared_data: Path, tmp_path: Path) -> None:
    """`run` sampled every 1 s of wall time: a 2 s command beside a 1 Hz file at speed=10 saw ~2 of its
    ~20 samples."""
    out = tmp_path / "run.json"
    src = f"replay:{shared_data / SPAR}?speed=10"
    result = CliRunner().invoke(run_command, ["--source", src, "--report", "-", "--json", str(out), "--quiet",
                                              "--", sys.executable, "-c", "import time; time.sleep(2)"])
    assert result.exit_code == 0, result.output
    telemetry = json.loads(out.read_text())["telemetry"]
    assert telemetry["interval_s"] == pytest.approx(0.1, rel=0.01)  # the file's 1 s at speed 10
    assert telemetry["devices"][0]["samples"] >= 12


def test_top_watches_a_replay_at_its_own_rate_by_default(shared_data: Path) -> None:
    """README's own `top --source replay:...?speed=10` sampled every 1 s: 2.5 s reached tick 3 of ~25."""
    src = f"replay:{shared_data / SPAR}?speed=10"
    result = CliRunner().invoke(cli, ["top", "--source", src, "--plain", "--no-classify",
                                               "--duration", "2.5"])
    assert result.exit_code == 0, result.output
    ticks = [int(t) for t in re.findall(r"tick (\d+)", result.output)]
    assert ticks and max(ticks) >= 12


def test_ctrl_c_ends_a_plain_top_as_q_ends_the_full_screen(shared_data: Path) -> None:
    """Ctrl-C on `top --plain` used to end in "phasescope: aborted", exit 130; now a last table, exit 0."""
    src = f"replay:{shared_data / SPAR}?loop=1"
    proc = subprocess.Popen([sys.executable, "-m", "phasescope", "top", "--source", src, "--plain",
                             "--no-classify"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while "tick" not in proc.stdout.readline():  # a first table: the sampler and the view run
            assert time.monotonic() < deadline and proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "aborted" not in err and "Traceback" not in err, err
    assert "Traceback" not in out
