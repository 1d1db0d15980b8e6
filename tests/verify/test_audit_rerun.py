"""Tampering that only one audit check can see: each test isolates one check (chain link, model digest,
verdict numbers, verdict count, verdict coverage), so a regression in that check alone fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phasescope.classify.model import PhaseModel
from phasescope.verify.audit import audit_bundle, check_chain
from phasescope.verify.ledger import record_hash
from tests.verify._bundle import AUDIT_KEY, records, resign, write_records
from tests.verify._data import model

KEY = AUDIT_KEY  # the shared bundle's key (tests/verify/conftest.py)


def problems(path: Path, m: PhaseModel | None = None) -> list[str]:
    report = audit_bundle(path, KEY.public_key(), m or model())
    assert not report.ok
    return [p.line(path) for p in report.problems]


def test_record_that_links_elsewhere_is_named(bundle: Path) -> None:
    # A record with its own hash intact but a `prev` that is not the record before it (as when a record of
    # another ledger with the same seq is swapped in).
    recs = records(bundle)
    i = next(i for i, r in enumerate(recs) if r["kind"] == "batch")
    r = recs[i]
    r["prev"] = "f" * 64
    r["hash"] = record_hash(r["seq"], r["prev"], r["kind"], r["body"])
    write_records(bundle, recs)
    found = [p.message for p in check_chain(bundle).problems if p.where == f"line {i + 1} (seq {i})"]
    assert found and "does not link to the record before it" in found[0]


def test_intermediate_root_relabelled_as_closing_is_caught(bundle: Path) -> None:
    # Truncate right after an intermediate root and mark it closed (its record hash recomputed; no key
    # needed for that): the signature covers `closed` and `count`, so it no longer verifies.
    recs = records(bundle)
    i = max(i for i, r in enumerate(recs) if r["kind"] == "root" and not r["body"]["closed"])
    root = recs[i]
    root["body"]["closed"] = True
    root["hash"] = record_hash(root["seq"], root["prev"], root["kind"], root["body"])
    write_records(bundle, recs[: i + 1])
    found = [p.line(bundle) for p in check_chain(bundle).problems]
    assert found and f"line {i + 1} (seq {i}): signature does not verify" in found[0]


def test_model_with_the_same_version_but_other_content_is_refused(bundle: Path) -> None:
    doc = model().to_dict()
    doc["card"] = {**(doc["card"] or {}), "note": "edited"}
    other = PhaseModel.from_dict(doc)
    assert other.version == model().version
    assert any("cannot re-run it" in p for p in problems(bundle, other))


def test_verdict_number_rewritten_by_the_key_holder_is_caught(bundle: Path) -> None:
    # The verdict label stays; only a figure it rests on changes. The re-run must compare numbers too.
    recs = records(bundle)
    i = next(i for i, r in enumerate(recs) if r["kind"] == "verdict")
    seconds = recs[i]["body"]["verdict"]["phase_seconds"]
    label = max(seconds, key=lambda k: seconds[k])
    seconds[label] = seconds[label] * 0.5
    write_records(bundle, resign(recs, KEY))
    found = problems(bundle)
    assert f"line {i + 1}" in found[0] and f"phase_seconds.{label}" in found[0]


def test_verdict_deleted_by_the_key_holder_is_caught(bundle: Path) -> None:
    recs = records(bundle)
    i = next(i for i, r in enumerate(recs) if r["kind"] == "verdict")
    write_records(bundle, resign(recs[:i] + recs[i + 1 :], KEY))
    assert any("verdicts stated, re-running gives" in p for p in problems(bundle))


def test_device_whose_verdicts_were_all_removed_is_caught(bundle: Path) -> None:
    recs = records(bundle)
    verdicts = [r for r in recs if r["kind"] == "verdict"]
    gone = verdicts[0]["body"]["verdict"]["device"]
    kept = [r for r in recs if not (r["kind"] == "verdict" and r["body"]["verdict"]["device"] == gone)]
    write_records(bundle, resign(kept, KEY))
    assert any(f"device {gone}: has telemetry but no" in p for p in problems(bundle))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.__setitem__(slice(3, 5), [t[4], t[3]]), "sample times do not increase within the batch"),
        (lambda t: t.__setitem__(3, None), "batch columns do not fit the time column"),
    ],
)
def test_sample_times_edited_inside_a_batch_by_the_key_holder(bundle: Path, edit: Any, message: str) -> None:
    # Two samples' times swapped (the re-run sorts by time, so only this check sees it), or a time erased.
    recs = records(bundle)
    i = next(i for i, r in enumerate(recs) if r["kind"] == "batch")
    edit(recs[i]["body"]["t"])
    write_records(bundle, resign(recs, KEY))
    assert any(f"line {i + 1} (seq {i})" in p and message in p for p in problems(bundle))
