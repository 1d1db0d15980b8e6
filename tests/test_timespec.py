"""The one grammar for durations and times on the command line (fleet, verify, top)."""

from __future__ import annotations

import pytest

from phasescope.cli import fleet as fleet_cli
from phasescope.errors import InputError
from phasescope.timespec import parse_duration, parse_instant, parse_time
from phasescope.verify import inputs as verify_inputs

NOW = 1_800_000_000.0
EPOCH_1_7E9 = "2023-11-14T22:13:20"  # 1_700_000_000 in UTC


def test_every_caller_uses_the_shared_parser() -> None:
    assert fleet_cli.parse_duration is parse_duration
    assert fleet_cli.parse_instant is parse_instant
    assert verify_inputs.parse_time is parse_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("2.5", 2.5),
        ("10m", 600.0),
        ("10M", 600.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("250ms", 0.25),
        (" 15m ", 900.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "an hour", "10 minutes", "1h30", "m", "-5m", "5x", "1e3s", "nan"])
def test_bad_durations_say_what_was_expected(text: str) -> None:
    with pytest.raises(InputError, match=r"^--step: duration: expected a duration like 90s"):
        parse_duration(text, "--step")


def test_zero_is_a_duration_only_where_allowed() -> None:
    with pytest.raises(InputError, match=r"--since: duration: expected a positive duration, got '0s'"):
        parse_duration("0s", "--since")
    assert parse_duration("0", "--history", allow_zero=True) == 0.0


@pytest.mark.parametrize(
    ("text", "unix"),
    [
        ("1700000000", 1_700_000_000.0),
        ("1700000000.5", 1_700_000_000.5),
        (EPOCH_1_7E9 + "Z", 1_700_000_000.0),
        (EPOCH_1_7E9 + "z", 1_700_000_000.0),
        (EPOCH_1_7E9 + "+00:00", 1_700_000_000.0),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000.0),
        (EPOCH_1_7E9, 1_700_000_000.0),  # no zone: UTC, whatever the host's zone
        ("2023-11-14 22:13:20", 1_700_000_000.0),
        ("2023-11-14", 1_699_920_000.0),
        ("now", NOW),
        ("NOW", NOW),
    ],
)
def test_instants(text: str, unix: float) -> None:
    assert parse_instant(text, "--end", NOW) == unix
    assert parse_time(text, "--until", NOW) == unix  # every instant is also a time


def test_instant_defaults_to_now() -> None:
    assert parse_instant(None, "--end", NOW) == NOW
    assert parse_instant("", "--end", NOW) == NOW


@pytest.mark.parametrize("text", ["yesterday", "10m", "2023-13-01", "inf", "nan", "1e999"])
def test_bad_instants_say_what_was_expected(text: str) -> None:
    with pytest.raises(InputError, match=r"^--end: time: expected Unix seconds, ISO 8601"):
        parse_instant(text, "--end", NOW)


@pytest.mark.parametrize(
    ("text", "unix"),
    [
        ("10m", NOW - 600),
        ("-10m", NOW - 600),
        ("10m ago", NOW - 600),
        ("1h30m", NOW - 5400),
        ("2d", NOW - 172800),
        ("600", 600.0),  # a bare number is Unix seconds, not an age
    ],
)
def test_times_take_ages_before_now(text: str, unix: float) -> None:
    assert parse_time(text, "--since", NOW) == unix


@pytest.mark.parametrize("text", ["soon", "yesterday-ish", "10 minutes", "ago"])
def test_bad_times_say_what_was_expected(text: str) -> None:
    with pytest.raises(InputError, match=r"^--since: time: expected Unix s.*an age like 10m"):
        parse_time(text, "--since", NOW)
