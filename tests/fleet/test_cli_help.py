"""`phasescope fleet --help` says that $PHASESCOPE_PROMETHEUS stands in for the "required" --prometheus, and
prints each example whole on one line (a wrapped example cannot be pasted)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from phasescope.cli import cli, main


def test_help_names_the_env_var_and_keeps_examples_whole() -> None:
    result = CliRunner().invoke(cli, ["fleet", "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "PHASESCOPE_PROMETHEUS" in text
    examples = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("phasescope fleet ")]
    assert examples == [
        "phasescope fleet --prometheus http://prometheus:9090 --since 1h",
        "phasescope fleet --prometheus http://thanos-query:9090 --selector '{namespace=\"ml\"}' --json",
        "phasescope fleet --prometheus http://prometheus:9090 --serve --shard 0/4 --port 9465",
    ]


def test_env_var_stands_in_for_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PHASESCOPE_PROMETHEUS", "http://127.0.0.1:9")
    assert main(["fleet", "--timeout", "2"]) == 2
    assert "http://127.0.0.1:9: cannot reach the Prometheus API" in capsys.readouterr().err
