"""Build a real bundle, and rewrite one the way an attacker would (helpers for the tamper tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phasescope.schema import Trace
from phasescope.verify.check import CheckParams, check_trace
from phasescope.verify.claims import parse_claim
from phasescope.verify.keys import fingerprint, public_pem
from phasescope.verify.ledger import GENESIS, LedgerWriter, canonical, merkle_root, record_hash, root_message
from tests.verify._data import DUTY_SHAPING, INFERENCE_CONTROL, labelled, model

# The key the audit tests' shared bundle is signed with (tests/verify/conftest.py).
AUDIT_KEY = Ed25519PrivateKey.generate()


def make_bundle(
    shared: Path, out: Path, key: Ed25519PrivateKey, claim: str = "no-training", dated_to: float | None = None
) -> Path:
    """Two real devices (disguised training, inference control), 60-sample batches, a root every 4 records.

    The logs' clock is seconds since their host booted; `dated_to` moves both onto the wall clock (Unix
    seconds), keeping their gap, so that their last sample is at that time."""
    c = parse_claim(claim)
    traces = [labelled(shared, DUTY_SHAPING), labelled(shared, INFERENCE_CONTROL)]
    if dated_to is not None:
        shift = dated_to - max(float(t.time[-1]) for t in traces)
        traces = [Trace(t.device, t.time + shift, t.columns, t.meta) for t in traces]
    with LedgerWriter(out, key, model=model(), root_every=4, batch_rows=60) as w:
        for t in traces:
            w.append_trace(t)
        for t in traces:
            for v in check_trace(t, c, model(), 120.0):
                w.append_verdict(v.to_dict(), c.text, 120.0, CheckParams().to_dict())
    return out


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in lines(path)]


def write_records(path: Path, recs: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(canonical(r) + b"\n" for r in recs))


def resign(recs: list[dict[str, Any]], key: Ed25519PrivateKey, name_key: bool = True) -> list[dict[str, Any]]:
    """Recompute every hash, link and root, signing with `key` (and naming it in the header, unless not)."""
    out: list[dict[str, Any]] = []
    prev, frm = GENESIS, 0
    pending: list[bytes] = []
    for seq, r in enumerate(recs):
        body = dict(r["body"])
        if r["kind"] == "header" and name_key:
            body["public_key"] = public_pem(key.public_key())
            body["key_fingerprint"] = fingerprint(key.public_key())
        if r["kind"] == "header":
            ledger_id = body["ledger_id"]
        if r["kind"] == "root":
            body.update(
                {
                    "from": frm,
                    "to": seq - 1,
                    "count": seq,
                    "merkle": merkle_root(pending).hex(),
                    "key_fingerprint": fingerprint(key.public_key()),
                }
            )
            body.pop("signature", None)
            body["signature"] = key.sign(root_message(ledger_id, body, prev)).hex()
        h = record_hash(seq, prev, r["kind"], body)
        out.append({"seq": seq, "prev": prev, "kind": r["kind"], "body": body, "hash": h})
        if r["kind"] == "root":
            pending, frm = [], seq + 1
        else:
            pending.append(bytes.fromhex(h))
        prev = h
    return out
