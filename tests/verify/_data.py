"""Real traces the verify tests share (read from ../shared/data, cut to their labelled spans)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from phasescope.classify.model import PhaseModel
from phasescope.schema import Trace
from phasescope.sources.replay import read

# path, gpu index, labelled span (labels.csv)
DUTY_SHAPING = (
    "sensorguard-rtx3090/20260830T145308Z_dev-duty_shaping_node1-gpu1_r01/nvml.csv",
    1,
    91405.962,
    91578.596,
)
INFERENCE_CONTROL = (
    "sensorguard-rtx3090/20260830T151044Z_dev-inference_control_node1-gpu4_r01/nvml.csv",
    4,
    92460.688,
    92643.489,
)
IDLE = ("sensorguard-rtx3090/20260825_idle_verifier-gpu0_s2_r03/nvml.csv", 0, 79178.716, 79471.004)
A100_TRAIN = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"
T4_SCRAPE = "formats/dcgm-exporter-prom/cncf__k8s-ai-conformance__ericsson-ccd_accelerator_metrics.prom"


@lru_cache(maxsize=8)
def _read(path: str) -> tuple[Trace, ...]:
    return tuple(read(path))


def labelled(shared: Path, spec: tuple[str, int, float, float], gpu_model: str = "RTX3090") -> Trace:
    """The labelled span of one device, with the GPU model labels.csv names (as `eval` sees it)."""
    path, idx, lo, hi = spec
    t = next(t for t in _read(str(shared / path)) if t.meta.get("gpu_index", t.device.index) == idx)
    cut = t.slice_time(lo, hi)
    cut.meta["gpu_model"] = gpu_model
    return cut


@lru_cache(maxsize=1)
def model() -> PhaseModel:
    return PhaseModel.load()
