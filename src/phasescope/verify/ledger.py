"""The ledger: an append-only, hash-chained, signed log of telemetry batches and verdicts (JSON Lines).

Every line is one record `{"seq", "prev", "kind", "body", "hash"}`:
- `hash` = SHA-256 of the canonical JSON of `{"seq", "prev", "kind", "body"}` (keys sorted, no spaces,
  no NaN: missing values are null); `prev` is the previous record's hash (64 zeros for the first), so an
  edited, deleted, duplicated or reordered record breaks the chain at a named line. A line is exactly the
  canonical JSON of its record (`canonical`), so the hash covers the bytes as written: the audit refuses
  a line that parses to the same record but is spelled otherwise (`parse_record`, `hashed_part`).
- `kind` is `header` (first record: format, ledger id, public key, model version and digest),
  `batch` (telemetry of one device: time and signal columns in schema base units), `verdict` (one
  `check.WindowVerdict` with the claim and settings that produced it) or `root`.
- A `root` record closes a stretch of records: the Merkle root (RFC 6962 hashing) of their hashes,
  signed with Ed25519 together with the ledger id, the stretch and the previous hash. The last record of a
  finished ledger is a root with `closed: true` and the count of records before it, so truncation shows.

A bundle is a closed ledger that holds verdicts. Nothing is pickled; the format is in docs/VERIFY.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phasescope.classify.decide import finite_or_none
from phasescope.errors import InputError
from phasescope.identity import host_name
from phasescope.schema import SIGNAL_NAMES, TickBatch, Trace
from phasescope.store.recording import device_to_json
from phasescope.verify.keys import fingerprint, public_pem

FORMAT = "phasescope-ledger"
FORMAT_VERSION = 1
GENESIS = "0" * 64
KINDS = ("header", "batch", "verdict", "root")
SIGN_DOMAIN = b"phasescope-ledger-root-v1\n"
DEFAULT_ROOT_EVERY = 64  # records per signed root
DEFAULT_BATCH_ROWS = 60  # samples per device per batch record (one minute at 1 Hz)


def canonical(obj: Any) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False
    ).encode()


def record_hash(seq: int, prev: str, kind: str, body: Any) -> str:
    return hashlib.sha256(canonical({"seq": seq, "prev": prev, "kind": kind, "body": body})).hexdigest()


RECORD_FIELDS = ("body", "hash", "kind", "prev", "seq")  # every field of a record line, no other


class DuplicateKey(ValueError):
    """A JSON object names one key twice: readers disagree on which value counts (json keeps the last)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} (the ledger writes a missing value as null)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as inf, which no writer of JSON can have meant
        raise ValueError(f"{text} (a number beyond any float)")
    return value


