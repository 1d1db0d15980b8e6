from __future__ import annotations

import math

import numpy as np
import pytest

from phasescope.schema import SIGNAL_NAMES
from phasescope.views.display import (
    MISSING,
    fmt_bytes,
    fmt_pair,
    fmt_rate,
    fmt_ratio,
    fmt_signal,
    sparkline,
)


@pytest.mark.parametrize("signal", SIGNAL_NAMES)
def test_every_signal_formats_missing_as_dash(signal: str) -> None:
    assert fmt_signal(signal, math.nan) == MISSING
    assert fmt_signal(signal, None) == MISSING
    assert fmt_signal(signal, 0.0) != MISSING  # a real zero is shown as a zero


def test_units() -> None:
    assert fmt_ratio(0.456) == "46%"
    assert fmt_bytes(24 * 1024**3) == "24.0 GiB"
    assert fmt_bytes(512.0) == "512 B"
    assert fmt_rate(12_345_678.0) == "12.3 MB/s"
    assert fmt_signal("sm_clock", 1.41e9) == "1410 MHz"
    assert fmt_signal("power", 231.4) == "231 W"
    assert fmt_pair(MISSING, MISSING) == MISSING
    assert fmt_pair("1 W", MISSING) == "1 W / –"


def test_sparkline_scale_and_gaps() -> None:
    line = sparkline(np.array([0.0, 0.5, 1.0, np.nan, 1.0]), width=8, lo=0.0, hi=1.0)
    assert line == "   ▁▅█ █"  # padded left to the width, a gap for the missing sample
    assert sparkline(np.array([np.nan, np.nan]), width=3) == "   "
    assert sparkline(np.arange(100.0), width=10) == sparkline(np.arange(90.0, 100.0), width=10)
    assert len(sparkline(np.array([5.0, 5.0]), width=4)) == 4


def test_money_durations_and_si_counts() -> None:
    from phasescope.views.display import fmt_seconds, fmt_si, fmt_usd

    assert fmt_usd(1234.5) == "$1,234.50" and fmt_usd(0) == "$0.00"
    assert fmt_usd(0.0000449) == "$0.0000449"  # three significant digits, never $0.00 for a real cost
    assert fmt_usd(None) == MISSING and fmt_usd(math.nan) == MISSING
    assert fmt_seconds(0.00042) == "420 µs" and fmt_seconds(0.0042) == "4.2 ms"
    assert fmt_seconds(0.042) == "42 ms" and fmt_seconds(42.0) == "42.0 s"
    assert fmt_seconds(0.0) == "0 s"  # e.g. a report segment from the trace's start, not "0 µs"
    assert fmt_seconds(600) == "10.0 m" and fmt_seconds(9000) == "2.5 h" and fmt_seconds(math.inf) == MISSING
    assert fmt_si(987) == "987" and fmt_si(40217.3) == "40.2k" and fmt_si(1.35e6) == "1.35M"
    assert fmt_si(0.25) == "0.25" and fmt_si(None) == MISSING
