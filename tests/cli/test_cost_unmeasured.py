"""`phasescope cost energy` on a log without any power or energy reading: the energy is unknown (null / –),
never 0 J, as in `report`, `serve` and `phasescope.measure`; the time price still applies."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from phasescope.cli import cli

# A real llama.cpp server's nvidia-smi log: utilisation and memory, no power column.
NO_POWER = "formats/nvidia-smi-csv-noheader/dst915__llama.cpp__gpu_stats.csv"


def _run(*args: str) -> str:
    result = CliRunner().invoke(cli, ["cost", "energy", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_json_energy_is_null_not_zero(shared_data: Path) -> None:
    out = _run(str(shared_data / NO_POWER), "--json", "--price-gpu-hour", "2")
    rows = [json.loads(x) for x in out.splitlines()]
    assert rows
    for row in rows:
        assert row["method"] == "none" and row["covered_s"] == 0
        assert row["joules"] is None and row["kwh"] is None
        assert row["phases"] and all(p["joules"] is None and p["kwh"] is None for p in row["phases"].values())
        assert row["cost"]["energy_usd"] is None and row["cost"]["time_usd"] > 0


def test_text_shows_a_dash_not_zero_joules(shared_data: Path) -> None:
    out = _run(str(shared_data / NO_POWER), "--price-gpu-hour", "2")
    assert "– J (– kWh)  method none" in out
    assert " 0 J" not in out and "0.0000 kWh" not in out
