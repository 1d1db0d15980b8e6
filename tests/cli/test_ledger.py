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
