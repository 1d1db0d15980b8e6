"""Inference KPIs: request latency and rate, and generation loops told apart from batch loops."""

from __future__ import annotations

import numpy as np
import pytest

from phasescope.instrument import events as ev
from phasescope.instrument.timeline import build
from phasescope.kpi.inference import generation_runs, inference_kpis


def _runs(seq: list[int], batch: int = 1, root: int = 0) -> list[int]:
    n = len(seq)
    return generation_runs(np.full(n, root), np.array(seq, float), np.full(n, float(batch)),
                           np.ones(n, bool)).tolist()


def test_growing_sequence_is_a_generation() -> None:
    assert _runs([5, 6, 7, 8, 3, 4, 5]) == [0, 0, 0, 0, 1, 1, 1]


def test_kv_cache_pattern_is_a_generation() -> None:
    assert _runs([12, 1, 1, 1, 9, 1, 1]) == [0, 0, 0, 0, 1, 1, 1]


def test_batch_loops_are_not_generations() -> None:
    assert _runs([128] * 6) == [-1] * 6  # fixed-length batches
    assert _runs([1] * 6) == [-1] * 6  # single-token inputs with no prefill
    assert _runs([7, 8, 30, 12, 13, 40]) == [-1] * 6  # two chance +1 pairs are not a loop
    assert _runs([12, 1, 1, 1, 2, 3]) == [0, 0, 0, 0, -1, -1]  # a 2-token prefill after decoding is new


def _requests(latencies: list[float], gap: float, batch: int = 4) -> ev.ProcessEvents:
    rows, t = [], 50.0
    for i, lat in enumerate(latencies):
        rows.append([ev.FWD, t, 0, i, batch, 0, ev.INFERENCE_MODE, t + lat])
        t += lat + gap
    meta = {"roots": [{"name": "M", "mode_sensitive_layers": []}]}
    return ev.ProcessEvents(1, np.array(rows, float), 0.0, meta)


def test_latency_percentiles_and_rate() -> None:
    lats = [0.01 * (i + 1) for i in range(100)]
    tl = build(_requests(lats, gap=0.0))
    k = inference_kpis(tl)
    assert k is not None
    assert k["requests"] == 100 and k["forwards"] == 100
    assert k["latency_p50_s"] == pytest.approx(np.percentile(lats, 50))
    assert k["latency_p95_s"] == pytest.approx(0.9505)  # rank 0.95 x 99 = 94.05 of 0.01 ... 1.00
    assert k["latency_p99_s"] == pytest.approx(np.percentile(lats, 99))
    assert k["requests_per_s"] == pytest.approx(100 / sum(lats))
    assert k["batch_size_mean"] == 4
    assert "generation" not in k


def test_generation_loop_latencies_and_token_rate() -> None:
    """Two loops (batch 2), 1 s apart: a 0.5 s prefill of 12 tokens, then three 0.1 s one-token steps."""
    rows, t, i = [], 50.0, 0
    flags = ev.INFERENCE_MODE | ev.TOKEN_INPUT
    for _ in range(2):
        for seq, dur in ((12, 0.5), (1, 0.1), (1, 0.1), (1, 0.1)):
            rows.append([ev.FWD, t, 0, i, 2, seq, flags, t + dur])
            t, i = t + dur, i + 1
        t += 1.0
    meta = {"roots": [{"name": "M", "mode_sensitive_layers": []}]}
    k = inference_kpis(build(ev.ProcessEvents(1, np.array(rows, float), 0.0, meta)))
    assert k is not None
    g = k["generation"]
    assert g["loops"] == 2 and g["tokens"] == 16  # 4 calls x batch 2, per loop
    assert g["ttft_p50_s"] == pytest.approx(0.5) and g["ttft_p95_s"] == pytest.approx(0.5)
    # Only gaps inside a loop are inter-token latencies, not the second after a loop ends.
    assert g["inter_token_latency_p50_s"] == pytest.approx(0.1)
    assert g["inter_token_latency_p95_s"] == pytest.approx(0.1)
    assert g["tokens_per_s"] == pytest.approx(16 / 1.6)  # over the loops' own time, not the pauses
    assert k["requests"] == 2 and k["latency_p50_s"] == pytest.approx(0.8)
