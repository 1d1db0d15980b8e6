"""Durations ('90s', '15m', '1h', '2d') and instants (Unix seconds, ISO 8601, 'now') on the command line."""

from __future__ import annotations

import re
import time
from datetime import datetime

from phasescope.errors import InputError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str, option: str = "--since") -> float:
    t = (text or "").strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = _DURATION.findall(t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise InputError(option, "duration", "a duration like 90s, 15m, 1h30m or 2d", text)
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise InputError(option, "duration", "a positive duration", text)
    return seconds


def parse_instant(text: str | None, option: str = "--end") -> float:
    if text is None or text.strip().lower() in ("", "now"):
        return time.time()
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            option, "time", "Unix seconds, ISO 8601 (2026-12-01T00:00:00Z) or 'now'", text
        ) from None
    if stamp.tzinfo is None:
        raise InputError(option, "time", "an ISO 8601 time with a zone (Z or +00:00)", text)
    return stamp.timestamp()
