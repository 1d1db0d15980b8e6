"""Inference KPIs of a serving engine from one scrape (since start) or two (the window between them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from phasescope.sources.scrape.engines import EngineMetrics, detect_engines
from phasescope.sources.scrape.parse import Histogram, Scrape

QUANTILES = (0.5, 0.95, 0.99)


def histogram_quantile(h: Histogram, q: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket holding rank q; None without observations.

    A rank in the +Inf bucket answers the highest finite bound (all we know is "above it").
    """
    total = float(h.counts[-1]) if h.counts.size else 0.0
    if total <= 0 or not 0 <= q <= 1:
        return None
    rank = q * total
    i = int(np.searchsorted(h.counts, rank, side="left"))
    i = min(i, h.counts.size - 1)
    upper = float(h.bounds[i])
    if not np.isfinite(upper):
        finite = h.bounds[np.isfinite(h.bounds)]
        return float(finite[-1]) if finite.size else None
    lower = float(h.bounds[i - 1]) if i > 0 else min(0.0, upper)
    below = float(h.counts[i - 1]) if i > 0 else 0.0
    in_bucket = float(h.counts[i]) - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def _dist(h: Histogram | None, scale: float) -> dict[str, float | None] | None:
    if h is None or h.counts[-1] <= 0:
        return None
    out: dict[str, float | None] = {}
    for q in QUANTILES:
        v = histogram_quantile(h, q)
        out[f"p{round(q * 100)}"] = None if v is None else v * scale
    out["mean"] = h.sum / h.total * scale if h.total > 0 else None
    out["count"] = float(h.total)
    return out


def _first_hist(cur: Scrape, prev: Scrape | None, names: tuple[str, ...]) -> Histogram | None:
    for name in names:
        h = cur.histogram(name)
        if h is not None:
            ph = prev.histogram(name) if prev is not None else None
            return h - ph if ph is not None else h
    return None


def _delta(cur: float | None, prev: float | None) -> float | None:
    if cur is None:
        return None
    if prev is None:
        return cur
    return cur - prev if cur >= prev else cur  # a restart reset the counter


def _hist_sum(s: Scrape | None, name: str | None) -> float | None:
    if s is None or name is None:
        return None
    h = s.histogram(name)
    return None if h is None else h.sum


def _restarted(cur: Scrape, prev: Scrape) -> bool:
    """The server restarted between the scrapes (its process start time moved: vLLM and other Python servers
    export it). A counter that has since climbed past its old value looks like a small increase otherwise."""
    a, b = cur.value("process_start_time_seconds"), prev.value("process_start_time_seconds")
    return a is not None and b is not None and a != b


def _models(s: Scrape, e: EngineMetrics) -> list[str]:
    if not e.model_label:
        return []
    return sorted({m for f in s.samples if f.startswith(e.prefix) for m in s.labels(f, e.model_label)})


def engine_kpis(e: EngineMetrics, cur: Scrape, prev: Scrape | None) -> dict[str, Any]:
    window = None
    if prev is not None and cur.t is not None and prev.t is not None and cur.t > prev.t:
        window = cur.t - prev.t
    else:
        prev = None  # without a time between them, two scrapes give no rate: report since start
    if prev is not None and _restarted(cur, prev):
        prev = None  # every count restarted from zero inside the window: all of cur's happened in it

    def counter(name: str | None) -> float | None:
        if name is None:
            return None
        return _delta(cur.value(name), prev.value(name) if prev is not None else None)

    def rate(v: float | None) -> float | None:
        return v / window if v is not None and window else None

    req_vals = [counter(n) for n in e.requests]
    requests = sum(v for v in req_vals if v is not None) if any(v is not None for v in req_vals) else None
    gen = counter(e.gen_tokens) if e.gen_tokens else _delta(_hist_sum(cur, e.gen_tokens_hist),
                                                            _hist_sum(prev, e.gen_tokens_hist))
    prompt = counter(e.prompt_tokens) if e.prompt_tokens else _delta(_hist_sum(cur, e.prompt_tokens_hist),
                                                                     _hist_sum(prev, e.prompt_tokens_hist))
    latency = _dist(_first_hist(cur, prev, e.latency_hist), e.hist_scale)
    if latency is None and e.latency_us_counter:  # Triton: mean from cumulative microseconds (+ summary)
        busy = counter(e.latency_us_counter)
        if busy is not None and requests:
            latency = {f"p{round(q * 100)}": None for q in QUANTILES}
            latency.update(mean=busy / requests * 1e-6, count=requests)
            for q, v in cur.quantiles(e.latency_summary or "").items():
                if q in QUANTILES:
                    latency[f"p{round(q * 100)}"] = v * 1e-6
    batch = None
    if e.inferences and e.executions:
        n_inf, n_exec = counter(e.inferences), counter(e.executions)
        batch = n_inf / n_exec if n_inf is not None and n_exec else None
    kv = next((cur.value(n) for n in e.kv_cache if cur.has(n)), None)
    n_kv = next((len(cur.samples[n]) for n in e.kv_cache if cur.has(n)), 1)
    return {
        "engine": e.name,
        "endpoint": cur.where,
        "models": _models(cur, e),
        "basis": "window" if window else "since start",
        "window_s": window,
        "requests": requests,
        "requests_per_s": rate(requests),
        "latency_s": latency,
        "ttft_s": _dist(_first_hist(cur, prev, e.ttft_hist), e.ttft_scale),
        "inter_token_s": _dist(_first_hist(cur, prev, e.itl_hist), e.hist_scale),
        "generated_tokens": gen,
        "tokens_per_s": rate(gen),
        "prompt_tokens": prompt,
        "prompt_tokens_per_s": rate(prompt),
        "running": cur.value(e.running) if e.running else None,
        "waiting": cur.value(e.waiting) if e.waiting else None,
        "batch_size_mean": batch,
        "kv_cache_usage": kv / n_kv if kv is not None else None,
    }


def server_kpis(cur: Scrape, prev: Scrape | None = None) -> list[dict[str, Any]]:
    """KPIs of every serving engine found in `cur`; with `prev` (an earlier scrape of the same endpoint)
    counts, rates and percentiles cover only the window between the two."""
    return [engine_kpis(e, cur, prev) for e in detect_engines(cur)]
