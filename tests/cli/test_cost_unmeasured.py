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


def _dropout_csv(path: Path) -> Path:
    """A metered GPU (power column) whose two readings are a minute apart: too far to bridge, so no second
    of its span has energy data (method integrated_power, coverage 0)."""
    rows = ["timestamp, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]"]
    for i in range(60):
        power = "300.00 W" if i in (0, 59) else "[N/A]"
        rows.append(f"2024/01/16 14:44:{i:02d}.000, 90 %, 1000 MiB, 80000 MiB, {power}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_metered_gpu_without_a_covered_second_has_an_unknown_energy_cost(tmp_path: Path) -> None:
    """Its joules were null but its energy cost was $0.00 (device_cost asked only whether the file had a
    power column), while its one phase's cost was null: the whole and its parts disagreed."""
    path = _dropout_csv(tmp_path / "dropout.csv")
    out = _run(str(path), "--no-phases", "--json", "--price-kwh", "0.12")
    [row] = [json.loads(x) for x in out.splitlines()]
    assert row["method"] == "integrated_power" and row["covered_s"] == 0
    assert row["joules"] is None
    assert row["cost"]["energy_usd"] is None  # was 0.0
    # --no-phases: the whole span is not judged, "unknown" (once "unsegmented"; one word in every view)
    assert set(row["phase_costs"]) == {"unknown"} and row["phase_costs"]["unknown"]["energy_usd"] is None
    text = _run(str(path), "--no-phases", "--price-kwh", "0.12", "--price-gpu-hour", "2")
    assert "– J (– kWh)" in text and "energy $0.00" not in text
