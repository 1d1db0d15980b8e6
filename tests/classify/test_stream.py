"""Long traces are featurised chunk by chunk (features.CHUNK_POINTS grid points at a time, windows
overlapping the seams cut from both sides): the windows, and so every verdict, are the same to the last
bit as from one pass over the whole trace. Checked on real runs joined into one trace with real gaps,
with chunks so small that every segment boundary and unknown window lies near a seam."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope import features
from phasescope.classify import verdict
from phasescope.classify.model import PhaseModel
from phasescope.features import window_features
from phasescope.schema import SIGNAL_NAMES, Trace
from phasescope.sources.replay import read

RUNS = (  # training, idle, inference, memory copies: segments of several phases
    "sensorguard-rtx3090/20260825_train_gpt2_wikitext_verifier-gpu0_s2_r03",
    "sensorguard-rtx3090/20260825_idle_verifier-gpu0_s2_r03",
    "sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01",
    "sensorguard-rtx3090/20260825_hpc_memcpy_verifier-gpu0_s2_r03",
)
WHOLE = 1 << 40  # grid points per chunk: one chunk for any trace


def _joined(shared_data: Path, holes: bool) -> Trace:
    """The runs' GPU 0 traces one after another (7 s apart); with `holes`, samples dropped in places
    (a poller that missed ticks: windows with gaps and windows with too little data), memory readings
    dropped over a longer span (a signal missing where the others are not) and memory-controller
    activity scaled up over another (an operating point no training window had)."""
    parts = [next(t for t in read(shared_data / r) if t.device.index == 0) for r in RUNS]
    times, cols, at = [], {s: [] for s in SIGNAL_NAMES}, 0.0
    for p in parts:
        times.append(p.time - p.time[0] + at)
        at = float(times[-1][-1]) + 7.0
        for s in SIGNAL_NAMES:
            cols[s].append(p[s])
    time = np.concatenate(times)
    values = {s: np.concatenate(v) for s, v in cols.items()}
    keep = np.ones(time.size, dtype=bool)
    if holes:
        n = time.size
        keep[n // 7 : n // 7 + 25] = False  # a 25 s hole: one window without enough data
        keep[n // 3 :: 11] = False  # every 11th sample missing over the rest
        values["mem_used"][n // 2 : n // 2 + 300] = np.nan
        # Memory-controller activity far above the run's for 4 minutes: the range check's unknowns.
        span = slice(n // 20, n // 20 + 240)
        values["mem_util"][span] = np.minimum(1.0, 4.0 * values["mem_util"][span])
    return Trace(parts[0].device, time[keep], {s: v[keep] for s, v in values.items()}, parts[0].meta)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


@pytest.mark.parametrize("holes", [False, True], ids=["whole", "with-holes"])
@pytest.mark.parametrize("chunk", [16, 37, 301])
def test_chunked_windows_are_the_whole_traces(shared_data: Path, holes: bool, chunk: int) -> None:
    tr = _joined(shared_data, holes)
    one = window_features(tr, chunk_points=WHOLE)
    cut = window_features(tr, chunk_points=chunk)
    assert len(one.start) > 100 and chunk < 3 * len(one.start)  # many seams
    for name in ("start", "end", "values", "n_samples", "sufficient"):
        assert _same(getattr(one, name), getattr(cut, name)), name
    if holes:  # the masked code paths, not only the gap-free fast ones, went through the seams
        assert not one.sufficient.all() and np.isnan(one.column("mem_gib")).any()


def test_a_streamed_verdict_is_the_one_pass_verdict(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments, labels, probabilities and unknown reasons (too little data, unlike the training data,
    low confidence) all come out the same when each chunk holds two windows."""
    model = PhaseModel.load()
    tr = _joined(shared_data, holes=True)
    monkeypatch.setattr(features, "CHUNK_POINTS", WHOLE)
    one = verdict.build(tr, model)
    monkeypatch.setattr(features, "CHUNK_POINTS", 37)  # 2 windows of 30 s every 15 s per chunk
    cut = verdict.build(tr, model)
    assert one.windows is not None and cut.windows is not None
    assert len({s.label for s in one.segments}) >= 4 and "unknown" in {s.label for s in one.segments}
    assert any("unlike any training example" in r for r in one.unknown_reasons)
    assert "too little data in window" in one.unknown_reasons
    assert _same(one.windows.proba, cut.windows.proba)
    assert one.windows.labels == cut.windows.labels and one.windows.reasons == cut.windows.reasons
    assert [s.to_dict() for s in one.segments] == [s.to_dict() for s in cut.segments]
    assert one.unknown_reasons == cut.unknown_reasons
    assert (one.label, one.confidence) == (cut.label, cut.confidence)


def test_chunk_size_is_a_whole_number_of_strides_or_more(shared_data: Path) -> None:
    """A chunk smaller than one stride still moves on by one window per chunk."""
    tr = _joined(shared_data, holes=False).slice_time(0.0, 400.0)
    assert _same(window_features(tr, chunk_points=1).values, window_features(tr, chunk_points=WHOLE).values)
