"""`phasescope audit`: exit codes and one-line reasons (tampering cases: tests/verify/test_audit.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phasescope.cli import main
from phasescope.verify.audit import utc
from phasescope.verify.keys import fingerprint, public_pem
from tests.verify._bundle import lines, make_bundle
from tests.verify._data import DUTY_SHAPING

KEY = Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def pristine(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("audit")
    (d / "signer.pub").write_text(public_pem(KEY.public_key()))
    return make_bundle(shared_data, d / "bundle.jsonl", KEY)


def test_ok_says_what_it_rests_on_and_json(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OK used to say only "OK": it names the signer's key, the claim, the span and each device's
    verdict, so an auditor can see how old a genuine bundle is (issue 21, item 9)."""
    pub = str(pristine.with_name("signer.pub"))
    assert main(["audit", str(pristine), "--pubkey", pub]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"audit OK: {pristine}"
    assert out[1] == f"  signed by: key {fingerprint(KEY.public_key())}, pinned with --pubkey"
    assert out[2].startswith("  written:   20") and out[2].endswith("Z (the signer's clock)")
    assert out[3] == "  claim:     no-training, 120 s windows"
    assert out[4] == "  span:      t=91406.623 .. t=92642.896 (1236 s) (the log's own clock, not dated)"
    devices = " | ".join(x for x in out if x.startswith("  device "))
    assert devices.count("device GPU-") == 2
    assert ": inconsistent (2 inconsistent window(s)); 172 samples, t=91406.623 .. " in devices
    assert ": consistent (2 consistent window(s)); 183 samples, t=92460.896 .. " in devices
    assert main(["audit", str(pristine), "--pubkey", pub, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["verdicts"] == {"consistent": 2, "inconsistent": 2, "unverifiable": 0}
    assert doc["key_fingerprint"] == fingerprint(KEY.public_key()) and doc["key_pinned"] is True
    assert doc["claims"] == ["no-training, 120 s windows"] and doc["created"] > 1.7e9
    verdicts = sorted(v["verdict"] for d in doc["devices"] for v in d["verdicts"])
    assert verdicts == ["consistent", "inconsistent"]


def test_not_before_on_an_older_genuine_bundle(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pub = tmp_path / "signer.pub"
    pub.write_text(public_pem(KEY.public_key()))
    ended = time.time() - 30 * 86400  # a genuine bundle of a month ago
    old = make_bundle(shared_data, tmp_path / "old.jsonl", KEY, dated_to=ended)
    assert main(["audit", str(old), "--pubkey", str(pub)]) == 0
    out = capsys.readouterr().out
    assert f" .. {utc(ended)} (" in out  # the OK shows how old it is
    assert main(["audit", str(old), "--pubkey", str(pub), "--not-before", "7d"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"phasescope: audit FAILED: {old}: device GPU-")
    assert "before --not-before" in err[-1] and "the bundle is older than required (+1 more)" in err[-1]
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ended - 86400))
    assert main(["audit", str(old), "--pubkey", str(pub), "--not-before", since]) == 0
    assert f"fresh:     every device's telemetry reaches --not-before {since}" in capsys.readouterr().out
    assert main(["audit", str(old), "--pubkey", str(pub), "--not-before", "last week"]) == 2
    assert "--not-before: time: expected Unix seconds, ISO 8601" in capsys.readouterr().err


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
    # A missing bundle is bad input (exit 2), refused before any read (check_file, issue 21 item 3).
    assert main(["audit", str(tmp_path / "none.jsonl"), "--trust-bundle-key"]) == 2
    assert "none.jsonl: file: expected an existing file" in capsys.readouterr().err
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


def test_verify_bundle_never_follows_a_dangling_link(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify --bundle` used to write through a link to nothing planted at the bundle's name (issue 21,
    item 10): one line, nothing written, before any work."""
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))
    link, target = tmp_path / "evidence.jsonl", tmp_path / "planted.jsonl"
    link.symlink_to(target)
    log = str(shared_data / DUTY_SHAPING[0])
    assert main(["verify", "--declare", "no-training", "--input", log, "--bundle", str(link)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(
        f"phasescope: {link}: --bundle: expected a new file, not a symbolic link, got 'a dangling symbolic"
    )
    assert not target.exists()
