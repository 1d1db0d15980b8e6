"""Calibration, the range check that says "unlike the training data", and the reliability figures.

The out-of-distribution test is real: a model fitted without one source (vLLM serving on an A100-80GB, a
GPU model, workload and traffic the rest of the data lacks) must not guess on it."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.lab import train
from phasescope.classify.lab.dataset import load_examples
from phasescope.classify.model import Calibration, PhaseModel, calibrate
from phasescope.errors import InputError
from phasescope.schema import PHASES
from tests.classify._subset import write_subset

VLLM = "grantwilkins/powertrace-sim"


@pytest.fixture(scope="module")
def table(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> train.WindowTable:
    """The small SensorGuard subset plus every vLLM serving trace."""
    d = tmp_path_factory.mktemp("calib")
    base = list(csv.DictReader(write_subset(shared_data, d).open(newline="")))
    vllm = [r for r in csv.DictReader((shared_data / "labels.csv").open(newline="")) if r["source"] == VLLM]
    for r in vllm:
        r["path"] = str(shared_data / r["path"])
    labels = d / "both.csv"
    with labels.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(base[0]))
        w.writeheader()
        w.writerows(base + vllm)
    return train.build_table(load_examples(labels))


def _split(table: train.WindowTable) -> tuple[np.ndarray, np.ndarray]:
    held = np.array([e.source == VLLM for e in table.examples])
    return np.flatnonzero(~held), np.flatnonzero(held)


def test_a_source_never_seen_is_unknown_with_a_reason(table: train.WindowTable) -> None:
    fit_on, held = _split(table)
    assert held.size >= 10 and fit_on.size >= 15
    model = train.fit_model(table, fit_on, subsets=["no_pcie"])
    sub = model.submodels[0]
    assert sub.calibration is not None and sub.calibration.temperature > 0
    rows = table.rows(held, (1,))
    rows = rows[table.sufficient[rows] & (table.y[rows] == PHASES.index("inference"))]
    _, called, reasons = sub.judge(table.X[rows], model.rules.min_proba)
    # Served at ~90% memory and an A100's power: no training window was near that operating point.
    unlike = [r for r in reasons if "unlike any training example" in r]
    assert (called < 0).mean() >= 0.9 and len(unlike) >= 0.8 * rows.size
    assert any("memory use" in r for r in unlike)
    # Without the range check the same boosters call those windows: it is the check that abstains.
    bare = PhaseModel(model.version, model.config, model.rules,
                      [train.Submodel(sub.name, sub.signals, sub.features, sub.booster, sub.booster_text)])
    _, bare_called, _ = bare.submodels[0].judge(table.X[rows], model.rules.min_proba)
    assert (bare_called >= 0).mean() >= 0.5


def test_familiar_windows_are_still_called(table: train.WindowTable) -> None:
    fit_on, _ = _split(table)
    model = train.fit_model(table, fit_on, subsets=["no_pcie"])
    rows = table.rows(fit_on, (1,))
    rows = rows[table.sufficient[rows]]
    _, called, _ = model.submodels[0].judge(table.X[rows], model.rules.min_proba)
    assert (called >= 0).mean() >= 0.8
    assert (called[called >= 0] == table.y[rows][called >= 0]).mean() >= 0.95


def test_calibration_round_trips_and_a_bad_one_is_refused(table: train.WindowTable, tmp_path: Path) -> None:
    model = train.fit_model(table, np.arange(len(table.examples)), subsets=["no_pcie"])  # two sources
    path = tmp_path / "m.json"
    model.save(path)
    again = PhaseModel.load(str(path))
    a, b = model.submodels[0].calibration, again.submodels[0].calibration
    assert a is not None and b is not None
    assert b.temperature == a.temperature and np.allclose(b.low, a.low, equal_nan=True)
    assert b.familiar_temperature == a.familiar_temperature is not None
    import json

    doc = json.loads(path.read_text())
    doc["submodels"][0]["calibration"]["low"] = [0.0]  # one range for many features
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="calibration"):
        PhaseModel.load(str(path))
    doc["submodels"][0]["calibration"] = dict(a.to_dict(), temperature=-1.0)
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="temperature"):
        PhaseModel.load(str(path))


def test_temperature_flattens_an_over_confident_booster() -> None:
    rng = np.random.default_rng(0)
    n = 2000
    y = rng.integers(0, 4, n)
    right = rng.random(n) < 0.7  # 70% right, but always 0.97 sure
    best = np.where(right, y, (y + 1) % 4)
    raw = np.full((n, 4), 0.01)
    raw[np.arange(n), best] = 0.97
    t = train._fit_temperature(raw, y, np.ones(n))
    assert t > 1.5
    p = calibrate(raw, t)
    assert abs(float(p.max(axis=1).mean()) - 0.7) < 0.05
    assert np.allclose(calibrate(raw, 1.0), raw)


def test_reliability_figures_by_hand() -> None:
    y = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 3])
    proba = np.full((10, 4), 0.0)
    proba[:, 0] = 0.9  # every window says class 0 at 0.9
    proba[:, 1] = 0.1
    labels = np.zeros(10, dtype=np.int64)
    labels[-1] = -1  # one unknown
    r = train.reliability(proba, labels, y)
    assert r["ece"] == pytest.approx(abs(0.4 - 0.9))  # one bin: 4 of 10 right at confidence 0.9
    assert r["confidently_wrong"] == pytest.approx(5 / 10)  # 6 wrong, one of them not called
    levels = {c["level"]: c for c in r["coverage_accuracy"]}
    assert levels[0.9]["coverage"] == 1.0 and levels[0.9]["accuracy"] == pytest.approx(0.4)
    assert levels[0.95]["coverage"] == 0.0


def test_power_above_the_limit_is_named() -> None:
    feats = ("power_frac_mean", "power_frac_p90", "util_mean")
    sub = train.Submodel("t", ("power", "gpu_util"), feats, None, "",
                         Calibration(1.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    from phasescope.features import FEATURE_NAMES

    x = np.full((2, len(FEATURE_NAMES)), np.nan)
    x[:, FEATURE_NAMES.index("util_mean")] = 0.5
    x[:, FEATURE_NAMES.index("power_frac_mean")] = [0.5, 1.05]
    x[:, FEATURE_NAMES.index("power_frac_p90")] = [0.6, 1.4]
    reasons = sub._outside(x, sub.calibration)  # type: ignore[arg-type]
    assert reasons[0] == "" and "power above this GPU's limit" in reasons[1]


def test_a_window_where_no_kernel_ran_is_never_unfamiliar(table: train.WindowTable) -> None:
    """Zero utilisation all window long is idle on any GPU: a memory level never seen (a model held on
    an 80 GB board) must not turn it unknown, while the same level on a busy window does."""
    from phasescope.features import FEATURE_NAMES

    fit_on, _ = _split(table)
    model = train.fit_model(table, fit_on, subsets=["no_pcie"])
    sub = model.submodels[0]
    rows = table.rows(fit_on, (1,))
    rows = rows[table.sufficient[rows]]
    util_max = table.X[rows, FEATURE_NAMES.index("util_max")]
    idle = table.X[rows[util_max == 0][:5]].copy()
    busy = table.X[rows[util_max > 0.5][:5]].copy()
    assert len(idle) == 5 and len(busy) == 5
    for x in (idle, busy):
        x[:, FEATURE_NAMES.index("mem_frac")] = 0.97  # far above any training window's
    _, idle_called, idle_why = sub.judge(idle, model.rules.min_proba)
    _, busy_called, busy_why = sub.judge(busy, model.rules.min_proba)
    assert all("unlike any training example" in w for w in busy_why) and (busy_called < 0).all()
    assert not any("unlike" in w for w in idle_why)
    assert (idle_called == PHASES.index("idle")).all()


def test_familiar_windows_take_the_familiar_temperature(table: train.WindowTable) -> None:
    """A window inside every training range is a new run of a known source (temperature from held-out
    runs); one with any feature outside is treated as a new source (temperature from held-out sources)."""
    every = np.arange(len(table.examples))
    model = train.fit_model(table, every, subsets=["no_pcie"])
    sub = model.submodels[0]
    cal = sub.calibration
    assert cal is not None and cal.familiar_temperature is not None
    assert set(cal.groups) == {"sensorguard", VLLM}  # each source held out in turn
    # With one source there is no new-source situation to fit: one temperature, from held-out runs.
    fit_on, _ = _split(table)
    one = train.fit_model(table, fit_on, subsets=["no_pcie"]).submodels[0].calibration
    assert one is not None and one.familiar_temperature is None and one.groups == ("3 folds of whole runs",)
    rows = table.rows(every, (1,))
    rows = rows[table.sufficient[rows]]
    cols = [train.FEATURE_NAMES.index(f) for f in sub.features]
    lo, hi = np.asarray(cal.low), np.asarray(cal.high)
    x = table.X[rows]
    xs = x[:, cols]
    inside = ~(np.isfinite(xs) & ((xs < lo) | (xs > hi))).any(axis=1)
    assert inside.any() and (~inside).any()
    raw = sub.predict_raw(x)
    got = sub.predict(x)
    assert np.allclose(got[inside], calibrate(raw[inside], cal.familiar_temperature))
    assert np.allclose(got[~inside], calibrate(raw[~inside], cal.temperature))
