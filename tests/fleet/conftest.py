"""Real labelled traces shared by the fleet unit tests (loaded once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fleet.harness import labelled_trace

from phasescope.classify.model import PhaseModel
from phasescope.schema import DeviceInfo, Trace

SPANS = {
    "training": ("sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv", 0),
    "inference": ("sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01/nvml.csv", 0),
    "idle": ("sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv", 1),
}


@pytest.fixture(scope="session")
def fleet_traces(shared_data: Path) -> dict[str, Trace]:
    """label -> its real trace (labelled span), re-identified as GPU-<label> on host node-<label>."""
    out = {}
    for label, (path, gpu) in SPANS.items():
        t, _ = labelled_trace(shared_data, path, gpu)
        dev = DeviceInfo(f"GPU-{label}", "NVIDIA GeForce RTX 3090", gpu, f"node-{label}")
        out[label] = Trace(dev, t.time, t.columns, t.meta)
    return out


@pytest.fixture(scope="session")
def model() -> PhaseModel:
    return PhaseModel.load()
