"""`phasescope ledger`: record a live (replayed) source into a signed ledger, then audit and verify it."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope.cli import main
from tests.verify._data import DUTY_SHAPING


def test_record_audit_and_verify_a_ledger(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))
    led = tmp_path / "ledger.jsonl"
    src = f"replay:{shared_data / DUTY_SHAPING[0]}?speed=40"
    assert (
        main(
            [
                "ledger",
                "-o",
                str(led),
                "--source",
                src,
                "--duration",
                "1.2",
                "--interval",
                "0.1",
                "--batch",
                "5",
                "--root-every",
                "3",
            ]
        )
        == 0
    )
    assert "ticks" in capsys.readouterr().out
    pub = str(tmp_path / "home" / "keys" / "default.pub")
    assert main(["audit", str(led), "--chain-only", "--pubkey", pub]) == 0
    capsys.readouterr()
    assert main(["audit", str(led), "--pubkey", pub]) == 1  # telemetry only: not a verify bundle
    assert "holds no verdict records" in capsys.readouterr().err
    bundle = tmp_path / "bundle.jsonl"
    code = main(["verify", "--declare", "idle", "--input", str(led), "--bundle", str(bundle), "--json"])
    assert code in (0, 1, 3)
    assert main(["audit", str(bundle), "--pubkey", pub]) == 0
    # A damaged ledger is refused as input, with the place named.
    led.write_bytes(led.read_bytes()[:-10])
    assert main(["verify", "--declare", "idle", "--input", str(led)]) == 2
    assert "ends without a line break" in capsys.readouterr().err


def test_a_replay_that_ends_ends_the_ledger(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like `record`, the ledger stops when a replay (without loop) has played to its end, instead of
    signing empty batches until --duration or Ctrl-C."""
    import json

    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))
    led = tmp_path / "ledger.jsonl"
    spar = "spar-a100/bert_sst2_amp_NVIDIA_A100_SXM4_40GB_90abf7ca_20260309_182528.parquet"  # 27 s, 1 Hz
    src = f"replay:{shared_data / spar}?speed=100"
    args = ["ledger", "-o", str(led), "--source", src, "--duration", "4", "--interval", "0.1", "--batch", "2"]
    assert main(args) == 0
    ticks = int(capsys.readouterr().out.split(": ")[2].split()[0])
    assert 2 <= ticks < 20  # about 0.3 s of replay at 10 ticks/s, not the 40 ticks of --duration
    batches = [r for r in map(json.loads, led.read_text().splitlines()) if r["kind"] == "batch"]
    assert batches and all(r["body"]["signals"] for r in batches)
