"""`phasescope audit BUNDLE [--pubkey KEY.pub] [--not-before TIME]`: check an evidence bundle (or ledger)
offline.

Fails closed: any problem (a file not byte-for-byte as written, a broken chain, a bad signature, an
unpinned or swapped key, another model, telemetry out of order, a verdict the telemetry does not reproduce,
telemetry older than --not-before) means exit 1, with the problem named. An OK says what it rests on.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from phasescope.cli._options import model_option

if TYPE_CHECKING:
    from phasescope.verify.audit import AuditReport

MAX_LISTED = 10


@click.command("audit")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=str))
@click.option(
    "--pubkey",
    default=None,
    type=click.Path(dir_okay=False, path_type=str),
    help="The signer's public key (PEM, e.g. ~/.local/share/phasescope/keys/default.pub).",
)
@click.option(
    "--trust-bundle-key",
    is_flag=True,
    help="Accept the key the bundle names (checks integrity, not who signed).",
)
@model_option("Model file to re-run (default: the shipped model).")
@click.option(
    "--chain-only", is_flag=True, help="Check the chain and signatures only (for a telemetry ledger)."
)
@click.option(
    "--not-before",
    default=None,
    metavar="TIME",
    help="Fail unless every device's telemetry reaches TIME (Unix s, ISO 8601, or an age like 7d): "
    "an older genuine bundle is not evidence for now.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def command(
    bundle: str,
    pubkey: str | None,
    trust_bundle_key: bool,
    model_path: str | None,
    chain_only: bool,
    not_before: str | None,
    as_json: bool,
) -> None:
    """Verify a bundle's chain, signatures, key, model and verdicts offline.

    An OK names what was checked: the signer's key, when the bundle was written, the claim, the time span
    of the telemetry and each device's verdict, so that an old bundle shows as old.

    \b
    Example:
      phasescope audit evidence.jsonl --pubkey signer.pub --not-before 7d
    """
    from phasescope.verify import require_cryptography

    require_cryptography()
    from phasescope.classify.model import PhaseModel
    from phasescope.sources.replay import check_file
    from phasescope.timespec import parse_time
    from phasescope.verify.audit import AuditFailed, audit_bundle, audit_chain
    from phasescope.verify.keys import load_public

    for path in (bundle, pubkey):  # before any open: a FIFO would block the first read forever
        if path is not None:
            check_file(path)
    key = load_public(pubkey) if pubkey else None
    fresh = parse_time(not_before, "--not-before") if not_before is not None else None
    if chain_only:
        report = audit_chain(bundle, key, trust_bundle_key, fresh)
    else:
        report = audit_bundle(bundle, key, PhaseModel.load(model_path), trust_bundle_key, fresh)
    if as_json:
        click.echo(json.dumps(_as_json(report, bundle, fresh), allow_nan=False))
    else:
        for p in report.problems[1:MAX_LISTED]:
            click.echo(f"phasescope: {p.line(bundle)}", err=True)
        if len(report.problems) > MAX_LISTED:
            click.echo(f"phasescope: ... and {len(report.problems) - MAX_LISTED} more problems", err=True)
    if not report.ok:
        first = report.problems[0]
        more = f" (+{len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise AuditFailed(f"audit FAILED: {first.line(bundle)}{more}")
    if not as_json:
        click.echo(f"audit OK: {bundle}")
        for line in _summary(report, fresh):
            click.echo(f"  {line}")


def _span(start: float, end: float, say_clock: bool = False) -> str:
    from phasescope.verify.audit import WALL_CLOCK_FROM, utc

    dated = " (the log's own clock, not dated)" if say_clock and start < WALL_CLOCK_FROM else ""
    return f"{utc(start)} .. {utc(end)} ({end - start:.0f} s){dated}"


def _summary(report: AuditReport, not_before: float | None) -> list[str]:
    """What an OK rests on, for a person: who signed, when, what was claimed, over which span."""
    from phasescope.verify.audit import utc

    how = "pinned with --pubkey" if report.key_pinned else "taken from the bundle (--trust-bundle-key)"
    lines = [f"signed by: key {report.key_fingerprint}, {how}"]
    if report.created is not None:
        lines.append(f"written:   {utc(report.created)} (the signer's clock)")
    lines += [f"claim:     {c}" for c in report.claims]
    devices = report.devices()
    if devices:
        lines.append(
            f"span:      {_span(min(d['start'] for d in devices), max(d['end'] for d in devices), True)}"
        )
    if not_before is not None:
        lines.append(f"fresh:     every device's telemetry reaches --not-before {utc(not_before)}")
    named = len(report.claims) > 1  # one claim (a verify bundle): it is on the claim line
    for d in devices:
        verdicts = [
            (f"{v['claim']}: " if named else "")
            + f"{v['verdict']} ({', '.join(f'{n} {k}' for k, n in v['windows'].items())} window(s))"
            for v in d["verdicts"]
        ]
        lines.append(
            f"device {d['device']}: "
            + "".join(f"{x}; " for x in verdicts)
            + f"{d['samples']} samples, {_span(d['start'], d['end'])}"
        )
    return lines + report.notes


def _as_json(report: AuditReport, bundle: str, not_before: float | None) -> dict[str, Any]:
    return {
        "bundle": bundle,
        "ok": report.ok,
        "problems": [p.line(bundle) for p in report.problems],
        "notes": report.notes,
        "key_fingerprint": report.key_fingerprint,
        "key_pinned": report.key_pinned,
        "created": report.created,
        "claims": report.claims,
        "not_before": not_before,
        "devices": report.devices(),
        "verdicts": {
            k: sum(v.get("verdict") == k for v in report.verdicts)
            for k in ("consistent", "inconsistent", "unverifiable")
        },
    }
