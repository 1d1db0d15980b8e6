"""`phasescope` with no command: it runs `top`, and takes `top`'s options.

The NVML hint ("... or run with --source host to watch the host only") is printed by the bare command too,
and `phasescope --source host` / `phasescope --once` used to fail with "No such option".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope import __version__
from phasescope.cli import main


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))  # no live store of this machine's


def test_the_bare_command_takes_tops_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--source", "host", "--once", "--no-classify", "--interval", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "Device / process" in out and "host · 1 device(s)" in out  # top's one table of the host
    assert main(["--source=host", "--once", "--no-classify", "--interval", "0.2"]) == 0
    assert "host · 1 device(s)" in capsys.readouterr().out


def test_the_groups_own_options_and_errors_stay(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"phasescope, version {__version__}"
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Commands:" in out and "phasescope --once" in out
    assert main(["--bogus"]) == 2  # top's options are the only others: top says what it does not know
    err = capsys.readouterr().err
    assert "No such option '--bogus'" in err and "phasescope top --help" in err
    assert main(["nope"]) == 2
    assert "No such command 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "line"), [
    (["classify"], "phasescope classify: Missing argument 'PATHS...' (see 'phasescope classify --help')"),
    (["top", "--bogus"], "phasescope top: No such option '--bogus' (see 'phasescope top --help')"),
    (["nope"], "phasescope: No such command 'nope' (see 'phasescope --help')"),
])
def test_a_usage_error_is_one_line_with_the_hint(argv: list[str], line: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """click's own block is four lines (Usage, Try, a blank, Error); one line says the same."""
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"
