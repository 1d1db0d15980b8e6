"""Pieces the text-log readers share (the `nvidia-smi` table, `nvidia-smi -q`, `dcgmi dmon`): the date
line nvidia-smi and `watch` print, numbers with a unit glued on, and the one line about a cut-off tail."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime

from phasescope.errors import InputError
from phasescope.schema import SIGNALS
from phasescope.signal_names import UNITS
from phasescope.sources.replay._common import PathLike, log

# ctime-style date: 'Mon Dec  7 10:00:00 2026' (nvidia-smi's first line, the end of `watch`'s header).
_CTIME = r"[A-Z][a-z]{2} +[A-Z][a-z]{2} +\d{1,2} +\d{1,2}:\d{2}:\d{2} +\d{4}"
CTIME_LINE = re.compile(rf"^\s*({_CTIME})\s*$")
# `watch -n 2 nvidia-smi` header: 'Every 2.0s: nvidia-smi    host: Mon Dec  7 10:00:00 2026'.
WATCH_LINE = re.compile(rf"^\s*Every\s+(\d+(?:\.\d+)?)s:.*?({_CTIME})?\s*$")

_MONTHS = {m: i + 1 for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
)}
# What nvidia-smi prints where it has no value: read as NaN.
MISSING = frozenset({"N/A", "[N/A]", "Not Supported", "[Not Supported]", "ERR!", "Unknown Error", "-", ""})
_VALUE = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z%/]*)$")


def parse_ctime(path: PathLike, line_no: int, text: str) -> float:
    """'Mon Dec  7 10:00:00 2026' -> Unix seconds. The logs carry no zone; read as UTC, as the other
    readers do."""
    # By hand, not strptime: a day's 1 Hz log has 86,400 of them and strptime took a tenth of the read.
    parts = text.split()
    try:
        _, month, day, clock, year = parts
        hour, minute, second = clock.split(":")
        stamp = datetime(int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second), tzinfo=UTC)
    except (ValueError, KeyError, OverflowError):  # a day of 99999999999 overflows C int, not ValueError
        raise InputError(path, f"line {line_no}", "a date like 'Mon Dec  7 10:00:00 2026'", text) from None
    return stamp.timestamp()


def value_in(path: PathLike, line_no: int, field: str, token: str, signal: str) -> float:
    """`signal`'s value from a number with its unit glued on or after a space ('45C', '62.00 W', '35 %'),
    in base units (the unit looked up in signal_names.UNITS, which must measure what `signal` does); a
    missing-value marker is NaN. Anything else is an error naming the line."""
    value = parse_value(token, signal)
    if value is None:
        expected = f"a number with a unit of {SIGNALS[signal].unit} for {signal} (or N/A)"
        raise InputError(path, f"line {line_no}, field {field!r}", expected, token.strip())
    return value


@functools.lru_cache(maxsize=1 << 16)
def parse_value(token: str, signal: str) -> float | None:
    """`value_in` without the error; cached, as a log repeats the same few hundred tokens (a third of
    the time of a table log went into parsing them one by one)."""
    token = token.strip()
    if token in MISSING:
        return float("nan")
    m = _VALUE.match(token)
    known = UNITS.get(m.group(2).lower()) if m is not None else None
    if m is None or known is None or known[0] != SIGNALS[signal].unit:
        return None
    return float(m.group(1)) * known[1]


def warn_cut_tail(path: PathLike, what: str, line_no: int, kept: int) -> None:
    """One line saying the last block was cut off (a logger killed mid-write) and dropped."""
    log.warning(
        "phasescope: warning: %s: the last %s (from line %d) was cut off: dropped; %d complete %s(s) kept",
        path, what, line_no, kept, what,
    )
