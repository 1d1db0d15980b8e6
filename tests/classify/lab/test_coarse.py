"""The coarse path: snapshots as a scraper keeps them, the model chosen from the trace's own timestamps,
and the coarse model inside the model file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.lab import train
from phasescope.classify.lab.dataset import load_examples
from phasescope.classify.model import PhaseModel
from phasescope.cli import main
from phasescope.errors import InputError
from phasescope.schema import DeviceInfo, Trace
from tests.classify._subset import write_labels, write_subset


def _trace(t: list[float], util: list[float]) -> Trace:
    return Trace(DeviceInfo(uuid="GPU-x"), np.array(t), {"gpu_util": np.array(util)}, {})


def test_snapshots_keep_the_latest_real_sample_once() -> None:
    tr = _trace([0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 40.0], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    got = train.snapshots(tr, 5.0)
    # Scrapes at 0, 5, ..., 40: the value then is the last sample at or before each; the silence
    # from 11 s to 40 s would repeat 0.5 five times, and is kept once (at the first scrape that saw it).
    assert got.time.tolist() == [0.0, 5.0, 10.0, 15.0, 40.0]
    assert got["gpu_util"].tolist() == [0.0, 0.3, 0.4, 0.5, 0.6]
    assert got.meta["snapshots_every_s"] == 5.0
    assert len(train.snapshots(_trace([], []), 5.0)) == 0


@pytest.fixture(scope="module")
def model(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> PhaseModel:
    """Fitted on the SensorGuard subset plus the long logs (H100 training, HF generation), which are what
    gives a 10-minute window enough 15 s snapshots."""
    import csv

    d = tmp_path_factory.mktemp("coarse")
    rows = list(csv.DictReader(write_subset(shared_data, d).open(newline="")))
    long = [r for r in csv.DictReader((shared_data / "labels.csv").open(newline=""))
            if r["source"] in ("grantwilkins/training_profile", "grantwilkins/energy-inference")]
    labels = write_labels([*rows, *({**r, "path": str(shared_data / r["path"])} for r in long)],
                          Path("/"), d / "with_long.csv")
    examples = load_examples(labels)
    table = train.build_table(examples)
    coarse = train.build_coarse_table(examples, (15.0,))
    assert coarse.config == train.COARSE_CONFIG and coarse.rules == train.COARSE_RULES
    assert {e.run for e in coarse.examples} <= {e.run for e in examples}  # snapshots keep their run
    return train.fit_shipped(table, coarse)


def test_the_coarse_model_is_chosen_from_the_trace_timestamps(model: PhaseModel, shared_data: Path) -> None:
    assert model.coarse is not None and model.coarse.version.endswith("+coarse")
    examples = load_examples(write_subset(shared_data, Path(__import__("tempfile").mkdtemp())))
    ex = next(e for e in examples if e.family == "train_gpt2_wikitext")
    fine = model.predict_trace(ex.trace)
    assert fine.model_version == model.version and len(fine) > 5
    coarse = model.predict_trace(train.snapshots(ex.trace, 15.0))
    assert coarse.model_version == model.coarse.version
    # One 10-minute window holds the whole ~3 min run, judged by the coarse boosters.
    assert len(coarse) == 1 and np.isfinite(coarse.proba).all()
    # Without a coarse model the same snapshots are unknown, and the reason names the interval.
    bare = PhaseModel(model.version, model.config, model.rules, model.submodels, model.card)
    p = bare.predict_trace(train.snapshots(ex.trace, 15.0))
    assert set(p.labels) == {"unknown"} and "sample interval 15s outside" in p.reasons[0]


def test_the_coarse_model_round_trips_in_the_file(model: PhaseModel, tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    model.save(path)
    again = PhaseModel.load(str(path))
    assert again.coarse is not None and again.coarse.config == train.COARSE_CONFIG
    names = [s.name for s in model.coarse.submodels]  # type: ignore[union-attr]
    assert names and [s.name for s in again.coarse.submodels] == names
    assert again.with_rules(min_proba=0.9).coarse.rules.min_proba == 0.9  # type: ignore[union-attr]
    doc = json.loads(path.read_text())
    doc["coarse"]["coarse"] = doc["coarse"].copy()  # a chain of coarse models is not a model
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="one coarse model"):
        PhaseModel.load(str(path))


def test_eval_at_a_coarse_resolution(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = write_subset(shared_data, tmp_path)
    assert main(["eval", str(labels), "--resolution", "15", "--split", "run", "-k", "3", "--baseline", "none",
                 "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["resolution"] == "15" and out["windows"] > 0
    assert out["results"][0]["model"]["window"]["windows"] == out["windows"]