def _int64(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > 19:  # the ledger's integers (seq, counts, sizes) fit 64 bits; longer ones only slow us
        raise ValueError(f"a {digits}-digit integer (the ledger writes at most 19)")
    return int(text)


def parse_record(line: bytes) -> Any:
    """One record line, parsed strictly: a duplicate key raises DuplicateKey; NaN, Infinity, a number
    too big for a float or an integer past 64 bits, ValueError."""
    return json.loads(
        line,
        object_pairs_hook=_unique_keys,
        parse_constant=_no_constant,
        parse_float=_finite,
        parse_int=_int64,
    )


def hashed_part(line: bytes, h: str) -> bytes:
    """What a record's hash covers, cut from the line as written: the canonical line less its
    `"hash":"…",` field (keys are sorted, so it follows the body: the last occurrence is the record's own;
    a quote inside a JSON string is escaped, so the field cannot be faked inside one)."""
    field = b'"hash":"' + h.encode("ascii", errors="replace") + b'",'
    i = line.rfind(b"," + field)
    return line if i < 0 else line[: i + 1] + line[i + 1 + len(field) :]


def require_new(path: str | Path, option: str = "file") -> None:
    """Refuse a path where anything exists, a symbolic link to nothing included: a bundle is never written
    over a file, nor wherever a link planted at its name points."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise InputError(
            p, option, "a new file, not a symbolic link", f"a dangling symbolic link to {os.readlink(p)}"
        )
    if os.path.lexists(p):
        raise InputError(p, option, "a new file (bundles are never overwritten)", "exists")


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """RFC 6962 Merkle tree hash: leaves prefixed 0x00, nodes 0x01, split at the largest power of 2 < n."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + merkle_root(leaves[:k]) + merkle_root(leaves[k:])).digest()


def root_message(ledger_id: str, body: dict[str, Any], prev: str) -> bytes:
    """What a root's signature covers: the ledger, the stretch, its Merkle root and the chain position."""
    fields = {k: body[k] for k in ("from", "to", "merkle", "closed", "count")}
    return SIGN_DOMAIN + canonical({"ledger": ledger_id, "prev": prev, **fields})


def model_digest(model: Any) -> str:
    """SHA-256 of a PhaseModel's canonical JSON document: the exact model, not just its version string."""
    return "sha256:" + hashlib.sha256(canonical(model.to_dict())).hexdigest()


def _col(values: np.ndarray) -> list[float | None]:
    return [finite_or_none(v) for v in np.asarray(values, dtype=np.float64).tolist()]


def trace_body(trace: Trace, lo: int = 0, hi: int | None = None) -> dict[str, Any]:
    """A batch record body for rows [lo, hi) of one device trace."""
    hi = len(trace) if hi is None else hi
    meta = {k: str(trace.meta[k]) for k in ("gpu_model",) if k in trace.meta}
    return {
        "device": device_to_json(trace.device),
        "meta": meta,
        "t": _col(trace.time[lo:hi]),
        "signals": {
            s: _col(v[lo:hi]) for s, v in sorted(trace.columns.items()) if np.isfinite(v[lo:hi]).any()
        },
    }


class LedgerWriter:
    """Appends records to a ledger file, signing a Merkle root every `root_every` records and on close."""

    def __init__(
        self,
        path: str | Path,
        key: Ed25519PrivateKey,
        *,
        model: Any = None,
        meta: dict[str, Any] | None = None,
        root_every: int = DEFAULT_ROOT_EVERY,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        create_only: bool = False,
    ) -> None:
        """`create_only`: write a new file (a bundle), never continue one; otherwise an existing ledger
        is continued. A name that is a symbolic link to nothing is refused either way."""
        self.path = Path(path)
        self.key = key
        self.root_every = max(1, root_every)
        self.batch_rows = max(1, batch_rows)
        self._pending: list[bytes] = []  # hashes since the last root
        self._from = 0
        self._ticks: dict[str, list[tuple[float, np.ndarray]]] = {}
        self._devices: dict[str, Any] = {}
        if create_only:
            require_new(self.path)
        elif self.path.exists() and self.path.stat().st_size > 0:
            self._resume()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL for a new file: it fails on a link (dangling or not) and on a file made since the check.
        exclusive = os.O_EXCL if create_only or not self.path.exists() else 0
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | exclusive, 0o666)
        except FileExistsError:
            require_new(self.path)
            raise
        self._f: IO[bytes] = os.fdopen(fd, "ab")  # closed in close()
        self.seq = 0
        self.prev = GENESIS
        self.ledger_id = uuid.uuid4().hex
        pub = key.public_key()
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "ledger_id": self.ledger_id,
            "created": time.time(),
            "host": host_name(),
            "public_key": public_pem(pub),
            "key_fingerprint": fingerprint(pub),
            "model": None if model is None else {"version": model.version, "digest": model_digest(model)},
            "meta": dict(meta or {}),
        }
        self._append("header", header)

    def _resume(self) -> None:
        """Continue an existing ledger: its chain must check out and it must be ours (same key)."""
        from phasescope.verify.audit import check_chain  # audit imports this module

        chain = check_chain(self.path)
        if chain.problems:
            raise InputError(
                self.path, chain.problems[0].where, "an intact ledger to append to", chain.problems[0].message
            )
        if chain.header.get("key_fingerprint") != fingerprint(self.key.public_key()):
            raise InputError(
                self.path,
                "header.key_fingerprint",
                "the key this writer signs with",
                chain.header.get("key_fingerprint"),
            )
        last = chain.records[-1]
        self.ledger_id = str(chain.header["ledger_id"])
        self.seq = int(last["seq"]) + 1
        self.prev = str(last["hash"])
        self._from = self.seq
        self._f = open(self.path, "ab")  # noqa: SIM115

    # -- appending ---------------------------------------------------------------------------
    def _append(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        h = record_hash(self.seq, self.prev, kind, body)
        rec = {"seq": self.seq, "prev": self.prev, "kind": kind, "body": body, "hash": h}
        self._f.write(canonical(rec) + b"\n")
        self._f.flush()
        self.seq += 1
        self.prev = h
        if kind != "root":
            self._pending.append(bytes.fromhex(h))
            if len(self._pending) >= self.root_every:
                self.sign_root()
        return rec

    def append_trace(self, trace: Trace) -> None:
        """One device's telemetry, in batch records of at most `batch_rows` samples."""
        for lo in range(0, len(trace), self.batch_rows):
            self._append("batch", trace_body(trace, lo, min(lo + self.batch_rows, len(trace))))

    def on_tick(self, batch: TickBatch) -> None:
        """Buffer one live tick; a device's rows become a batch record every `batch_rows` ticks."""
        for i, d in enumerate(batch.devices):
            self._devices[d.uuid] = d
            rows = self._ticks.setdefault(d.uuid, [])
            rows.append((batch.time, np.array(batch.values[i], dtype=np.float64)))
            if len(rows) >= self.batch_rows:
                self._flush_device(d.uuid)

    def _flush_device(self, uid: str) -> None:
        rows = self._ticks.pop(uid, [])
        if not rows:
            return
        vals = np.vstack([r[1] for r in rows])
        cols = {s: vals[:, j] for j, s in enumerate(SIGNAL_NAMES)}
        self.append_trace(Trace(self._devices[uid], np.array([r[0] for r in rows]), cols))

    def flush_ticks(self) -> None:
        for uid in list(self._ticks):
            self._flush_device(uid)

    def append_verdict(
        self, verdict: dict[str, Any], claim: str, window_s: float | None, params: dict[str, Any]
    ) -> None:
        self._append("verdict", {"claim": claim, "window_s": window_s, "params": params, "verdict": verdict})

    def sign_root(self, closed: bool = False) -> None:
        if not self._pending and not closed:
            return
        body: dict[str, Any] = {
            "from": self._from,
            "to": self.seq - 1,
            "merkle": merkle_root(self._pending).hex(),
            "closed": closed,
            "count": self.seq,
            "key_fingerprint": fingerprint(self.key.public_key()),
        }
        body["signature"] = self.key.sign(root_message(self.ledger_id, body, self.prev)).hex()
        self._pending = []
        self._append("root", body)
        self._from = self.seq
        self._f.flush()
        os.fsync(self._f.fileno())  # a signed root is a commitment: make it durable

    def close(self) -> None:
        """Flush buffered ticks and end with a closing signed root. Appending later reopens the ledger."""
        if self._f.closed:
            return
        self.flush_ticks()
        self.sign_root(closed=True)
        self._f.close()

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
