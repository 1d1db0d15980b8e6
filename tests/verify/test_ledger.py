"""The ledger writer: chaining, signed roots, live ticks and continuing an existing ledger."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phasescope.errors import InputError
from phasescope.schema import SIGNAL_NAMES, TickBatch
from phasescope.verify.audit import _traces, check_chain
from phasescope.verify.ledger import LedgerWriter, merkle_root
from tests.verify._bundle import lines
from tests.verify._data import DUTY_SHAPING, labelled, model


def test_telemetry_round_trips_exactly(shared_data: Path, tmp_path: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    # A missing sample must come back missing (NaN), never as a silent 0.
    t = t.with_columns(power=np.where(np.arange(len(t)) == 7, np.nan, t["power"]))
    p = tmp_path / "l.jsonl"
    with LedgerWriter(p, Ed25519PrivateKey.generate(), model=model(), batch_rows=50, root_every=2) as w:
        w.append_trace(t)
    chain = check_chain(p)
    assert chain.problems == []
    kinds = [r["kind"] for r in chain.records]
    assert kinds.count("batch") == -(-len(t) // 50) and kinds[-1] == "root"
    assert chain.roots == kinds.count("root") >= 2
    (back,) = _traces(chain, []).values()
    assert np.array_equal(back.time, t.time)
    for s in t.present_signals():
        assert np.array_equal(back[s], t[s], equal_nan=True)
    assert back.meta["gpu_model"] == "RTX3090"
    assert np.isnan(back["power"][7])


def test_live_ticks_become_batches_and_a_ledger_can_be_continued(shared_data: Path, tmp_path: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    key = Ed25519PrivateKey.generate()
    p = tmp_path / "live.jsonl"

    def tick(i: int) -> TickBatch:
        vals = np.full((1, len(SIGNAL_NAMES)), np.nan)
        for j, s in enumerate(SIGNAL_NAMES):
            vals[0, j] = t[s][i]
        return TickBatch(float(t.time[i]), [t.device], vals)

    with LedgerWriter(p, key, batch_rows=30) as w:
        for i in range(100):
            w.on_tick(tick(i))
    with LedgerWriter(p, key, batch_rows=30) as w:  # a second session appends to the same chain
        for i in range(100, len(t)):
            w.on_tick(tick(i))
    chain = check_chain(p)
    assert chain.problems == []
    assert sum(r["kind"] == "header" for r in chain.records) == 1
    (back,) = _traces(chain, []).values()
    assert np.array_equal(back.time, t.time) and np.array_equal(back["power"], t["power"])
    with pytest.raises(InputError, match="key_fingerprint"):
        LedgerWriter(p, Ed25519PrivateKey.generate())  # someone else's key cannot continue it


def test_a_broken_ledger_cannot_be_continued(shared_data: Path, tmp_path: Path) -> None:
    p = tmp_path / "l.jsonl"
    key = Ed25519PrivateKey.generate()
    with LedgerWriter(p, key, batch_rows=60) as w:
        w.append_trace(labelled(shared_data, DUTY_SHAPING))
    ls = lines(p)
    p.write_bytes(b"".join(ls[:1] + ls[2:]))
    with pytest.raises(InputError, match="record\\(s\\) deleted"):
        LedgerWriter(p, key)


def test_merkle_root_follows_rfc6962() -> None:
    import hashlib

    a, b, c = (hashlib.sha256(x).digest() for x in (b"a", b"b", b"c"))

    def leaf(x: bytes) -> bytes:
        return hashlib.sha256(b"\x00" + x).digest()

    def node(x: bytes, y: bytes) -> bytes:
        return hashlib.sha256(b"\x01" + x + y).digest()

    assert merkle_root([a]) == leaf(a)
    assert merkle_root([a, b, c]) == node(node(leaf(a), leaf(b)), leaf(c))


def test_a_new_ledger_never_follows_a_dangling_link(tmp_path: Path) -> None:
    """A link to nothing planted at the bundle's name used to be followed: the bundle was written wherever
    it pointed. It is refused, for a bundle (create_only) and for a ledger alike."""
    key = Ed25519PrivateKey.generate()
    link, target = tmp_path / "bundle.jsonl", tmp_path / "elsewhere" / "planted.jsonl"
    target.parent.mkdir()
    link.symlink_to(target)
    for create_only in (True, False):
        with pytest.raises(InputError, match=r"bundle\.jsonl: file: expected a new file, not a symbolic"):
            LedgerWriter(link, key, create_only=create_only)
    assert not target.exists()


def test_a_bundle_is_never_written_over_a_file(shared_data: Path, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    p = tmp_path / "b.jsonl"
    with LedgerWriter(p, key, create_only=True) as w:
        w.append_trace(labelled(shared_data, DUTY_SHAPING))
    before = p.read_bytes()
    with pytest.raises(InputError, match="bundles are never overwritten"):
        LedgerWriter(p, key, create_only=True)  # the same key: a ledger would be continued, a bundle not
    assert p.read_bytes() == before
