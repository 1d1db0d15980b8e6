"""Inference KPIs from the hook timeline: request latency, requests/s, batch size, and generation loops.

A *request* is one outermost module call, except inside a generation loop, where it is the whole loop.
A generation loop is a run of forwards of one module on token IDs where each call either feeds a sequence
one token longer than the last (no KV cache) or, after a prefill of more than one token, feeds one token at a
time (KV cache) with the same batch size; it needs at least MIN_GENERATION_CALLS calls (a prefill and
two decode steps), so that a batch loop with lengths that happen to differ by one is not taken for one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phasescope.instrument import events as ev
from phasescope.instrument.timeline import F64, I64, Timeline

MIN_GENERATION_CALLS = 3


def _pct(values: F64, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def generation_runs(root: I64, seq: F64, batch: F64, token: np.ndarray) -> I64:
    """Label each forward (time order) with a generation-run id, or -1 when it is not part of one."""
    n = root.size
    run = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return run
    same = (root[1:] == root[:-1]) & token[1:] & token[:-1] & (batch[1:] == batch[:-1])
    grow = same & (seq[:-1] > 1) & (seq[1:] == seq[:-1] + 1)
    decode = same & (seq[1:] == 1)
    link = grow | decode
    # A decode chain must start from a prefill longer than one token.
    start = np.flatnonzero(np.concatenate(([True], ~link)))
    end = np.concatenate((start[1:], [n]))
    rid = 0
    for s, e in zip(start, end, strict=True):
        if e - s < MIN_GENERATION_CALLS:
            continue
        if seq[s] <= 1 and not grow[s:e - 1].all():
            continue
        run[s:e] = rid
        rid += 1
    return run


def inference_kpis(tl: Timeline) -> dict[str, Any] | None:
    """KPIs of the inference part of one process, or None if it served no inference forwards."""
    m = tl.inference_mask
    if not m.any():
        return None
    t0, t1 = tl.f_t0[m], tl.f_t1[m]
    batch, seq = tl.f_batch[m], tl.f_seq[m]
    token = (tl.f_flags[m] & ev.TOKEN_INPUT) != 0
    inf_time = sum(s.end - s.start for s in tl.segments if s.phase == "inference")
    runs = generation_runs(tl.f_root[m], seq, batch, token)
    in_gen = runs >= 0
    # Requests: each generation loop, plus each forward outside one.
    n_gen = int(runs.max()) + 1 if in_gen.any() else 0
    req_lat = list((t1 - t0)[~in_gen])
    out: dict[str, Any] = {"forwards": int(m.sum())}
    if n_gen:
        g_start = np.full(n_gen, np.inf)
        g_end = np.full(n_gen, -np.inf)
        np.minimum.at(g_start, runs[in_gen], t0[in_gen])
        np.maximum.at(g_end, runs[in_gen], t1[in_gen])
        ttft = np.full(n_gen, np.nan)
        ends = t1[in_gen]
        rr = runs[in_gen]
        is_first = np.concatenate(([True], rr[1:] != rr[:-1]))
        ttft[rr[is_first]] = ends[is_first] - g_start[rr[is_first]]
        itl = np.diff(ends)[~is_first[1:]]
        gen_tokens = float(batch[in_gen].sum())  # one new token per sequence per call
        gen_time = float(np.sum(g_end - g_start))
        req_lat += list(g_end - g_start)
        out["generation"] = {
            "loops": n_gen,
            "tokens": gen_tokens,
            "ttft_p50_s": _pct(ttft, 50),
            "ttft_p95_s": _pct(ttft, 95),
            "inter_token_latency_p50_s": _pct(itl, 50),
            "inter_token_latency_p95_s": _pct(itl, 95),
            "tokens_per_s": gen_tokens / gen_time if gen_time > 0 else None,
        }
    lat = np.asarray(req_lat, dtype=np.float64)
    n_req = int(lat.size)
    out.update({
        "requests": n_req,
        "time_s": inf_time,
        "requests_per_s": n_req / inf_time if inf_time > 0 else None,
        "latency_p50_s": _pct(lat, 50),
        "latency_p95_s": _pct(lat, 95),
        "latency_p99_s": _pct(lat, 99),
        "batch_size_mean": float(batch.mean()),
        "batch_size_p50": float(np.median(batch)),
        "samples_per_s": float(batch[~in_gen].sum()) / inf_time if inf_time > 0 and (~in_gen).any() else None,
    })
    return out
