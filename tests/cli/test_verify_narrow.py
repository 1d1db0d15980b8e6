"""The verdict table keeps the whole reason in an 80-column terminal (or a pipe, which rich treats as 80):
it folds the `why` column instead of cutting its lines at the edge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasescope.cli import main

TRAIN = "spar-a100/bert_sst2_amp_NVIDIA_A100_SXM4_40GB_90abf7ca_20260309_182528.parquet"


def test_reason_is_whole_at_80_columns(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    main(["verify", "--declare", "no-training", "--input", str(shared_data / TRAIN), "--json"])
    lines = capsys.readouterr().out.splitlines()
    reasons = [r for line in lines if line.startswith('{"device"') for r in json.loads(line)["reasons"]]
    assert reasons
    main(["verify", "--declare", "no-training", "--input", str(shared_data / TRAIN)])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    table = out.split("model ")[0]  # the rows, before the assurance paragraph
    header, *rows = table.splitlines()
    at = header.index("why")
    why = "".join(line[at:] for line in rows)  # the `why` column, folded over the lines
    assert "".join("; ".join(reasons).split()) in "".join(why.split())
