"""`ledger` and `verify --source` sample a replay at its own recorded rate unless --interval says otherwise.

A 1 Hz recording replayed at speed=10 plays a sample every 0.1 s; sampling it every 1 s (the old default)
kept one sample in ten, so a training run read as too thin to judge.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasescope.cli import main

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
