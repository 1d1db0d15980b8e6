"""Every command's --help works without side effects and shows at least one example."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from phasescope.cli import _COMMANDS, cli


def _all_commands() -> list[list[str]]:
    out: list[list[str]] = []
    ctx = click.Context(cli)
    for name in sorted(_COMMANDS):
        cmd = cli.get_command(ctx, name)
        if cmd is None:  # registered, module not written yet
            continue
        out.append([name])
        if isinstance(cmd, click.Group):
            out += [[name, sub] for sub in sorted(cmd.list_commands(ctx))]
    return out


@pytest.mark.parametrize("path", _all_commands(), ids=" ".join)
def test_help_shows_an_example(path: list[str]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "Example" in text, f"`phasescope {' '.join(path)} --help` has no example"
    example_lines = [ln for ln in text.splitlines() if ln.strip().startswith("phasescope ")
                     or "Example: phasescope " in ln]
    assert example_lines, text


def test_top_level_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in _COMMANDS:
        assert name in result.output
