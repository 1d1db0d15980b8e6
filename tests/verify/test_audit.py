"""Every tampering case on a real bundle is caught, with one line naming where."""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phasescope.verify.audit import audit_bundle, check_chain
from tests.verify._bundle import AUDIT_KEY, lines, records, resign, write_records
from tests.verify._data import model

KEY = AUDIT_KEY  # the shared bundle's key (tests/verify/conftest.py)


def first_problem(path: Path) -> str:
    report = audit_bundle(path, KEY.public_key(), model())
    assert not report.ok
    return report.problems[0].line(path)


def batch_lines(path: Path) -> list[int]:
    return [i for i, r in enumerate(records(path)) if r["kind"] == "batch"]


def test_intact_bundle_passes(bundle: Path) -> None:
    report = audit_bundle(bundle, KEY.public_key(), model())
    assert report.ok, [p.line(bundle) for p in report.problems]
    assert len(report.verdicts) == 4  # 2 devices x two 120 s windows
    assert {v["verdict"] for v in report.verdicts} == {"inconsistent", "consistent"}
    assert check_chain(bundle).roots >= 3


def test_edit_one_value(bundle: Path) -> None:
    recs = records(bundle)
    i = batch_lines(bundle)[1]
    recs[i]["body"]["signals"]["power"][5] += 1.0
    write_records(bundle, recs)
    msg = first_problem(bundle)
    assert f"line {i + 1} (seq {i}): batch record does not match its hash: it was edited" in msg


def test_edit_one_value_and_recompute_the_chain_without_the_key(bundle: Path) -> None:
    recs = records(bundle)
    recs[batch_lines(bundle)[1]]["body"]["signals"]["power"][5] += 1.0
    # Hashes, links and Merkle roots all recomputed; only the signatures cannot be made without the key.
    write_records(bundle, resign(recs, Ed25519PrivateKey.generate(), name_key=False))
    first_root = next(i for i, r in enumerate(records(bundle)) if r["kind"] == "root")
    msg = first_problem(bundle)
    assert f"line {first_root + 1} (seq {first_root}): signature does not verify" in msg


def resign_header_only(recs: list[dict]) -> list[dict]:
    """Re-hash the chain after a header edit, keeping the (now wrong) signatures."""
    from phasescope.verify.ledger import GENESIS, record_hash

    prev = GENESIS
    for r in recs:
        r["prev"] = prev
        r["hash"] = record_hash(r["seq"], prev, r["kind"], r["body"])
        prev = r["hash"]
    return recs


def test_delete_a_batch(bundle: Path) -> None:
    ls = lines(bundle)
    i = batch_lines(bundle)[2]
    bundle.write_bytes(b"".join(ls[:i] + ls[i + 1 :]))
    msg = first_problem(bundle)
    assert f"line {i + 1} (seq {i + 1}): seq {i + 1} where {i} was expected: 1 record(s) deleted" in msg


def test_reorder_two_batches(bundle: Path) -> None:
    ls = lines(bundle)
    a, b = batch_lines(bundle)[0:2]
    ls[a], ls[b] = ls[b], ls[a]
    bundle.write_bytes(b"".join(ls))
    msg = first_problem(bundle)
    assert f"line {a + 1} (seq {b}): seq {b} where {a} was expected" in msg
    problems = [p.line(bundle) for p in audit_bundle(bundle, KEY.public_key(), model()).problems]
    assert any("reordered" in p for p in problems)


def test_duplicate_a_batch(bundle: Path) -> None:
    ls = lines(bundle)
    i = batch_lines(bundle)[1]
    bundle.write_bytes(b"".join([*ls[: i + 1], ls[i], *ls[i + 1 :]]))
    assert f"line {i + 2} (seq {i}): seq {i} again after seq {i}: a record was duplicated" in first_problem(
        bundle
    )


