"""Claim checking: verify a declared use against telemetry, and leave evidence an auditor can check offline.

- `claims`: parse a declaration ("inference", "no-training", "max-flop=1e21", ...).
- `check`: per device and time window, a verdict (consistent / inconsistent / unverifiable) with the
  classifier's probabilities, the features that drove them, the data coverage and an assurance statement.
- `flops`: FLOP accounting from utilisation, SM clock and tensor-activity counters, with an error band.
- `ledger`: the append-only, hash-chained, Ed25519-signed log of telemetry batches and verdicts (a bundle
  is a closed ledger that holds verdicts); `audit` checks one offline. Format: docs/VERIFY.md.
"""

from phasescope.errors import PhasescopeError


class MissingDependency(PhasescopeError):
    """An optional dependency a command needs is not installed."""


def require_cryptography() -> None:
    """Signing and auditing need `cryptography` (the `verify` extra): say so in one line, not a traceback."""
    try:
        import cryptography  # noqa: F401
    except ModuleNotFoundError:
        raise MissingDependency(
            "signing and auditing need the cryptography package: pip install 'phasescope[verify]'"
        ) from None
