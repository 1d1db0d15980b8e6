"""Inference servers that are not PyTorch processes: KPIs from their Prometheus /metrics (vLLM, TGI, Triton).

`fetch(url)` or `parse_text(text)` gives a `Scrape`; `server_kpis(scrape, previous)` turns one scrape
(totals and percentiles since the server started) or two (rates and percentiles over the window between
them) into requests/s, latency p50/p95/p99, time to first token, inter-token latency and tokens/s.
"""

from __future__ import annotations

from phasescope.sources.scrape.engines import ENGINES, EngineMetrics, detect_engines
from phasescope.sources.scrape.kpis import histogram_quantile, server_kpis
from phasescope.sources.scrape.parse import Histogram, Scrape, fetch, parse_text, read_file
from phasescope.sources.scrape.poller import Poller

__all__ = ["ENGINES", "EngineMetrics", "Histogram", "Poller", "Scrape", "detect_engines", "fetch",
           "histogram_quantile", "parse_text", "read_file", "server_kpis"]
