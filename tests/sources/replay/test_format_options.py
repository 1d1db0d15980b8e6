"""A malformed reader option is one clear error, whether or not this file needs that option."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope.cli import main
from phasescope.sources.replay import read
from tests.sources.replay.conftest import expect_input_error

# A clock and a uuid in every row: this file needs neither `interval` nor `gpus`.
SMI_CSV = (
    "timestamp, index, uuid, utilization.gpu [%], power.draw [W]\n"
    "2024/01/04 10:00:00.000, 0, GPU-aaaa-1, 50, 100.0\n"
    "2024/01/04 10:00:01.000, 0, GPU-aaaa-1, 60, 110.0\n"
)
DMON_WITH_TIME = (
    "formats/nvidia-smi-dmon/XueSongTap__XueSongTap.github.io__2024-01-04-nvidia-smi-more_dmon-mutc-TD.txt"
)
PROM_WITH_TIMESTAMPS = (
    'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaaa-1"} 100.0 1700000000000\n'
    'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaaa-1"} 110.0 1700000030000\n'
)


@pytest.fixture
def smi_csv(write) -> Path:  # type: ignore[no-untyped-def]
    return write("q.csv", SMI_CSV)


def test_the_file_needs_no_option(smi_csv: Path) -> None:
    (plain,) = read(smi_csv, "nvidia-smi-csv")
    assert plain.device.uuid == "GPU-aaaa-1" and plain.meta["clock"] == "unix"
    # Well-formed options it does not need change nothing.
    (same,) = read(smi_csv, "nvidia-smi-csv:gpus=2;interval=5")
    assert same.time.tolist() == plain.time.tolist() and same.device == plain.device


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("gpus=x", "expected a whole number, got 'x'"),
        ("gpus=0", "expected a whole number >= 1, got '0'"),
        ("gpus=1.5", "expected a whole number, got '1.5'"),
        ("interval=abc", "expected a number, got 'abc'"),
        ("interval=0", "expected a positive number, got '0'"),
        ("interval=nan", "expected a positive number, got 'nan'"),
        ("interval=", "expected a number, got ''"),
        ("columns= , ", "expected a comma-separated list of field names"),
    ],
)
def test_malformed_option_is_an_error_where_the_file_does_not_need_it(
    smi_csv: Path, option: str, expected: str
) -> None:
    key = option.split("=")[0]
    expect_input_error(
        read, smi_csv, f"nvidia-smi-csv:{option}", match=(str(smi_csv), f"option {key}", expected)
    )


def test_dmon_and_dcgm_check_interval_even_with_a_clock_in_the_file(shared_data: Path, write) -> None:  # type: ignore[no-untyped-def]
    dmon = shared_data / DMON_WITH_TIME
    assert read(dmon, "nvidia-smi-dmon")[0].meta["clock"] != "sweep"
    expect_input_error(read, dmon, "nvidia-smi-dmon:interval=x", match=(str(dmon), "option interval", "'x'"))
    prom = write("m.prom", PROM_WITH_TIMESTAMPS)
    assert read(prom, "dcgm-prom")[0].meta["clock"] == "unix"
    expect_input_error(read, prom, "dcgm-prom:interval=-3", match=(str(prom), "option interval", "positive"))


def test_an_option_given_twice_is_an_error(smi_csv: Path) -> None:
    expect_input_error(
        read, smi_csv, "nvidia-smi-csv:gpus=1;gpus=2",
        match=("nvidia-smi-csv:gpus=1;gpus=2", "option 'gpus'", "each option once", "gpus=1; gpus=2"),
    )


def test_the_cli_says_it_in_one_line(smi_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fmt = "nvidia-smi-csv:interval=2s"
    assert main(["cost", "energy", str(smi_csv), "--no-phases", "--format", fmt]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "option interval" in err and "expected a number" in err and "'2s'" in err
