"""A time without a zone is UTC on a host whose zone is not (test_timespec.py runs where the host's zone is
UTC, so it cannot tell UTC from local time)."""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterator

import pytest

from phasescope.timespec import parse_instant, parse_time


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    ("text", "fields"),
    [("2026-12-01T00:00:00", (2026, 12, 1, 0, 0, 0)), ("2026-07-01 12:30:00", (2026, 7, 1, 12, 30, 0)),
     ("2026-12-01", (2026, 12, 1, 0, 0, 0))],
)
def test_no_zone_means_utc_on_a_host_in_another_zone(
    new_york: None, text: str, fields: tuple[int, ...]
) -> None:
    assert time.localtime(0).tm_gmtoff != 0  # the host zone really is not UTC here
    unix = float(calendar.timegm((*fields, 0, 0, 0)))
    assert parse_instant(text, "--end") == unix
    assert parse_time(text, "--since", now=2e9) == unix
