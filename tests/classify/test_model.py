"""The shipped phase model on real traces: right answers, missing signals, unknowns, file round trip."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel, WindowPredictions
from phasescope.errors import InputError
from phasescope.schema import PHASES, Trace
from phasescope.sources.replay import read


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


def _trace(shared_data: Path, rel: str, gpu: int, span: tuple[float, float] | None) -> Trace:
    tr = next(t for t in read(str(shared_data / rel)) if t.meta.get("gpu_index", t.device.index) == gpu)
    return tr.slice_time(*span) if span else tr


TRAIN = (
    "sensorguard-rtx3090/20260825_train_gpt2_wikitext_verifier-gpu0_s2_r03/nvml.csv",
    0,
    (76880.509, 77480.46),
)
INFER = ("sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01/nvml.csv", 0, (84081.178, 84680.883))


def _majority(p: WindowPredictions) -> str:
    return Counter(p.labels).most_common(1)[0][0]


def test_clear_training_run(model: PhaseModel, shared_data: Path) -> None:
    p = model.predict_trace(_trace(shared_data, *TRAIN), evidence=True)
    assert _majority(p) == "training"
    assert Counter(p.labels)["training"] >= 0.9 * len(p)
    assert p.proba.shape == (len(p), len(PHASES))
    assert np.allclose(np.nansum(p.proba, axis=1), 1.0)
    assert p.missing_signals == [] and p.model_version == model.version
    assert all(len(e) > 0 for e in p.evidence)


def test_clear_inference_run(model: PhaseModel, shared_data: Path) -> None:
    p = model.predict_trace(_trace(shared_data, *INFER))
    assert Counter(p.labels)["inference"] >= 0.9 * len(p)


def test_idle_bystander(model: PhaseModel, shared_data: Path) -> None:
    p = model.predict_trace(_trace(shared_data, TRAIN[0], 1, None))
    assert _majority(p) == "idle"


def test_pcie_removed_still_answers(model: PhaseModel, shared_data: Path) -> None:
    tr = _trace(shared_data, *TRAIN).without("pcie_tx", "pcie_rx")
    p = model.predict_trace(tr)
    assert p.missing_signals == ["pcie_tx", "pcie_rx"]
    assert p.subset == "no_pcie"
    assert _majority(p) == "training"


def test_nvidia_smi_default_signals(model: PhaseModel, shared_data: Path) -> None:
    tr = _trace(shared_data, *TRAIN)
    only = tr.without(*[s for s in tr.columns if s not in ("power", "gpu_util", "mem_used")])
    p = model.predict_trace(only)
    assert p.subset == "smi_default"
    assert set(p.missing_signals) == {
        "mem_util",
        "temperature",
        "sm_clock",
        "mem_clock",
        "pcie_tx",
        "pcie_rx",
    }


def test_one_signal_or_coarse_rate_is_unknown(model: PhaseModel, shared_data: Path) -> None:
    tr = _trace(shared_data, *TRAIN)
    p = model.predict_trace(tr.without(*[s for s in tr.columns if s != "gpu_util"]))
    assert set(p.labels) == {"unknown"} and np.isnan(p.proba).all()
    coarse = tr.take(np.arange(0, len(tr), 60))  # one sample per minute
    p = model.predict_trace(coarse)
    assert set(p.labels) == {"unknown"} and "outside" in p.reasons[0]


def test_alibaba_pods_are_never_called_training(model: PhaseModel, shared_data: Path) -> None:
    traces = read(str(shared_data / "alibaba-gentd26/pod_gpu_duty_cycle_anon.csv"))[:5]
    for t in traces:
        assert "training" not in model.predict_trace(t, evidence=False).labels


def test_round_trip(model: PhaseModel, shared_data: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    model.save(path)
    again = PhaseModel.load(str(path))
    tr = _trace(shared_data, *INFER)
    a, b = model.predict_trace(tr), again.predict_trace(tr)
    assert again.version == model.version
    np.testing.assert_allclose(a.proba, b.proba)
    assert a.labels == b.labels


def test_bad_model_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="JSON"):
        PhaseModel.load(str(bad))
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(InputError, match="format"):
        PhaseModel.load(str(bad))
    with pytest.raises(InputError, match="no such file"):
        PhaseModel.load(str(tmp_path / "missing.json"))
    doc = PhaseModel.load().to_dict()
    doc["submodels"][0]["booster"] = "garbage"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="LightGBM"):
        PhaseModel.load(str(bad))


def test_model_card_is_shipped(model: PhaseModel) -> None:
    card = model.card
    assert card["version"] == model.version
    assert card["training_data"]["runs_by_source"]["sensorguard"] > 10
    assert "evaluation" in card and 0 < card["evaluation"]["run_accuracy"] <= 1


def test_labels_and_reasons_follow_the_probabilities(model: PhaseModel, shared_data: Path) -> None:
    """Each judged window is its best phase when that reaches min_proba, else unknown with the reason."""
    from phasescope.classify.model import UnknownRules

    trace = _trace(shared_data, *TRAIN)
    # A threshold at the median confidence on this trace, so that both branches are exercised.
    mid = float(np.nanmedian(np.nanmax(model.predict_trace(trace, evidence=False).proba, axis=1)))
    strict = PhaseModel(model.version, model.config, UnknownRules(min_proba=mid), model.submodels, model.card)
    for m in (model, strict):
        p = m.predict_trace(trace, evidence=False)
        rows = np.flatnonzero(np.isfinite(p.proba).all(axis=1))
        assert rows.size > 30
        for i in rows:
            best = float(p.proba[i].max())
            if "unlike any training example" in p.reasons[i]:  # the range check, tested in test_calibration
                assert p.labels[i] == "unknown"
            elif best >= m.rules.min_proba:
                assert p.labels[i] == PHASES[int(p.proba[i].argmax())] and p.reasons[i] == ""
            else:
                assert p.labels[i] == "unknown"
                # The phases within half the best probability are named: the ones it could be.
                assert p.reasons[i].endswith(f"best probability {best:.2f} < {m.rules.min_proba}")
                near = [c for c in PHASES if p.proba[i, PHASES.index(c)] >= 0.5 * best]
                assert p.reasons[i].startswith("could be ") == (len(near) > 1)
    assert "unknown" in p.labels and "training" in p.labels  # the strict rules exercise both branches


def test_too_fine_a_rate_is_unknown(model: PhaseModel, shared_data: Path) -> None:
    tr = _trace(shared_data, *TRAIN)
    fine = Trace(tr.device, tr.time[0] + (tr.time - tr.time[0]) / 100, tr.columns, tr.meta)  # 100 Hz
    p = model.predict_trace(fine, evidence=False)
    assert set(p.labels) == {"unknown"} and np.isnan(p.proba).all() and "outside" in p.reasons[0]


def test_windows_inside_a_telemetry_gap_are_not_judged(model: PhaseModel, shared_data: Path) -> None:
    tr = _trace(shared_data, *TRAIN)
    t = tr.time
    gap = (t > t[0] + 200) & (t < t[0] + 400)  # every signal lost for 200 s
    holed = Trace(tr.device, t, {k: np.where(gap, np.nan, v) for k, v in tr.columns.items()}, tr.meta)
    p = model.predict_trace(holed, evidence=False)
    inside = (p.start >= t[0] + 200) & (p.end <= t[0] + 400)
    assert inside.sum() >= 5
    assert np.isnan(p.proba[inside]).all()
    assert {(p.labels[i], p.reasons[i]) for i in np.flatnonzero(inside)} == {
        ("unknown", "too little data in window")
    }
    assert "training" in [p.labels[i] for i in np.flatnonzero(~inside)]


def test_evidence_is_towards_the_called_phase(model: PhaseModel, shared_data: Path) -> None:
    """On an inference run, each window's evidence is LightGBM's SHAP for the phase it was called."""
    from phasescope.features import FEATURE_NAMES, window_features

    tr = _trace(shared_data, *INFER)
    p = model.predict_trace(tr, evidence=True)
    sub = next(s for s in model.submodels if s.name == p.subset)
    x = window_features(tr, model.config).values[:, [FEATURE_NAMES.index(f) for f in sub.features]]
    contrib = np.asarray(sub.booster.predict(x, pred_contrib=True)).reshape(len(x), len(PHASES), -1)
    called = [i for i, label in enumerate(p.labels) if label == "inference"]
    assert len(called) > 10
    for i in called:
        for feature, value in p.evidence[i].items():
            want = contrib[i, PHASES.index("inference"), sub.features.index(feature)]
            assert value == pytest.approx(want, abs=1e-4)
