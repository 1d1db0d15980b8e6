"""Malformed bundles that crashed `audit` (found by tests/test_fuzz_inputs.py): each is a problem named in
one line now, never an exception. Signed ones are re-signed with the bundle's key, so they pass the chain
and reach the checks behind it, as a bundle from a buggy or hostile signer would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from phasescope.verify.audit import audit_bundle
from tests.verify._bundle import AUDIT_KEY, lines, records, resign, write_records
from tests.verify._data import model


def _problems(bundle: Path) -> list[str]:
    report = audit_bundle(bundle, AUDIT_KEY.public_key(), model())
    assert not report.ok
    return [p.line(bundle) for p in report.problems]


def _resigned(bundle: Path, edit: Callable[[list[dict[str, Any]]], None]) -> Path:
    recs = records(bundle)
    edit(recs)
    write_records(bundle, resign(recs, AUDIT_KEY))
    return bundle


def _first(recs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(r for r in recs if r["kind"] == kind)


def test_a_number_beyond_any_float_is_refused_not_a_crash(bundle: Path) -> None:
    # json reads 1e999 as inf, which the canonical re-encoding then refused with a ValueError.
    ls = lines(bundle)
    ls[2] = ls[2].replace(b'"seq":2', b'"seq":2,"x":1e999', 1)
    bundle.write_bytes(b"".join(ls))
    assert any("line 3 (seq 2): holds 1e999 (a number beyond any float)" in p for p in _problems(bundle))


def test_an_integer_past_64_bits_is_refused(bundle: Path) -> None:
    # 5000 digits is past Python's int-from-string limit: naming the record's seq failed, or a 401-digit
    # sample reached the float conversion (OverflowError). No ledger integer needs more than 19 digits.
    for digits, line in ((5000, 3), (401, 4)):
        ls = lines(bundle)
        ls[line - 1] = ls[line - 1].replace(b'"seq":', b'"x":' + b"9" * digits + b',"seq":', 1)
        bundle.write_bytes(b"".join(ls))
        want = f"holds a {digits}-digit integer (the ledger writes at most 19): the record was edited"
        assert any(f"line {line}" in p and p.endswith(want) for p in _problems(bundle)), digits


def test_an_impossible_reading_in_a_signed_batch_is_refused(bundle: Path) -> None:
    # verify writes what the readers give, impossible values dropped; the model must never see 1e308 °C.
    _resigned(bundle, lambda r: _first(r, "batch")["body"]["signals"]["temperature"].__setitem__(7, 1e308))
    assert any("temperature 1e+308 is outside its physical range" in p for p in _problems(bundle))


def test_a_header_whose_model_is_not_an_object_is_another_model(bundle: Path) -> None:
    _resigned(bundle, lambda recs: _first(recs, "header")["body"].__setitem__("model", ["x"]))
    assert any("made with model None (None)" in p for p in _problems(bundle))


def test_a_verdict_record_without_a_verdict_object_is_named(bundle: Path) -> None:
    _resigned(bundle, lambda recs: _first(recs, "verdict")["body"].__setitem__("verdict", "x"))
    assert any("verdict record holds no verdict object" in p for p in _problems(bundle))


def test_check_settings_of_the_wrong_type_are_an_unknown_setting(bundle: Path) -> None:
    def edit(recs: list[dict[str, Any]]) -> None:
        for r in recs:
            if r["kind"] == "verdict":
                r["body"]["params"]["min_covered"] = "x"

    _resigned(bundle, edit)
    assert any("verdict names an unknown claim or setting" in p for p in _problems(bundle))
