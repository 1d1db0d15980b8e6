"""Real traces the NVML source tests replay through the fake NVML."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope.schema import Trace
from phasescope.sources.replay import read

SENSORGUARD_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
SPAR_RUN = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"


@pytest.fixture(scope="module")
def sg_traces(shared_data: Path) -> list[Trace]:
    traces = read(shared_data / SENSORGUARD_RUN)
    assert len(traces) == 2
    return traces


@pytest.fixture(scope="module")
def spar_trace(shared_data: Path) -> Trace:
    (trace,) = read(shared_data / SPAR_RUN)
    return trace
