"""One duration type for every option that takes a time (issue 22): `90s`, `15m`, `1h30m`, `2d` or bare
seconds, on every command; nonsense refused by click in one line; the values reach the command as seconds."""

from __future__ import annotations

from importlib import import_module

import click
import pytest
from click.testing import CliRunner

from phasescope.cli import _COMMANDS
from phasescope.cli._options import Duration

# Options that take a span of time. `--since`, `--step` and `--every` of `fleet` are parsed as durations
# inside the command (they also take an age); `--history` of `top` takes 0 (none).
TIME_OPTIONS = {"--duration", "--interval", "--window", "--stride", "--min-segment", "--segment", "--timeout",
                "--idle-gap", "--history", "--scrape-interval", "--every", "--step", "--since"}
PARSED_IN_COMMAND = {("fleet", "--since"), ("fleet", "--step"), ("fleet", "--every"), ("top", "--history"),
                     ("report", "--window"), ("verify", "--since")}  # verify's: a time or an age


def _time_options() -> list[tuple[str, click.Option]]:
    out = []
    for name, module in sorted(_COMMANDS.items()):
        cmd = import_module(f"phasescope.cli.{module}").command
        for p in cmd.params:
            if isinstance(p, click.Option) and set(p.opts) & TIME_OPTIONS:
                out.append((name, p))
    return out


@pytest.mark.parametrize(("name", "option"), _time_options(),
                         ids=lambda x: x if isinstance(x, str) else x.opts[0])
def test_every_time_option_takes_a_duration(name: str, option: click.Option) -> None:
    if (name, option.opts[0]) in PARSED_IN_COMMAND:
        assert option.type == click.STRING or isinstance(option.type, Duration)
        return
    assert isinstance(option.type, Duration), f"{name} {option.opts[0]} takes {option.type!r}"


def test_duration_converts_and_refuses() -> None:
    d = Duration()
    assert d.convert("90s", None, None) == 90.0
    assert d.convert("1h30m", None, None) == 5400.0
    assert d.convert("2.5", None, None) == 2.5
    assert d.convert(3, None, None) == 3.0
    for bad in ("ten", "-5", "0", "nan", "5 parsecs"):
        with pytest.raises(click.BadParameter):
            d.convert(bad, None, None)
    with pytest.raises(click.BadParameter):
        Duration(max=60).convert("2m", None, None)
    assert Duration(min_open=False).convert("0s", None, None) == 0.0


def test_a_command_takes_minutes_and_refuses_nonsense_in_one_line(shared_data: object) -> None:
    from phasescope.cli.classify import command as classify

    bad = CliRunner().invoke(classify, ["--min-segment", "ninety", "x.csv"])
    assert bad.exit_code == 2 and "--min-segment" in bad.output and "90s" in bad.output
