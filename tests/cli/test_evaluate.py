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
    # Eight families with two runs each: a new run is often unlike its family's other one, so the
    # calibrated model calls few windows; those it calls are mostly right.
    assert w["windows"] == out["windows"] and 0.2 < w["called_fraction"] <= 1
    assert 0.8 < w["accuracy_on_called"] <= 1 and w["confidently_wrong"] < 0.05
    assert set(w["per_class"]) == {"training", "inference", "other", "idle"}


def test_eval_table_with_family_split(labels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(labels), "--split", "family", "--baseline", "none"]) == 0
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


@pytest.fixture(scope="module")
def extra(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second labels table, as a site's own recordings would come: the A100 runs, `gpu` left empty."""
    import csv

    table = csv.DictReader((shared_data / "labels.csv").open())
    rows = [r for r in table if r["path"].startswith("spar-a100/")]
    out = tmp_path_factory.mktemp("extra") / "labels.csv"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["path", "label", "family", "run"])
        w.writeheader()
        for r in rows:
            w.writerow({"path": str(shared_data / r["path"]), "label": r["label"], "family": r["family"],
                        "run": r["run"]})
    return out.parent


def test_eval_extra_data_and_held_out_splits(
    labels: Path, extra: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["eval", str(labels.parent), "--extra", str(extra), "--split", "dataset", "--split", "gpu"]
    assert main([*args, "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data"] == [str(labels.parent), str(extra)]
    by_split = {r["split"]: r for r in out["results"]}
    assert by_split["dataset"]["folds"] == 2
    # The extra table has no `gpu` column: the device's own name stands in, so the A100 is its own fold.
    assert by_split["gpu"]["folds"] == 2
    fams = by_split["dataset"]["model"]["families"]
    assert fams["gpt2_wikitext2_amp"]["examples"] == 2 and fams["infer_bert"]["examples"] >= 2


def test_eval_progress_lines_on_a_pipe(labels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(labels), "-k", "3", "--split", "run", "--baseline", "none"]) == 0
    err = capsys.readouterr().err
    assert "window features for" in err and err.count("run fold") == 3


@pytest.mark.parametrize("command", ["eval", "train-model"])
@pytest.mark.parametrize("k", ["0", "1"])
def test_fewer_than_two_folds_is_one_line(
    command: str, k: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-k 0 divided by zero and -k 1 left no run to train on; both are refused before any data is read."""
    extra = ["-o", str(tmp_path / "m.json")] if command == "train-model" else []
    assert main([command, str(tmp_path / "nothing-here"), "-k", k, *extra]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '-k'" in err and "Traceback" not in err
    assert not (tmp_path / "m.json").exists()


def test_train_model_into_a_missing_folder_fails_before_the_fit(
    labels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output folder is checked first: it used to be a FileNotFoundError traceback after the fit."""
    out = tmp_path / "no-such-folder" / "m.json"
    assert main(["train-model", str(labels.parent), "-o", str(out), "--no-evaluate", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "m.json: output: expected a file in an existing directory" in err and "Traceback" not in err
    assert "fitted" not in err


def test_eval_json_is_strict_json(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Figures that do not exist for this data (recall of a class with no example) are null, as in every
    other --json, not NaN, which JSON does not have (JSON.parse, Go and serde reject it)."""
    import csv

    from tests.classify._subset import write_labels

    rows = [r for r in csv.DictReader((shared_data / "labels.csv").open(newline=""))
            if r["family"] == "duty_shaping"][:3]  # training only: the other classes have no example
    labels = write_labels(rows, shared_data, tmp_path / "labels.csv")
    assert main(["eval", str(labels), "-k", "2", "--json", "--quiet"]) == 0

    def no_nan(name: str) -> None:
        raise AssertionError(f"{name} in --json output")

    out = json.loads(capsys.readouterr().out, parse_constant=no_nan)
    assert out["results"][0]["model"]["window"]["per_class"]["inference"]["recall"] is None


def test_a_leave_one_out_split_with_one_group_is_refused(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--split dataset` on one labels table held that table out with nothing left to fit on, and printed a
    table of dashes with exit 0; it is one line naming the split instead."""
    import csv

    from tests.classify._subset import write_labels

    rows = [r for r in csv.DictReader((shared_data / "labels.csv").open(newline=""))
            if r["family"] == "duty_shaping"][:2]
    labels = write_labels(rows, shared_data, tmp_path / "labels.csv")
    assert main(["eval", str(labels), "--split", "dataset", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--split dataset: expected at least two groups to hold out in turn" in err
    assert err.count("\n") == 1


def test_train_model_with_one_phase_writes_no_empty_model(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Labels of one phase only fit no booster; the model used to be written anyway (exit 0, "submodels":
    []) and then called every window unknown ("too few signals")."""
    import csv

    from tests.classify._subset import write_labels

    rows = [r for r in csv.DictReader((shared_data / "labels.csv").open(newline=""))
            if r["family"] == "duty_shaping"][:3]
    labels = write_labels(rows, shared_data, tmp_path / "labels.csv")
    out = tmp_path / "m.json"
    assert main(["train-model", str(labels), "-o", str(out), "--no-evaluate", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "labels: expected judged windows (50 or more) of at least two phases" in err
    assert "of training" in err and not out.exists()
