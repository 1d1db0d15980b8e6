"""`check_spec`: a malformed --source is refused before any work starts, a usable one never is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from phasescope.errors import InputError
from phasescope.sources.open import check_spec


@pytest.mark.parametrize("fmt", ["x", "auto:gpus=8", "nvidia-smi-csv:bogus"])
def test_a_replay_format_no_reader_takes_is_refused(tmp_path: Path, fmt: str) -> None:
    """`format=x` used to pass the check and only fail on the sampler thread, as a note after the run."""
    rec = tmp_path / "rec.csv"
    rec.write_text("timestamp,power\n")
    with pytest.raises(InputError, match=r"format|option"):
        check_spec(f"replay:{rec}?format={fmt}")


@pytest.mark.parametrize("fmt", ["auto", "sensorguard", "SensorGuard", "nvidia-smi-csv:gpus=8"])
def test_a_known_replay_format_passes(tmp_path: Path, fmt: str) -> None:
    rec = tmp_path / "rec.csv"
    rec.write_text("timestamp,power\n")
    check_spec(f"replay:{rec}?format={fmt}")


@pytest.mark.parametrize("spec", ["auto", "nvml", "host", " AUTO "])
def test_live_kinds_pass_without_opening_anything(spec: str) -> None:
    """`nvml` on a machine without NVML is not refused here: that is a note after the run, not a typo."""
    check_spec(spec)


def test_run_refuses_an_unknown_replay_format_before_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phasescope.cli import main

    rec = tmp_path / "rec.csv"
    rec.write_text("timestamp,power\n")
    marker = tmp_path / "ran"
    args = ["run", "--source", f"replay:{rec}?format=x", "--report", "-", "--", sys.executable, "-c",
            f"open({str(marker)!r}, 'w')"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "format" in err and len(err.strip().splitlines()) == 1 and not marker.exists()