def test_truncate_mid_record(bundle: Path) -> None:
    data = bundle.read_bytes()
    bundle.write_bytes(data[: len(data) - 100])
    n = len(lines(bundle))
    assert f"line {n}: ends without a line break: the file was truncated" in first_problem(bundle)


def test_truncate_at_a_record_boundary(bundle: Path) -> None:
    ls = lines(bundle)
    bundle.write_bytes(b"".join(ls[:-3]))  # drop the last verdicts and the closing root
    msg = first_problem(bundle)
    assert "not covered by a signed root: the ledger was truncated" in msg


def test_truncate_right_after_an_intermediate_root(bundle: Path) -> None:
    recs = records(bundle)
    last_open_root = max(i for i, r in enumerate(recs) if r["kind"] == "root" and not r["body"]["closed"])
    bundle.write_bytes(b"".join(lines(bundle)[: last_open_root + 1]))
    assert "does not end with its closing signed root" in first_problem(bundle)


def test_swap_in_another_key(bundle: Path) -> None:
    mallory = Ed25519PrivateKey.generate()
    recs = records(bundle)
    recs[batch_lines(bundle)[0]]["body"]["signals"]["gpu_util"][0] = 0.0
    write_records(bundle, resign(recs, mallory))  # a fully consistent bundle, signed by another key
    assert check_chain(bundle).problems == []
    assert "the pinned key is" in first_problem(bundle) and "the key was swapped" in first_problem(bundle)
    unpinned = audit_bundle(bundle, None, model())
    assert "is not pinned" in unpinned.problems[0].message


def test_header_names_another_key_than_the_one_that_signed(bundle: Path) -> None:
    recs = records(bundle)
    from phasescope.verify.keys import fingerprint, public_pem

    other = Ed25519PrivateKey.generate().public_key()
    recs[0]["body"]["public_key"] = public_pem(other)
    recs[0]["body"]["key_fingerprint"] = fingerprint(other)
    write_records(bundle, resign_header_only(recs))
    problems = check_chain(bundle).problems
    # The header is a leaf of the first root, so that root's Merkle root breaks; every root's signature
    # fails against the key the header now names.
    assert problems[0].where == "line 5 (seq 4)" and "Merkle root does not match" in problems[0].message
    roots = sum(r["kind"] == "root" for r in recs)
    assert (
        sum("signature does not verify with the header's public key" in p.message for p in problems) == roots
    )


def test_change_the_model_version_even_when_resigned_by_the_key_holder(bundle: Path) -> None:
    recs = records(bundle)
    recs[0]["body"]["model"]["version"] = "9.9.9"
    write_records(bundle, resign(recs, KEY))
    assert "made with model 9.9.9" in first_problem(bundle) and "cannot re-run it" in first_problem(bundle)


def test_verdict_rewritten_by_the_key_holder_is_caught_by_the_rerun(bundle: Path) -> None:
    recs = records(bundle)
    i = next(
        i
        for i, r in enumerate(recs)
        if r["kind"] == "verdict" and r["body"]["verdict"]["verdict"] == "inconsistent"
    )
    recs[i]["body"]["verdict"]["verdict"] = "consistent"
    write_records(bundle, resign(recs, KEY))
    msg = first_problem(bundle)
    assert f"line {i + 1}" in msg and "stated consistent" in msg and "gives inconsistent" in msg


def test_telemetry_reordered_and_resigned_is_caught(bundle: Path) -> None:
    recs = records(bundle)
    a, b = batch_lines(bundle)[0:2]  # two batches of the same device
    recs[a], recs[b] = recs[b], recs[a]
    write_records(bundle, resign(recs, KEY))
    assert "telemetry reordered or duplicated" in first_problem(bundle)


def test_a_ledger_without_verdicts_is_not_a_bundle(shared_data: Path, tmp_path: Path) -> None:
    from phasescope.verify.ledger import LedgerWriter
    from tests.verify._data import DUTY_SHAPING, labelled

    p = tmp_path / "ledger.jsonl"
    with LedgerWriter(p, KEY, model=model()) as w:
        w.append_trace(labelled(shared_data, DUTY_SHAPING))
    assert check_chain(p).problems == []
    assert "holds no verdict records" in first_problem(p)


