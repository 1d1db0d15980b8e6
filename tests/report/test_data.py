"""What the report computes, on real recordings: segments and their evidence, KPIs, energy and cost."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify import decide
from phasescope.classify.model import PhaseModel
from phasescope.features import FEATURE_NAMES
from phasescope.kpi.cost import Prices
from phasescope.report import build
from phasescope.report.data import segment_evidence
from phasescope.sources.replay import read
from tests.live_helpers import TRAINING_RUN

SPAR_RENDER = "spar-a100/blender_bmw_NVIDIA_A100_SXM4_40GB_6f9cd9b4_20260309_183828.parquet"


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


def test_training_run_segments_evidence_energy_cost(shared_data: Path, model: PhaseModel) -> None:
    path = str(shared_data / TRAINING_RUN)
    traces = read(path)
    data = build([(path, traces)], model=model, prices=Prices(usd_per_gpu_hour=2.0, usd_per_kwh=0.1))
    train, idle = data.devices
    # labels.csv: GPU 0 trains GPT-2, GPU 1 idles beside it.
    assert train.label == "training" and idle.label == "idle"
    assert 0.5 < train.confidence <= 1.0
    # The segments are the decider's own, on the same predictions.
    own = decide.segments(model.predict_trace(traces[0]))
    assert [s.label for s in train.segments] == [s.label for s in own]
    assert len(train.evidence) == len(train.segments)
    seg_i = next(i for i, s in enumerate(train.segments) if s.label == "training")
    ev = train.evidence[seg_i]
    assert 0 < len(ev) <= 5 and all(fw.feature in FEATURE_NAMES for fw in ev)
    assert abs(ev[0].weight) == max(abs(fw.weight) for fw in ev)  # ranked by size
    # Energy: per phase sums to the device total; cost = time x rate + kWh x rate.
    e = train.energy
    assert sum(p.joules for p in e.phases_or_whole().values()) == pytest.approx(e.joules)
    assert e.method == "integrated_power" and e.joules > 0  # this log has power, no energy counter
    assert train.cost.time_usd == pytest.approx(e.span_s / 3600 * 2.0)
    assert train.cost.energy_usd == pytest.approx(e.kwh * 0.1)
    # Per-phase KPIs: the training stretch is busier and hungrier than the whole-trace average on GPU 0.
    assert train.phase_stats["training"]["util_mean"] > train.stats["util_mean"] * 0.99
    totals = data.phase_totals()
    assert totals["training"][1] == pytest.approx(
        sum(d.energy.phases.get("training").joules for d in data.devices if "training" in d.energy.phases)
    )


def test_evidence_is_the_mean_contribution_over_the_segment(shared_data: Path, model: PhaseModel) -> None:
    """Recompute one segment's evidence by hand from the window contributions."""
    trace = read(shared_data / TRAINING_RUN)[0]
    pred = model.predict_trace(trace, evidence=True)
    seg = max(decide.segments(pred), key=lambda s: s.duration)
    centre = (pred.start + pred.end) / 2
    within = np.flatnonzero((centre >= seg.start) & (centre <= seg.end))
    inside = [i for i in within if pred.labels[i] == seg.label]
    top = segment_evidence(pred, seg)[0]
    expect = sum(pred.evidence[i].get(top.feature, 0.0) for i in inside) / len(inside)
    assert top.weight == pytest.approx(expect)


def test_without_a_model_the_report_still_has_energy(shared_data: Path) -> None:
    path = str(shared_data / SPAR_RENDER)
    data = build([(path, read(path))], model=None, model_note="classifier not available (test)")
    d = data.devices[0]
    assert d.segments == [] and d.label == "unknown" and math.isnan(d.confidence)
    assert d.energy.joules > 0 and d.cost.total_usd is None  # no price set: not priced, not free
    assert data.model_note.startswith("classifier not available")
