"""The numpy evaluation of the boosters (`model.Forest`) gives LightGBM's own scores and probabilities,
to the last bit: for every submodel of the shipped model on thousands of real windows, and for boosters
trained here with the rules the shipped ones do not use (zero as missing, one-vs-all, a random forest).
`classify` then runs without importing LightGBM (nor scikit-learn and SciPy, which it pulls in)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phasescope.classify.model import Forest, PhaseModel, Submodel, _columns
from phasescope.features import window_features
from phasescope.schema import PHASES
from phasescope.sources.replay import read

lgb = pytest.importorskip("lightgbm")

RUNS = (
    "sensorguard-rtx3090/20260825_train_gpt2_wikitext_verifier-gpu0_s2_r03",
    "sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01",
    "sensorguard-rtx3090/20260825_idle_verifier-gpu0_s2_r03",
    "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r02",
    "nvidia-smi-h100-training/ckpt1.csv",
    "spar-a100/blender_bmw_NVIDIA_A100_SXM4_40GB_6f9cd9b4_20260309_183828.parquet",
)


@pytest.fixture(scope="module")
def windows(shared_data: Path) -> np.ndarray:
    """Feature rows of every window of the runs' traces at 1 s and 5 s strides (NaN where a signal is
    missing): more than one evaluation block."""
    from dataclasses import replace

    model = PhaseModel.load()
    rows = []
    for run in RUNS:
        for tr in read(shared_data / run):
            for stride in (1.0, 5.0):
                rows.append(window_features(tr, replace(model.config, stride_s=stride)).values)
    x = np.concatenate(rows)
    assert x.shape[0] > 2000
    return x


def _models() -> list[tuple[str, Submodel]]:
    model = PhaseModel.load()
    subs = [(f"{s.name}", s) for s in model.submodels]
    if model.coarse is not None:
        subs += [(f"coarse-{s.name}", s) for s in model.coarse.submodels]
    return subs


@pytest.mark.parametrize("name", [n for n, _ in _models()])
def test_each_shipped_booster_scores_as_lightgbm(windows: np.ndarray, name: str) -> None:
    sub = dict(_models())[name]
    x = windows[:, _columns(sub.features)]
    booster = lgb.Booster(model_str=sub.booster_text)
    forest = Forest.from_text(sub.booster_text)
    raw = np.asarray(booster.predict(x, raw_score=True, num_threads=1)).reshape(len(x), len(PHASES))
    proba = np.asarray(booster.predict(x, num_threads=1)).reshape(len(x), len(PHASES))
    assert np.array_equal(forest.raw(x), raw)
    assert np.array_equal(forest.predict(x), proba)


@pytest.mark.parametrize(
    "params",
    [
        {"objective": "multiclass", "zero_as_missing": True},
        {"objective": "multiclassova"},
        {"objective": "multiclass", "boosting": "rf", "bagging_freq": 1, "bagging_fraction": 0.7},
        {"objective": "multiclass", "num_leaves": 31, "use_missing": False},
    ],
    ids=["zero-as-missing", "one-vs-all", "random-forest", "no-missing-rule"],
)
def test_boosters_trained_with_other_rules_score_as_lightgbm(
    windows: np.ndarray, params: dict[str, Any]
) -> None:
    """Trained here on the real windows (labels: the shipped model's calls), with rules for zeros and
    NaN, objectives and averaging the shipped model does not use."""
    model = PhaseModel.load()
    sub = model.submodels[0]
    x = windows[:, _columns(sub.features)]
    y = np.nan_to_num(sub.predict(x)).argmax(axis=1)
    x = np.where(np.arange(x.shape[1]) % 3 == 0, np.nan_to_num(x), x)  # zeros where NaN, in some columns
    booster = lgb.train({"num_class": len(PHASES), "num_leaves": 8, "verbose": -1, "num_threads": 1,
                         "seed": 0, **params}, lgb.Dataset(x, y), num_boost_round=12)
    forest = Forest.from_text(booster.model_to_string())
    want = np.asarray(booster.predict(x, num_threads=1)).reshape(len(x), len(PHASES))
    assert np.array_equal(forest.predict(x), want)


def test_classify_does_not_import_lightgbm(shared_data: Path, tmp_path: Path) -> None:
    """A whole `classify` run in a fresh interpreter: the answer, and no LightGBM, scikit-learn or SciPy."""
    run = shared_data / RUNS[0]
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('imported:', sorted(m for m in ('lightgbm', 'sklearn', 'scipy')"
        " if m in sys.modules), file=sys.stderr))\n"
        "from phasescope.cli import main\n"
        f"sys.argv = ['phasescope', 'classify', '--json', {str(run)!r}]\n"
        "sys.exit(main())\n"
    )
    (tmp_path / "empty.toml").write_text("")  # no user config changes the run
    env = {**os.environ, "PHASESCOPE_CONFIG": str(tmp_path / "empty.toml")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert '"label": "training"' in out.stdout
    assert "imported: []" in out.stderr


def test_a_large_call_goes_to_lightgbm_with_the_same_answer(
    windows: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above FOREST_MAX_ROWS windows per call, and from then on, LightGBM walks the trees (faster per
    window, once imported): the same probabilities."""
    from phasescope.classify import model as model_module

    sub = PhaseModel.load().submodels[0]
    small = sub.predict_raw(windows)
    monkeypatch.setattr(model_module, "FOREST_MAX_ROWS", 10)
    assert sub._booster is None  # not parsed (nor LightGBM needed) for the numpy walk
    assert np.array_equal(sub.predict_raw(windows), small) and sub._booster is not None
    monkeypatch.setattr(model_module, "FOREST_MAX_ROWS", 10**9)
    assert np.array_equal(sub.predict_raw(windows[:5]), small[:5])  # LightGBM now that it is parsed
