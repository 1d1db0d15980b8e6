"""The audit checks a bundle's bytes as written, not their parsed meaning (issue 21, item 8).

Each edit below leaves every parsed record, hash and signature as it was, so an audit of the parsed form
passed them; but the file is no longer the one that was signed, and another JSON reader may read it
differently (a first-wins reader takes the duplicate key).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from phasescope.verify.audit import audit_bundle, check_chain
from tests.verify._bundle import AUDIT_KEY, lines, records
from tests.verify._data import model


def _edit(bundle: Path, kind: str, old: bytes, new: bytes, pick: int = 0) -> int:
    """Rewrite the `pick`-th record of `kind` whose line holds `old`; its 1-based line number."""
    ls = lines(bundle)
    hits = [i for i, r in enumerate(records(bundle)) if r["kind"] == kind and re.search(old, ls[i])]
    i = hits[pick]
    ls[i] = re.sub(old, new, ls[i], count=1)
    bundle.write_bytes(b"".join(ls))
    return i + 1


def _problems(bundle: Path) -> list[str]:
    report = audit_bundle(bundle, AUDIT_KEY.public_key(), model())
    assert not report.ok
    return [p.line(bundle) for p in report.problems]


def test_a_duplicate_key_before_the_real_one_is_refused(bundle: Path) -> None:
    # A first-wins reader now reads this inconsistent window as consistent; json.loads reads the last.
    dup = rb'"verdict":"consistent","verdict":"inconsistent"'
    n = _edit(bundle, "verdict", rb'"verdict":"inconsistent"', dup)
    first_wins = json.loads(lines(bundle)[n - 1], object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    assert first_wins["body"]["verdict"]["verdict"] == "consistent"
    (first, *_) = _problems(bundle)
    assert f"line {n} (seq {n - 1}): " in first
    assert "key 'verdict' appears twice in one object: the record was edited" in first


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (rb"\}\n$", b', "note" : "checked"}\n'),  # an extra field, with spaces the writer never writes
        (rb"\}\n$", b',"note":"checked"}\n'),  # the same field written canonically
        (rb'"kind":"batch"', b'"kind": "batch"'),  # spacing alone
    ],
    ids=["extra-field-spaced", "extra-field", "spacing"],
)
def test_an_extra_field_or_other_spacing_is_refused(bundle: Path, old: bytes, new: bytes) -> None:
    n = _edit(bundle, "batch", old, new, pick=1)
    (first, *_) = _problems(bundle)
    assert f"line {n} (seq {n - 1}): batch record is not written as the ledger writes it" in first


def test_a_number_spelled_another_way_is_refused(bundle: Path) -> None:
    n = _edit(bundle, "batch", rb"(?<=[\[,])0\.0(?=[,\]])", b"0.00e0")
    (first, *_) = _problems(bundle)
    assert f"line {n} (seq {n - 1}): batch record is not written as the ledger writes it" in first


def test_the_intact_bundle_is_canonical_and_chain_only_sees_the_edits_too(bundle: Path) -> None:
    assert check_chain(bundle).problems == []
    _edit(bundle, "batch", rb"(?<=[\[,])0\.0(?=[,\]])", b"0.00e0")
    assert "not written as the ledger writes it" in check_chain(bundle).problems[0].message