def test_garbage_and_empty_files(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"")
    assert "is empty" in first_problem(p)
    p.write_text(json.dumps({"hello": 1}) + "\n")
    assert "malformed record" in first_problem(p)


def test_damaged_records_are_problems_not_crashes(tmp_path: Path) -> None:
    """Damage that still parses as JSON (a non-hex hash, a NaN literal, signals that are no object) fails
    the audit at its line instead of raising."""
    import numpy as np

    from phasescope.schema import DeviceInfo, Trace
    from phasescope.verify.ledger import LedgerWriter

    p = tmp_path / "ledger.jsonl"
    with LedgerWriter(p, KEY, model=model(), batch_rows=5) as w:
        w.append_trace(Trace(DeviceInfo("GPU-x"), np.arange(10.0), {"power": np.ones(10)}))
    good = lines(p)
    recs = records(p)
    recs[1]["hash"] = "z" * 64  # a flipped bit can leave a non-hex digit
    write_records(p, recs)
    assert "line 2 (seq 1): batch record does not match its hash" in first_problem(p)
    p.write_bytes(b"".join([good[0], good[1].replace(b'"power":[1.0', b'"power":[NaN'), *good[2:]]))
    assert "line 2 (seq 1): holds NaN (the ledger writes a missing value as null)" in first_problem(p)
    recs = [json.loads(x) for x in good]
    recs[1]["body"]["signals"] = [1.0, 2.0]
    recs[2]["body"]["meta"] = ["x"]
    write_records(p, recs)
    problems = [q.line(p) for q in audit_bundle(p, KEY.public_key(), model()).problems]
    assert "line 2 (seq 1): batch record is malformed" in " ".join(problems)
    assert "line 3 (seq 2): batch record is malformed" in " ".join(problems)


def test_a_header_naming_another_fingerprint_than_its_key(bundle: Path) -> None:
    """The key holder cannot state one fingerprint (which people and `verify --input` read) and sign with
    another key."""
    recs = records(bundle)
    recs[0]["body"]["key_fingerprint"] = "sha256:" + "0" * 32
    write_records(bundle, resign(recs, KEY, name_key=False))
    assert f"line 1 (seq 0): header names key fingerprint sha256:{'0' * 32}, but its public key's is" in (
        first_problem(bundle)
    )


def test_the_closing_roots_key_fingerprint_edited_without_the_key(bundle: Path) -> None:
    """A root's fingerprint is hashed but not signed, and nothing follows the closing root: rehashing it
    needs no key, so the audit checks the stated fingerprint against the header's key."""
    from phasescope.verify.keys import fingerprint
    from phasescope.verify.ledger import record_hash

    recs = records(bundle)
    last = recs[-1]
    last["body"]["key_fingerprint"] = fingerprint(Ed25519PrivateKey.generate().public_key())
    last["hash"] = record_hash(last["seq"], last["prev"], "root", last["body"])
    write_records(bundle, recs)
    n = len(recs)
    assert f"line {n} (seq {n - 1}): root names key sha256:" in first_problem(bundle)


def test_a_verdict_window_that_is_no_number_is_a_problem_not_a_crash(bundle: Path) -> None:
    recs = records(bundle)
    for r in recs:
        if r["kind"] == "verdict":
            r["body"]["window_s"] = "120"
    write_records(bundle, resign(recs, KEY))
    assert "verdict names an unknown claim or setting" in first_problem(bundle)


def test_a_line_nested_past_the_stack_is_one_problem(bundle: Path) -> None:
    ls = lines(bundle)
    bundle.write_bytes(b"".join([ls[0], b"[" * 200_000 + b"\n", *ls[1:]]))
    assert "line 2: is not a JSON record: the file was edited or damaged" in first_problem(bundle)
