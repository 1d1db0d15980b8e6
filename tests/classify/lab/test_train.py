"""Fitting and grouped evaluation on a small real subset: no run leaks, sane figures, the baseline runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.lab import train
from phasescope.classify.lab.dataset import load_examples
from phasescope.classify.model import PhaseModel
from phasescope.schema import PHASES
from tests.classify._subset import write_subset


@pytest.fixture(scope="module")
def table(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> train.WindowTable:
    labels = write_subset(shared_data, tmp_path_factory.mktemp("subset"))
    return train.build_table(load_examples(labels))


@pytest.mark.parametrize("split", ["run", "family", "source", "gpu"])
def test_folds_never_share_a_run(table: train.WindowTable, split: str) -> None:
    runs = np.array([e.run for e in table.examples])
    for _, tr, te in train.folds(table.examples, split, k=3):
        assert not set(runs[tr]) & set(runs[te])


def test_limit_dropout_copies(table: train.WindowTable) -> None:
    assert set(np.unique(table.copy)) == {0, 1}
    assert (table.copy == 1).sum() == (table.copy == 0).sum()


def test_run_grouped_cv_and_baseline(table: train.WindowTable) -> None:
    pred = train.cross_validate(table, "run", k=3)
    m = train.metrics(table, pred)
    rows = pred.cat()[0]
    assert (table.copy[rows] == 1).all() and np.unique(rows).size == rows.size
    assert m["window"]["windows"] == (table.copy == 1).sum()
    assert m["window"]["called_fraction"] > 0.2 and 0.8 < m["window"]["accuracy_on_called"] <= 1.0
    assert 0 <= m["window"]["ece"] <= 1 and len(m["window"]["coverage_accuracy"]) == len(train.RISK_LEVELS)
    # Without calibration the boosters call (nearly) everything, and idle stays easy.
    raw = train.metrics(table, train.cross_validate(
        table, "run", k=3, fitter=lambda t, tr, _: train.fit_model(t, tr, calibrated=False)))
    assert raw["window"]["accuracy"] > 0.5 and raw["window"]["per_class"]["idle"]["recall"] > 0.9
    conf = np.array(m["window"]["confusion"]["counts"])
    assert conf.sum() == m["window"]["windows"] and conf.shape == (len(PHASES), len(PHASES) + 1)
    base = train.metrics(table, train.baseline_cv(table, "run", k=3, n_trees=20))
    assert base["window"]["windows"] == m["window"]["windows"]
    assert "duty_shaping" in m["evasion_detection"]["by_family"]


def test_fit_save_load_predict(table: train.WindowTable, tmp_path: Path) -> None:
    model = train.fit_model(table, subsets=["all9", "smi_default"])
    model.card = train.model_card(table, None, 0.0)
    path = tmp_path / "m.json"
    model.save(path)
    loaded = PhaseModel.load(str(path))
    assert [s.name for s in loaded.submodels] == ["all9", "smi_default"]
    ex = next(e for e in table.examples if e.family == "train_gpt2_wikitext")
    p = loaded.predict_trace(ex.trace)
    assert p.labels.count("training") > len(p) / 2


def test_run_folds_spread_each_family(table: train.WindowTable) -> None:
    """Runs are dealt family by family: a family with k runs has one run in each fold's test side."""
    k = 2
    fam = {e.run: train.run_family(table.examples, e.run) for e in table.examples}
    for _, _tr, te in train.folds(table.examples, "run", k=k):
        test_runs = {table.examples[i].run for i in te}
        for f in set(fam.values()):
            n = sum(1 for r in set(fam) if fam[r] == f)
            held = sum(1 for r in test_runs if fam[r] == f)
            assert n // k <= held <= -(-n // k), (f, n, held)


def test_headline_figures(table: train.WindowTable) -> None:
    m = train.metrics(table, train.cross_validate(table, "run", k=2))
    h = train.headline(m)
    assert h["window_accuracy"] == m["window"]["accuracy"] and h["run_accuracy"] == m["run"]["accuracy"]
    assert set(h) == {"window_accuracy", "window_balanced_accuracy", "training_recall", "training_fpr",
                      "run_accuracy", "evasion_detected"}
