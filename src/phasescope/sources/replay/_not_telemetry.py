"""Files that look like telemetry but are not device telemetry: say what they are instead of 'unknown'."""

from __future__ import annotations

import re

_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+\S+", re.MULTILINE)


def explain(text: str) -> tuple[str, str] | None:
    """(where, what) for a known non-telemetry file, from its first bytes; None when it is not one."""
    if "DCGM_FI_" in text:
        return None  # dcgm-exporter scrape: real device telemetry
    names = [m.group(1) for m in _METRIC_LINE.finditer(text)]
    if any(n.startswith("vllm:") for n in names):
        return (
            "content",
            "GPU telemetry; this is a vLLM /metrics scrape (inference-server metrics), not device telemetry",
        )
    if any(n.startswith(("tgi_", "tgi:")) for n in names):
        return "content", "GPU telemetry; this is a Hugging Face TGI /metrics scrape, not device telemetry"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].replace(" ", "").startswith("#Entity"):
        err = next((ln for ln in lines if ln.lower().startswith("error")), None)
        if err is not None:  # a dmon that never got its watches; without one it is read (dcgmi-dmon)
            return (
                "content",
                f"dcgmi dmon rows; this dcgmi dmon output holds an error line instead: {err[:120]!r}",
            )
    if lines and lines[0].startswith('Field "') and "is not a valid field to query" in lines[0]:
        return "content", f"nvidia-smi CSV rows; this is an nvidia-smi error message: {lines[0][:120]!r}"
    return None
