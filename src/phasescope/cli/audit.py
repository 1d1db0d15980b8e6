"""`phasescope audit BUNDLE [--pubkey KEY.pub]`: check an evidence bundle (or ledger) offline.

Fails closed: any problem (a broken chain, a bad signature, an unpinned or swapped key, another model,
telemetry out of order, a verdict the telemetry does not reproduce) means exit 1, with the problem named.
"""

from __future__ import annotations

import json

import click

from phasescope.cli._options import model_option

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
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def command(
    bundle: str,
    pubkey: str | None,
    trust_bundle_key: bool,
    model_path: str | None,
    chain_only: bool,
    as_json: bool,
) -> None:
    """Verify a bundle's chain, signatures, key, model and verdicts offline.

    \b
    Example:
      phasescope audit evidence.jsonl --pubkey signer.pub
    """
    from phasescope.verify import require_cryptography

    require_cryptography()
    from phasescope.classify.model import PhaseModel
    from phasescope.verify.audit import AuditFailed, AuditReport, Problem, audit_bundle, check_chain
    from phasescope.verify.keys import fingerprint, load_public

    key = load_public(pubkey) if pubkey else None
    if chain_only:
        chain = check_chain(bundle)
        problems = list(chain.problems)
        if chain.key is not None and key is not None and fingerprint(key) != fingerprint(chain.key):
            problems.append(
                Problem(
                    "header",
                    f"signed with key {fingerprint(chain.key)}, but the pinned key is "
                    f"{fingerprint(key)}: the key was swapped",
                )
            )
        elif chain.key is not None and key is None and not trust_bundle_key:
            problems.append(
                Problem("header", f"signing key {fingerprint(chain.key)} is not pinned: pass --pubkey")
            )
        report = AuditReport(
            chain.path, problems, [f"chain: {len(chain.records)} records, {chain.roots} roots"]
        )
    else:
        model = PhaseModel.load(model_path)
        report = audit_bundle(bundle, key, model, trust_bundle_key)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "bundle": bundle,
                    "ok": report.ok,
                    "problems": [p.line(bundle) for p in report.problems],
                    "notes": report.notes,
                    "verdicts": {
                        k: sum(v.get("verdict") == k for v in report.verdicts)
                        for k in ("consistent", "inconsistent", "unverifiable")
                    },
                }
            )
        )
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
        for n in report.notes:
            click.echo(n)
        click.echo(f"audit OK: {bundle}")
