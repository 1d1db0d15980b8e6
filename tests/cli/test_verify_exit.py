"""`phasescope verify` exit codes for FLOP budgets: the run total decides, and --strict makes doubt fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasescope.cli import main


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def h100_scrape(tmp_path: Path) -> Path:
    """Four minutes of a busy H100 as dcgm-exporter reports it (tensor pipes 50% active), one sample/s.

    Its FLOP band is about 5.9e16 (lower) .. 2.5e17 (upper); each 2-minute window holds half of it."""
    lab = 'UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3",gpu="0",Hostname="n1"'
    fields = (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.5), ("DCGM_FI_DEV_GPU_UTIL", 95),
              ("DCGM_FI_DEV_SM_CLOCK", 1980), ("DCGM_FI_DEV_POWER_USAGE", 600),
              ("DCGM_FI_DEV_FB_USED", 60000), ("DCGM_FI_DEV_MEM_COPY_UTIL", 40))
    lines = [f"{f}{{{lab}}} {v} {1_700_000_000_000 + i * 1000}" for i in range(240) for f, v in fields]
    p = tmp_path / "h100.prom"
    p.write_text("\n".join(lines) + "\n")
    return p


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict], str]:
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(x) for x in out.splitlines() if x.startswith("{")], err


def test_run_total_over_the_flop_budget_fails_even_when_no_window_does(
    h100_scrape: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--declare", "max-flop=4e16", "--json", "--window", "120", "--input", str(h100_scrape)]
    code, objs, err = run(args, capsys)
    *verdicts, summary = objs
    assert len(verdicts) == 2 and all(v["flop"]["lower"] < 4e16 for v in verdicts)
    assert summary["summary"]["inconsistent"] == 0  # no window alone proves the budget exceeded
    assert code == 1 and "inconsistent" in err


def test_strict_makes_an_undetermined_budget_fail(
    h100_scrape: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--declare", "max-flop=1e17", "--json", "--input", str(h100_scrape)]  # inside the FLOP band
    code, objs, _ = run(args, capsys)
    assert code == 0 and objs[-1]["summary"]["unverifiable"] == 1
    code, _, err = run([*args, "--strict"], capsys)
    assert code == 3 and "could not be verified" in err
