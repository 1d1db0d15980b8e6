"""The plain statement of assurance that every verdict carries: what is trusted, what was measured.

The measured figures come from `measured.json`, written by `python -m phasescope.verify.evaluate
--write` (run-grouped, no run on both sides). They are quoted only when they were measured with the
same model version as the verdict; otherwise the statement says they were not.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from phasescope.verify.claims import Claim
from phasescope.verify.coverage import Coverage
from phasescope.verify.flops import FlopEstimate

MEASURED_FILE = "measured.json"

TRUSTED = (
    "Trusted, not checked: the NVML/DCGM readings come from the host's driver and are not authenticated "
    "(a host that forges them, or hides work on devices or nodes not in scope, is not detected); the host "
    "clock; phasescope model {version}."
)


@lru_cache(maxsize=1)
def measured() -> dict[str, Any]:
    """The last evaluation's figures (empty when none was written)."""
    try:
        text = resources.files("phasescope.verify").joinpath(MEASURED_FILE).read_text(encoding="utf-8")
        doc = json.loads(text)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _rate(block: dict[str, Any], key: str) -> str:
    d = block.get(key) or {}
    n, k = d.get("device_runs"), d.get("flagged")  # per labelled device trace
    if not n:
        return "not measured"
    return f"{k}/{n} ({k / n:.0%})"


def measured_text(model_version: str) -> str:
    m = measured()
    if not m or m.get("model_version") != model_version:
        return (
            f"Detection rates for model {model_version} have not been measured "
            "(run python -m phasescope.verify.evaluate)."
        )
    runs = m.get("split_run", {})
    fam = m.get("split_family", {})
    return (
        "Measured on held-out real runs (python -m phasescope.verify.evaluate): 'no-training' is found "
        f"inconsistent on disguised-training device-runs {_rate(runs, 'evasion')} when runs are held out and "
        f"{_rate(fam, 'evasion')} when the whole evasion family is unseen; it is wrongly found inconsistent "
        f"on non-training device-runs {_rate(runs, 'non_training')} held out by run and "
        f"{_rate(fam, 'non_training')} when their family is unseen."
    )


def assurance_text(claim: Claim, cov: Coverage, model_version: str, flop: FlopEstimate) -> str:
    parts = [TRUSTED.format(version=model_version)]
    if claim.kind == "max-flop":
        parts.append(f"FLOP are bounded from telemetry, not counted: {flop.note}.")
    else:
        parts.append(measured_text(model_version))
    missing = ", ".join(cov.missing_signals) or "none"
    rate = f"{cov.rate_hz:.2g} Hz" if cov.rate_hz == cov.rate_hz else "unknown rate"
    parts.append(
        f"Data: {cov.samples} samples at {rate}, {cov.covered_fraction:.0%} of the window covered, "
        f"{cov.gaps} gap(s), missing signals: {missing}; {cov.windows_judged}/{cov.windows} windows judged."
    )
    return " ".join(parts)
