"""Durations and times on the command line: one grammar for every command (fleet, verify, top).

- A duration is a positive number of seconds, bare ("90") or with units, compound allowed:
  90s, 15m, 1h30m, 2d, 1w, 250ms (spaces and case ignored: "1h 30m", "10M").
- An instant is 'now', Unix seconds ("1764547200" or "1764547200.5"), or ISO 8601 with or without a
  zone ("2026-12-01T00:00:00Z", "2026-12-01 01:00+01:00", "2026-12-01"). No zone means UTC: telemetry
  times are UTC everywhere in phasescope, and a host's local zone would make one command line mean
  different windows on different machines.
- A time (`parse_time`, e.g. `--since`) is an instant or an age: a duration before now ("10m",
  "-10m", "10m ago"). A bare number is Unix seconds there, never an age.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from phasescope.errors import InputError

UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d|w)")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
DURATION_HELP = "a duration like 90s, 15m, 1h30m or 2d"
INSTANT_HELP = "Unix seconds, ISO 8601 (2026-12-01T00:00:00Z; no zone = UTC) or 'now'"
TIME_HELP = "Unix seconds, ISO 8601 (no zone = UTC), 'now' or an age like 10m, 2h, 1d"


def _duration_seconds(text: str) -> float | None:
    """Seconds of a duration (may be 0), or None when `text` is not one."""
    t = re.sub(r"\s+", "", text).lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = _PART.findall(t)
    if not parts or "".join(n + u for n, u in parts) != t:
        return None
    return sum(float(n) * UNITS[u] for n, u in parts)


def parse_duration(text: str, option: str = "--since", *, allow_zero: bool = False) -> float:
    """Seconds in `text` (90s, 15m, 1h30m, 2d; a bare number is seconds); positive unless `allow_zero`."""
    seconds = _duration_seconds(text or "")
    if seconds is None:
        raise InputError(option, "duration", DURATION_HELP, text)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InputError(option, "duration", "a positive duration" + (" or 0" if allow_zero else ""), text)
    return seconds


def parse_instant(text: str | None, option: str = "--end", now: float | None = None) -> float:
    """Unix seconds of 'now' (or None/empty), Unix seconds, or ISO 8601 (no zone = UTC)."""
    t = (text or "").strip()
    if t.lower() in ("", "now"):
        return time.time() if now is None else float(now)
    stamp = _instant(t)
    if stamp is None:
        raise InputError(option, "time", INSTANT_HELP, text)
    return stamp


def parse_time(text: str, option: str = "--since", now: float | None = None) -> float:
    """An instant (see `parse_instant`) or an age before `now`: '10m', '-10m' and '10m ago' all mean
    ten minutes before now."""
    t = (text or "").strip()
    ref = time.time() if now is None else float(now)
    age = t.lower()
    age = age[:-3].rstrip() if age.endswith("ago") else age[1:] if age.startswith("-") else age
    if not _NUMBER.fullmatch(age):  # a bare number is an instant (Unix s), never an age
        seconds = _duration_seconds(age)
        if seconds is not None:
            return ref - seconds
    if t.lower() in ("", "now"):
        return ref
    stamp = _instant(t)
    if stamp is None:
        raise InputError(option, "time", TIME_HELP, text)
    return stamp


def _instant(t: str) -> float | None:
    if _NUMBER.fullmatch(t):
        value = float(t)
        return value if value == value and abs(value) != float("inf") else None
    try:
        stamp = datetime.fromisoformat(t[:-1] + "Z" if t.endswith("z") else t)  # 3.11 reads Z, not z
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()
