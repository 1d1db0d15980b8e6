"""Turn real recorded traces into the TickBatches a live source would have produced (for view tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from phasescope.schema import SIGNAL_NAMES, TickBatch, Trace
from phasescope.sources.replay import read

TRAINING_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"


def training_traces(shared_data: Path) -> list[Trace]:
    """A real 2-GPU RTX 3090 recording: GPU 0 trains GPT-2, GPU 1 idles beside it."""
    return read(shared_data / TRAINING_RUN)


def ticks(traces: list[Trace], start: int = 0, stop: int | None = None) -> Iterator[TickBatch]:
    """Row i of every trace becomes tick i (the file samples all GPUs in the same tick)."""
    n = min(len(t) for t in traces) if stop is None else stop
    table = np.stack([np.stack([t[s] for s in SIGNAL_NAMES], axis=1) for t in traces], axis=1)
    devices = [t.device for t in traces]
    for i in range(start, n):
        yield TickBatch(float(traces[0].time[i]), devices, table[i].copy())
