"""`phasescope run --source`: 'none' is read as the other kinds are (any case, spaces around)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from phasescope.cli.run import command


def test_source_none_in_any_case_watches_nothing_and_runs_the_command(tmp_path: Path) -> None:
    # 'NVML' and ' host ' are taken; 'NONE' was refused as an unknown source before the command ran.
    out = tmp_path / "run.json"
    result = CliRunner().invoke(command, ["--source", " NONE ", "--report", "-", "--json", str(out), "--",
                                          sys.executable, "-c", "pass"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["telemetry"] == {"source": "none", "devices": []}
