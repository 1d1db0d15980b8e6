"""Offline audit of a ledger or bundle. Fails closed: any doubt is a problem, and a problem fails the audit.

Two layers:
- `check_chain`: every line is a record written exactly as the writer writes it (canonical JSON, no
  duplicate key, no other field), every hash matches the bytes it covers, seq counts up by one and `prev`
  links to the record before, every root's Merkle root and Ed25519 signature check out, every record is
  covered by a root, and the ledger ends with its closing root (else it was truncated). The bytes are
  what is checked: two files that parse alike but differ are two files, and another JSON reader may
  read the edited one otherwise.
- `audit_bundle`: the chain, plus: the signing key is the one the auditor pinned; the model that made the
  verdicts is the one at hand (version and digest); each device's telemetry runs forward in time; and
  re-running the check on the bundle's own telemetry gives the verdicts the bundle states.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from phasescope.errors import PhasescopeError
from phasescope.schema import RANGES, SIGNALS, Trace, impossible
from phasescope.store.recording import device_from_json
from phasescope.verify.keys import fingerprint, parse_public
from phasescope.verify.ledger import (
    FORMAT,
    GENESIS,
    KINDS,
    RECORD_FIELDS,
    DuplicateKey,
    canonical,
    hashed_part,
    merkle_root,
    model_digest,
    parse_record,
    root_message,
)


@dataclass(frozen=True)
class Problem:
    where: str  # "line 7 (seq 6)", "header", "device GPU-..."
    message: str

    def line(self, path: str | Path) -> str:
        return f"{path}: {self.where}: {self.message}"


@dataclass
class Chain:
    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)  # each with "_line"
    header: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    key: Ed25519PublicKey | None = None
    roots: int = 0


class AuditFailed(PhasescopeError):
    """The audit found a problem (the first one is the message; the rest were printed before)."""

    exit_code = 1


def _where(line: int, rec: dict[str, Any] | None = None) -> str:
    seq = rec.get("seq") if isinstance(rec, dict) else None
    return f"line {line}" + (f" (seq {seq})" if isinstance(seq, int) else "")


def _read_lines(path: Path, chain: Chain) -> list[tuple[int, bytes, Any]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        chain.problems.append(Problem("file", f"cannot be read ({exc.strerror})"))
        return []
    if not data:
        chain.problems.append(Problem("file", "is empty: expected a phasescope ledger"))
        return []
    out: list[tuple[int, bytes, Any]] = []
    lines = data.split(b"\n")
    ends_clean = lines[-1] == b""
    if ends_clean:
        lines = lines[:-1]
    for i, raw in enumerate(lines, start=1):
        if i == len(lines) and not ends_clean:
            chain.problems.append(Problem(f"line {i}", "ends without a line break: the file was truncated"))
            break
        try:
            out.append((i, raw, parse_record(raw)))
        except DuplicateKey as exc:  # json.loads reads it (the last value wins): name its seq from that
            chain.problems.append(
                Problem(
                    _where(i, _loose(raw)),
                    f"key {exc.key!r} appears twice in one object: the record was edited",
                )
            )
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # nested past Python's stack
            if i == 1:  # not a ledger at all (a CSV, a recording): one line, not one per line of it
                chain.problems.append(
                    Problem("line 1", "is not a JSON record: expected a phasescope ledger (JSON Lines)")
                )
                return []
            chain.problems.append(
                Problem(f"line {i}", "is not a JSON record: the file was edited or damaged")
            )
        except ValueError as exc:  # NaN or Infinity, which json.loads reads
            chain.problems.append(Problem(_where(i, _loose(raw)), f"holds {exc}: the record was edited"))
    return out


def _loose(raw: bytes) -> Any:
    """The record as plain json.loads reads it, to name its seq; None where even that fails (an integer
    past Python's 4300 digits)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def check_chain(path: str | Path) -> Chain:
    """Integrity of the ledger file itself (see module doc). Problems are collected, not raised."""
    p = Path(path)
    chain = Chain(p)
    expect_seq, prev = 0, GENESIS
    hashes: list[bytes] = []  # by position, for Merkle roots
    seq_pos: dict[int, int] = {}
    last_root_to = -1
    for line, raw, rec in _read_lines(p, chain):
        w = _where(line, rec)
        if not (
            isinstance(rec, dict)
            and isinstance(rec.get("seq"), int)
            and not isinstance(rec.get("seq"), bool)
            and isinstance(rec.get("prev"), str)
            and rec.get("kind") in KINDS
            and isinstance(rec.get("body"), dict)
            and isinstance(rec.get("hash"), str)
        ):
            chain.problems.append(Problem(w, "malformed record: expected seq, prev, kind, body and hash"))
            continue
        seq, kind = rec["seq"], rec["kind"]
        if tuple(sorted(rec)) != RECORD_FIELDS or raw != canonical(rec):
            chain.problems.append(
                Problem(
                    w,
                    f"{kind} record is not written as the ledger writes it (canonical JSON: sorted keys, "
                    "no spaces, shortest numbers, no other field): it was edited",
                )
            )
        elif hashlib.sha256(hashed_part(raw, rec["hash"])).hexdigest() != rec["hash"]:
            chain.problems.append(Problem(w, f"{kind} record does not match its hash: it was edited"))
        elif seq > expect_seq:
            chain.problems.append(
                Problem(w, f"seq {seq} where {expect_seq} was expected: {seq - expect_seq} record(s) deleted")
            )
        elif seq < expect_seq:
            chain.problems.append(
                Problem(
                    w,
                    f"seq {seq} again after seq {expect_seq - 1}: "
                    "a record was duplicated or moved (reordered)",
                )
            )
        elif rec["prev"] != prev:
            chain.problems.append(
                Problem(
                    w, "does not link to the record before it: records were reordered, replaced or deleted"
                )
            )
        rec = dict(rec, _line=line)
        chain.records.append(rec)
        seq_pos[seq] = len(hashes)
        hashes.append(_hash_bytes(rec["hash"]))
        expect_seq, prev = seq + 1, rec["hash"]
        if len(chain.records) == 1:
            _check_header(chain, rec, w)
        elif kind == "header":
            chain.problems.append(Problem(w, "a second header: ledgers were spliced together"))
        if kind == "root" and chain.key is not None:
            _check_root(chain, rec, w, hashes, seq_pos, last_root_to)
            last_root_to = seq  # the next stretch starts after this root
    if not chain.records:
        if not chain.problems:
            chain.problems.append(Problem("file", "holds no records"))
        return chain
    last = chain.records[-1]
    uncovered = [r for r in chain.records if r["seq"] > last_root_to and r["kind"] != "root"]
    if uncovered:
        chain.problems.append(
            Problem(
                f"lines {uncovered[0]['_line']}-{uncovered[-1]['_line']}",
                "not covered by a signed root: the ledger was truncated or is still being written",
            )
        )
    elif not (last["kind"] == "root" and last["body"].get("closed") is True):
        chain.problems.append(
            Problem(
                _where(last["_line"], last),
                "the ledger does not end with its closing signed root: it was truncated",
            )
        )
    return chain


def _hash_bytes(text: str) -> bytes:
    """A record hash as a Merkle leaf; b"" for one that is not 64 hex digits (already a problem)."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return b""
    return raw if len(raw) == 32 else b""


def _check_header(chain: Chain, rec: dict[str, Any], w: str) -> None:
    body = rec["body"]
    if rec["kind"] != "header" or rec["seq"] != 0:
        chain.problems.append(Problem(w, "the first record is not the header (seq 0): the start was removed"))
        return
    if body.get("format") != FORMAT:
        chain.problems.append(Problem(w, f"header format is {body.get('format')!r}, expected {FORMAT!r}"))
        return
    chain.header = body
    try:
        chain.key = parse_public(str(body.get("public_key", "")), "header.public_key")
    except PhasescopeError as exc:
        chain.problems.append(Problem(w, f"header public key unreadable ({exc})"))
        return
    # A stated fingerprint is read by people and tools (verify --input names it): it must be the key's.
    if body.get("key_fingerprint") != fingerprint(chain.key):
        chain.problems.append(
            Problem(
                w,
                f"header names key fingerprint {body.get('key_fingerprint')}, but its public key's is "
                f"{fingerprint(chain.key)}",
            )
        )


def _check_root(
    chain: Chain, rec: dict[str, Any], w: str, hashes: list[bytes], seq_pos: dict[int, int], last_root_to: int
) -> None:
    body = rec["body"]
    chain.roots += 1
    assert chain.key is not None  # check_chain checks roots only once the header gave a key
    try:
        lo, hi = int(body["from"]), int(body["to"])
        sig = bytes.fromhex(str(body["signature"]))
    except (KeyError, TypeError, ValueError):
        chain.problems.append(Problem(w, "root record lacks from, to or signature"))
        return
    if lo != last_root_to + 1 or hi != rec["seq"] - 1 or body.get("count") != rec["seq"]:
        chain.problems.append(
            Problem(w, f"root covers seq {lo}-{hi}, expected {last_root_to + 1}-{rec['seq'] - 1}")
        )
        return
    leaves = [hashes[seq_pos[s]] for s in range(lo, hi + 1) if s in seq_pos]
    if merkle_root(leaves).hex() != body.get("merkle"):
        chain.problems.append(Problem(w, f"Merkle root does not match records seq {lo}-{hi}"))
    try:
        chain.key.verify(sig, root_message(str(chain.header.get("ledger_id")), body, str(rec["prev"])))
    except InvalidSignature:
        chain.problems.append(
            Problem(w, f"signature does not verify with the header's public key {fingerprint(chain.key)}")
        )
    except (KeyError, TypeError, ValueError):
        chain.problems.append(Problem(w, "root record is incomplete"))
    if body.get("key_fingerprint") != fingerprint(chain.key):  # not signed, but hashed: still stated
        chain.problems.append(
            Problem(
                w,
                f"root names key {body.get('key_fingerprint')}, but the header's key is "
                f"{fingerprint(chain.key)}",
            )
        )


# --- bundle audit ------------------------------------------------------------------------------------


WALL_CLOCK_FROM = 1e9  # Unix seconds (2001-09-09): smaller sample times are a log's own clock (uptime)
SEVERITY = ("inconsistent", "unverifiable", "consistent")  # a device's verdict: its worst window's


@dataclass
class AuditReport:
    """What the audit found, and what an OK means: who signed, when, which claim, which span."""

    path: Path
    problems: list[Problem]
    notes: list[str]  # what was checked, for the human summary
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # the stated verdicts that were re-run
    key_fingerprint: str | None = None  # the key that signed (the header's, checked against the roots)
    key_pinned: bool = False  # the auditor named it (--pubkey), rather than trusting the bundle's
    created: float | None = None  # when the header was written (the signer's clock)
    claims: list[str] = field(default_factory=list)  # "no-training, 120 s windows"
    spans: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # device -> first, last, n

    @property
    def ok(self) -> bool:
        return not self.problems

    def devices(self) -> list[dict[str, Any]]:
        """Per device: its telemetry span and samples, and per claim its verdict (the worst of its
        windows') with the count of windows by verdict."""
        out = []
        for uid, (start, end, n) in sorted(self.spans.items()):
            per_claim: dict[str, dict[str, int]] = {}
            for v in self.verdicts:
                if v.get("device") == uid:
                    counts = per_claim.setdefault(str(v.get("claim")), {})
                    counts[str(v.get("verdict"))] = counts.get(str(v.get("verdict")), 0) + 1
            verdicts = [
                {"claim": c, "verdict": next((k for k in SEVERITY if k in w), None), "windows": w}
                for c, w in per_claim.items()
            ]
            out.append({"device": uid, "start": start, "end": end, "samples": n, "verdicts": verdicts})
        return out


def _pin_key(report: AuditReport, chain: Chain, pubkey: Ed25519PublicKey | None, trust: bool) -> None:
    """The header's key must be the one the auditor pinned; unpinned is doubt unless trusted explicitly."""
    assert chain.key is not None
    signer = fingerprint(chain.key)
    report.key_fingerprint, report.key_pinned = signer, pubkey is not None
    if pubkey is not None:
        if fingerprint(pubkey) != signer:
            report.problems.append(
                Problem(
                    "header",
                    f"signed with key {signer}, but the pinned key is {fingerprint(pubkey)}: "
                    "the key was swapped",
                )
            )
    elif not trust:
        report.problems.append(
            Problem(
                "header",
                f"signing key {signer} is not pinned: pass --pubkey with the signer's public key "
                "(or --trust-bundle-key)",
            )
        )


def _require_fresh(report: AuditReport, not_before: float) -> None:
    """Every device's telemetry must reach `not_before` (wall-clock Unix seconds): a genuine but older
    bundle is not evidence for a later time."""
    if not report.spans:
        report.problems.append(Problem("file", "holds no telemetry: nothing to show it is recent"))
    for uid, (_, end, _) in sorted(report.spans.items()):
        if end < WALL_CLOCK_FROM:
            report.problems.append(
                Problem(
                    f"device {uid}",
                    f"sample times (up to t={end:.3f}) are the log's own clock, not dated: "
                    "--not-before cannot be shown",
                )
            )
        elif end < not_before:
            report.problems.append(
                Problem(
                    f"device {uid}",
                    f"telemetry ends at {utc(end)}, before --not-before {utc(not_before)}: "
                    "the bundle is older than required",
                )
            )


def utc(t: float) -> str:
    """ISO 8601 UTC to the second for wall-clock times; a log's own clock stays a number."""
    if not (WALL_CLOCK_FROM <= t < 253402300800):  # year 10000: beyond, datetime cannot say it
        return f"t={t:.3f}"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_header(report: AuditReport, chain: Chain) -> None:
    created = chain.header.get("created")
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        report.created = float(created)


def audit_chain(
    path: str | Path,
    pubkey: Ed25519PublicKey | None = None,
    trust_bundle_key: bool = False,
    not_before: float | None = None,
) -> AuditReport:
    """A ledger without verdicts (`audit --chain-only`): the chain, the key and the telemetry's order."""
    chain = check_chain(path)
    report = AuditReport(Path(path), list(chain.problems), [])
    if not chain.header or chain.key is None:
        return report
    _read_header(report, chain)
    _pin_key(report, chain, pubkey, trust_bundle_key)
    report.notes.append(f"chain: {len(chain.records)} records, {chain.roots} signed roots")
    _spans(report, _traces(chain, report.problems))
    if not_before is not None:
        _require_fresh(report, not_before)
    return report


def _spans(report: AuditReport, traces: dict[str, Trace]) -> None:
    report.spans = {
        uid: (float(t.time[0]), float(t.time[-1]), len(t)) for uid, t in traces.items() if len(t)
    }
    n = sum(s[2] for s in report.spans.values())
    report.notes.append(f"telemetry: {len(traces)} device(s), {n} samples")


def _traces(chain: Chain, problems: list[Problem]) -> dict[str, Trace]:
    """Each device's telemetry from its batch records, in ledger order, checked to run forward in time."""
    parts: dict[str, list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}
    devices: dict[str, Any] = {}
    metas: dict[str, dict[str, Any]] = {}
    last_t: dict[str, tuple[float, int]] = {}
    for rec in chain.records:
        if rec["kind"] != "batch":
            continue
        w, b = _where(rec["_line"], rec), rec["body"]
        try:
            dev = device_from_json(b.get("device"), "device", chain.path)
            t = np.array([np.nan if v is None else v for v in b["t"]], dtype=np.float64)
            cols = {
                s: np.array([np.nan if v is None else v for v in vals], dtype=np.float64)
                for s, vals in b["signals"].items()
            }
            meta = dict(b.get("meta") or {})
        # an edited record; OverflowError: an integer too big for a float (json reads any length)
        except (PhasescopeError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
            problems.append(Problem(w, "batch record is malformed (device, t, signals)"))
            continue
        bad = [s for s, c in cols.items() if s not in SIGNALS or c.shape != t.shape]
        if bad or not np.isfinite(t).all():
            problems.append(Problem(w, f"batch columns do not fit the time column or schema: {bad or 't'}"))
            continue
        # verify writes what read() gives, impossible readings already dropped: one here was put in later
        odd = next(((s, c[impossible(s, c)][0]) for s, c in cols.items() if impossible(s, c).any()), None)
        if odd is not None:
            (lo, hi), unit = RANGES[odd[0]], SIGNALS[odd[0]].unit
            problems.append(
                Problem(w, f"device {dev.uuid}: {odd[0]} {odd[1]:g} is outside its physical range "
                        f"{lo:g}..{hi:g} {unit}")
            )
            continue
        if t.size > 1 and not (np.diff(t) > 0).all():
            problems.append(Problem(w, f"device {dev.uuid}: sample times do not increase within the batch"))
            continue
        prior = last_t.get(dev.uuid)
        if prior is not None and t.size and t[0] <= prior[0]:
            problems.append(
                Problem(
                    w,
                    f"device {dev.uuid}: batch starts at t={t[0]:.3f}, not after the batch "
                    f"at line {prior[1]} (ends t={prior[0]:.3f}): telemetry reordered or "
                    "duplicated",
                )
            )
            continue
        if t.size:
            last_t[dev.uuid] = (float(t[-1]), rec["_line"])
        devices[dev.uuid] = dev
        metas[dev.uuid] = meta
        parts.setdefault(dev.uuid, []).append((t, cols))
    out = {}
    for uid, ps in parts.items():
        names = sorted({s for _, c in ps for s in c})
        t = np.concatenate([p[0] for p in ps])
        cols = {s: np.concatenate([p[1].get(s, np.full(p[0].size, np.nan)) for p in ps]) for s in names}
        out[uid] = Trace(devices[uid], t, cols, metas[uid])
    return out


def _close(a: Any, b: Any, path: str = "") -> str | None:
    """'' path of the first difference between two JSON values (floats to 1e-6 relative), None if equal."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
        if numbers and math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9):
            return None
        return path or "value"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}.keys" if path else "keys"
        for k in a:
            d = _close(a[k], b[k], f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}.length"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = _close(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else (path or "value")


def audit_bundle(
    path: str | Path,
    pubkey: Ed25519PublicKey | None = None,
    model: Any = None,
    trust_bundle_key: bool = False,
    not_before: float | None = None,
) -> AuditReport:
    """Everything `check_chain` checks, plus key pinning, the model, the telemetry and the verdicts;
    with `not_before` (Unix seconds), also that every device's telemetry reaches that time."""
    from phasescope.classify.model import PhaseModel
    from phasescope.verify.check import CheckParams, check_trace
    from phasescope.verify.claims import parse_claim

    chain = check_chain(path)
    problems = list(chain.problems)
    notes: list[str] = []
    report = AuditReport(Path(path), problems, notes)
    if not chain.header or chain.key is None:
        return report
    _read_header(report, chain)
    _pin_key(report, chain, pubkey, trust_bundle_key)
    notes.append(f"chain: {len(chain.records)} records, {chain.roots} signed roots")
    hm = chain.header.get("model")
    hm = hm if isinstance(hm, dict) else {}  # a header naming no model reads as another model's
    m = model or PhaseModel.load()
    if hm.get("version") != m.version or hm.get("digest") != model_digest(m):
        problems.append(
            Problem(
                "header",
                f"made with model {hm.get('version')} ({hm.get('digest')}), but the "
                f"model at hand is {m.version} ({model_digest(m)}): cannot re-run it",
            )
        )
        return report
    traces = _traces(chain, problems)
    _spans(report, traces)
    verdict_recs = [r for r in chain.records if r["kind"] == "verdict"]
    if not verdict_recs:
        problems.append(Problem("file", "holds no verdict records: a ledger, not a verify bundle"))
        return report
    if problems:
        return report  # re-running on telemetry already in doubt proves nothing
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in verdict_recs:
        b = r["body"]
        key = json.dumps([b.get("claim"), b.get("window_s"), b.get("params")], sort_keys=True)
        groups.setdefault(key, []).append(r)
    for recs in groups.values():
        b0 = recs[0]["body"]
        window_s = b0.get("window_s")
        try:
            claim = parse_claim(str(b0.get("claim")))
            params = CheckParams(**(b0.get("params") or {}))
            if window_s is not None and not (
                isinstance(window_s, (int, float))
                and not isinstance(window_s, bool)
                and math.isfinite(window_s)
                and window_s > 0
            ):
                raise TypeError("window_s")
        except (PhasescopeError, TypeError):
            problems.append(
                Problem(_where(recs[0]["_line"], recs[0]), "verdict names an unknown claim or setting")
            )
            continue
        report.claims.append(
            f"{claim.text}, " + ("one window per device" if window_s is None else f"{window_s:g} s windows")
        )
        seen_devices = set()
        by_dev: dict[str, list[dict[str, Any]]] = {}
        for r in recs:
            v = r["body"].get("verdict")
            if not isinstance(v, dict):
                problems.append(Problem(_where(r["_line"], r), "verdict record holds no verdict object"))
                continue
            by_dev.setdefault(str(v.get("device")), []).append(r)
        for uid, drecs in by_dev.items():
            seen_devices.add(uid)
            trace = traces.get(uid)
            if trace is None:
                problems.append(
                    Problem(
                        _where(drecs[0]["_line"], drecs[0]),
                        f"verdict for device {uid}, which has no telemetry in the bundle",
                    )
                )
                continue
            redo = [v.to_dict() for v in check_trace(trace, claim, m, window_s, params)]
            stated = [r["body"]["verdict"] for r in drecs]
            if len(redo) != len(stated):
                problems.append(
                    Problem(
                        _where(drecs[0]["_line"], drecs[0]),
                        f"device {uid}: {len(stated)} verdicts stated, re-running gives {len(redo)}",
                    )
                )
                continue
            for r, s, v in zip(drecs, stated, redo, strict=True):
                s2 = {k: x for k, x in s.items() if k != "assurance"}
                v2 = {k: x for k, x in v.items() if k != "assurance"}
                diff = _close(s2, v2)
                if diff:
                    problems.append(
                        Problem(
                            _where(r["_line"], r),
                            f"device {uid}: stated {s.get('verdict')} ({diff} = {_pick(s, diff)}), but "
                            f"re-running model {m.version} on the telemetry gives {v.get('verdict')} "
                            f"({_pick(v, diff)})",
                        )
                    )
                report.verdicts.append(s)
        for uid in sorted(set(traces) - seen_devices):
            problems.append(Problem(f"device {uid}", f"has telemetry but no '{claim.text}' verdict"))
    notes.append(
        f"verdicts: {len(verdict_recs)} re-run with model {m.version} and matched"
        if not problems
        else f"verdicts: {len(verdict_recs)} checked"
    )
    if not_before is not None:
        _require_fresh(report, not_before)
    return report


def _pick(obj: Any, dotted: str) -> str:
    cur = obj
    for part in dotted.replace("[", ".[").split("."):
        if not part:
            continue
        try:
            cur = cur[int(part[1:-1])] if part.startswith("[") else cur[part]
        except (KeyError, IndexError, TypeError, ValueError):
            return "?"
    text = json.dumps(cur)
    return text if len(text) <= 40 else text[:37] + "..."
