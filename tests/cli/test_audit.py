"""`phasescope audit`: exit codes and one-line reasons (tampering cases: tests/verify/test_audit.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phasescope.cli import main
from phasescope.verify.keys import public_pem
from tests.verify._bundle import lines, make_bundle

KEY = Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def pristine(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("audit")
    (d / "signer.pub").write_text(public_pem(KEY.public_key()))
    return make_bundle(shared_data, d / "bundle.jsonl", KEY)


def test_ok_and_json(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pub = str(pristine.with_name("signer.pub"))
    assert main(["audit", str(pristine), "--pubkey", pub]) == 0
    assert capsys.readouterr().out.strip().endswith(f"audit OK: {pristine}")
    assert main(["audit", str(pristine), "--pubkey", pub, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["verdicts"] == {"consistent": 2, "inconsistent": 2, "unverifiable": 0}


def test_fails_closed_with_one_line(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "b.jsonl"
    ls = lines(pristine)
    bad.write_bytes(b"".join(ls[:2] + ls[3:]))  # delete the second batch
    code = main(["audit", str(bad), "--pubkey", str(pristine.with_name("signer.pub"))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith(f"phasescope: audit FAILED: {bad}: line 3 (seq 3): seq 3 where 2 was expected")


def test_unpinned_key_is_doubt(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(pristine)]) == 1
    assert "is not pinned" in capsys.readouterr().err
    assert main(["audit", str(pristine), "--trust-bundle-key"]) == 0


def test_missing_bundle_and_bad_pubkey(
    tmp_path: Path, pristine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", str(tmp_path / "none.jsonl"), "--trust-bundle-key"]) == 1
    assert "cannot be read" in capsys.readouterr().err
    (tmp_path / "x.pub").write_text("nope")
    assert main(["audit", str(pristine), "--pubkey", str(tmp_path / "x.pub")]) == 2
    assert "public key: expected an Ed25519 public key (PEM)" in capsys.readouterr().err


def test_a_file_that_is_no_ledger_is_one_line(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A telemetry log passed by mistake used to print a problem per line of it (ten, then "... and 4000
    more"); it is one line saying what was expected."""
    log = shared_data / "nvidia-smi-h100-training/ckpt1.csv"
    assert main(["audit", str(log), "--chain-only", "--trust-bundle-key"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"phasescope: audit FAILED: {log}: line 1: is not a JSON record: expected a phasescope "
                   "ledger (JSON Lines)"]
