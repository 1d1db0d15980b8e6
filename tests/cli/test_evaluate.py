"""`phasescope eval` and `phasescope train-model` end to end on a small real subset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasescope.classify.model import PhaseModel
from phasescope.cli import main
from tests.classify._subset import write_subset


@pytest.fixture(scope="module")
def labels(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_subset(shared_data, tmp_path_factory.mktemp("evalsubset"))


def test_eval_json(labels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(labels.parent), "--split", "run", "-k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    res = out["results"][0]
    assert res["split"] == "run" and res["folds"] == 3
    w = res["model"]["window"]
    assert w["windows"] == out["windows"] and 0.5 < w["accuracy"] <= 1
    assert set(w["per_class"]) == {"training", "inference", "other", "idle"}


def test_eval_table_with_family_split(labels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(labels), "--split", "family"]) == 0
    text = capsys.readouterr().out
    assert "split: family" in text and "window accuracy" in text and "confusion (phasescope)" in text
    assert "duty_shaping" in text


def test_train_model_writes_a_loadable_model(
    labels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "site.json"
    assert main(["train-model", str(labels), "-o", str(out), "--no-evaluate"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["output"] == str(out)
    m = PhaseModel.load(str(out))
    assert m.card["training_data"]["runs_by_source"] == {"sensorguard": len({r for r in _runs(labels)})}


def _runs(labels: Path) -> set[str]:
    import csv

    return {r["run"] for r in csv.DictReader(labels.open())}


def test_bad_data_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "labels.csv" in err and "Traceback" not in err
