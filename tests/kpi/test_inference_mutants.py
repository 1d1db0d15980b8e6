"""Inference KPIs, behaviours a mutation audit found untested: what ends a generation loop, which forwards
count as samples, percentiles over many loops, and the time a request rate is taken over.

Loop structure comes from real (small) PyTorch models under the hooks; timing from hand-built event logs,
whose expected values are worked out by hand below.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from phasescope.instrument import events as ev
from phasescope.instrument.timeline import build
from phasescope.kpi.inference import inference_kpis
from tests.instrument.test_hooks import recording, timeline

TOKENS = ev.INFERENCE_MODE | ev.TOKEN_INPUT
META = {"roots": [{"name": "M", "mode_sensitive_layers": []}]}


def _lm() -> nn.Sequential:
    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))


def test_a_different_module_ends_a_generation_loop() -> None:
    """One model reads a 12-token prompt, another is then fed one token at a time: no KV-cache loop (the
    single-token calls of the second model have no prefill of their own)."""
    encoder, decoder = _lm(), _lm()
    with recording() as rec, torch.inference_mode():
        encoder(torch.randint(0, 50, (2, 12)))
        for _ in range(3):
            decoder(torch.randint(0, 50, (2, 1)))
    k = inference_kpis(timeline(rec))
    assert k is not None
    assert "generation" not in k
    assert k["requests"] == 4 and k["forwards"] == 4


def test_a_batch_size_change_ends_a_generation_loop() -> None:
    """A batch-2 loop with one decode step, then single-token calls of batch 4: two short runs, no loop."""
    model = _lm()
    with recording() as rec, torch.inference_mode():
        model(torch.randint(0, 50, (2, 12)))
        model(torch.randint(0, 50, (2, 1)))
        model(torch.randint(0, 50, (4, 1)))
        model(torch.randint(0, 50, (4, 1)))
    k = inference_kpis(timeline(rec))
    assert k is not None
    assert "generation" not in k
    assert k["requests"] == 4


def test_a_real_kv_cache_loop_is_one_request() -> None:
    """The positive case of the two above, on the same model: prefill then three one-token steps."""
    model = _lm()
    with recording() as rec, torch.inference_mode():
        model(torch.randint(0, 50, (2, 12)))
        for _ in range(3):
            model(torch.randint(0, 50, (2, 1)))
    k = inference_kpis(timeline(rec))
    assert k is not None
    assert k["generation"]["loops"] == 1 and k["generation"]["tokens"] == 8
    assert k["requests"] == 1


def _pe(rows: list[list[float]]) -> ev.ProcessEvents:
    return ev.ProcessEvents(1, np.array(rows, float), 0.0, META)


def test_samples_per_s_counts_only_forwards_outside_generation_loops() -> None:
    """Three 0.5 s batch-4 requests, then a batch-2 loop (0.5 s prefill, three 0.1 s steps), back to back
    from t=50: 2.3 s of inference; the loop's tokens are not samples."""
    rows, t, i = [], 50.0, 0
    for _ in range(3):
        rows.append([ev.FWD, t, 0, i, 4, 0, ev.INFERENCE_MODE, t + 0.5])
        t, i = t + 0.5, i + 1
    for seq, dur in ((12, 0.5), (1, 0.1), (1, 0.1), (1, 0.1)):
        rows.append([ev.FWD, t, 0, i, 2, seq, TOKENS, t + dur])
        t, i = t + dur, i + 1
    k = inference_kpis(build(_pe(rows)))
    assert k is not None
    assert k["time_s"] == pytest.approx(2.3)
    assert k["requests"] == 4  # three plain requests and one loop
    assert k["requests_per_s"] == pytest.approx(4 / 2.3)
    assert k["samples_per_s"] == pytest.approx(12 / 2.3)  # 3 x batch 4
    assert k["generation"]["tokens"] == 8


def test_batch_size_median_and_mean_of_uneven_batches() -> None:
    rows = [[ev.FWD, 50.0 + j, 0, j, b, 0, ev.INFERENCE_MODE, 50.5 + j] for j, b in enumerate([1, 1, 1, 9])]
    k = inference_kpis(build(_pe(rows)))
    assert k is not None
    assert k["batch_size_p50"] == 1
    assert k["batch_size_mean"] == 3


def test_ttft_and_inter_token_percentiles_over_many_loops() -> None:
    """Ten loops k = 1..10: a 0.1 k s prefill, then steps of 0.01 k, 0.02 k and 0.05 k s, 1 s apart."""
    rows, t, i = [], 50.0, 0
    for k in range(1, 11):
        for seq, dur in ((8, 0.1 * k), (1, 0.01 * k), (1, 0.02 * k), (1, 0.05 * k)):
            rows.append([ev.FWD, t, 0, i, 1, seq, TOKENS, t + dur])
            t, i = t + dur, i + 1
        t += 1.0
    g = inference_kpis(build(_pe(rows)))["generation"]  # type: ignore[index]
    assert g["loops"] == 10
    # TTFT 0.1 .. 1.0: p50 at rank 4.5 -> 0.55; p95 at rank 8.55 -> 0.9 + 0.55 x 0.1.
    assert g["ttft_p50_s"] == pytest.approx(0.55)
    assert g["ttft_p95_s"] == pytest.approx(0.955)
    # 30 step times; sorted, the top four are 0.35 (0.05 x 7), 0.40, 0.45, 0.50. p95 at rank 0.95 x 29 =
    # 27.55 -> 0.40 + 0.55 x 0.05; the next lower ones are 0.30 (0.05 x 6) and 0.20 (0.02 x 10).
    assert g["inter_token_latency_p95_s"] == pytest.approx(0.4275)
    steps = sorted(c * k for k in range(1, 11) for c in (0.01, 0.02, 0.05))
    assert steps[-4:] == pytest.approx([0.35, 0.40, 0.45, 0.50])
    assert g["inter_token_latency_p50_s"] == pytest.approx((steps[14] + steps[15]) / 2)


def test_request_rate_is_over_inference_time_only() -> None:
    """One training step (t=100 .. 102.5), then four 0.5 s requests at 105 .. 108: 3.5 s of inference."""
    trained = ev.GRAD_ENABLED | ev.MODULE_TRAINING | ev.HAS_GRAPH
    rows = [
        [ev.FWD, 100.0, 0, 0, 8, 0, trained, 101.0],
        [ev.BWD_BEGIN, 101.0, 0, 0, 0, 0, 0, 0], [ev.BWD_FWD, 101.0, 0, 0, 0, 0, 0, 0],
        [ev.BWD_END, 102.0, 0, 0, 0, 0, 0, 0],
        [ev.OPT_BEGIN, 102.0, 0, 0, 0, 0, 0, 0], [ev.OPT_END, 102.5, 0, 0, 0, 0, 0, 0],
    ]
    rows += [[ev.FWD, 105.0 + j, 0, 1 + j, 4, 0, ev.INFERENCE_MODE, 105.5 + j] for j in range(4)]
    tl = build(_pe(rows))
    assert [s.phase for s in tl.segments] == ["training", "inference"]
    k = inference_kpis(tl)
    assert k is not None
    assert k["time_s"] == pytest.approx(3.5)
    assert k["requests_per_s"] == pytest.approx(4 / 3.5)
    assert k["samples_per_s"] == pytest.approx(16 / 3.5)
