"""Declarations a site can make about its accelerators, and what each one forbids."""

from __future__ import annotations

import math
from dataclasses import dataclass

from phasescope.errors import InputError
from phasescope.schema import PHASES

CLAIM_HELP = "inference, idle, training, no-training or max-flop=N (e.g. max-flop=1e21)"

# Which classifier phases contradict each phase claim. Idle never contradicts a workload claim: serving
# and training hosts both sit idle between requests or jobs.
_FORBIDDEN: dict[str, frozenset[str]] = {
    "inference": frozenset({"training", "other"}),
    "idle": frozenset({"training", "inference", "other"}),
    "training": frozenset({"inference", "other"}),
    "no-training": frozenset({"training"}),
}


@dataclass(frozen=True)
class Claim:
    """A parsed declaration. `max_flop` is set only for a FLOP budget claim."""

    text: str
    kind: str  # a key of _FORBIDDEN, or "max-flop"
    max_flop: float | None = None

    @property
    def forbidden(self) -> frozenset[str]:
        """Phases whose presence contradicts the claim (empty for a FLOP budget)."""
        return _FORBIDDEN.get(self.kind, frozenset())

    @property
    def excludes_training(self) -> bool:
        """Claims for which the streaming "training started" alarm is evidence against the claim."""
        return "training" in self.forbidden


def parse_claim(text: str) -> Claim:
    """'no-training' -> Claim; 'max-flop=1e21' -> Claim(max_flop=1e21). Bad text -> InputError."""
    t = (text or "").strip().lower()
    if t in _FORBIDDEN:
        return Claim(t, t)
    if t.startswith("max-flop="):
        raw = t.split("=", 1)[1]
        try:
            value = float(raw)
        except ValueError:
            raise InputError("--declare", "max-flop", "a number of FLOP such as 1e21", raw) from None
        if not (math.isfinite(value) and value > 0):
            raise InputError("--declare", "max-flop", "a positive finite number of FLOP", raw)
        return Claim(t, "max-flop", value)
    raise InputError("--declare", "claim", CLAIM_HELP, text)


assert all(p in PHASES for f in _FORBIDDEN.values() for p in f)
