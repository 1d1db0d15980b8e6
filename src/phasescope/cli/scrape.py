"""`phasescope scrape URL|FILE`: inference KPIs of a vLLM, TGI, SGLang or Triton server from its /metrics."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from phasescope.cli._options import Duration
from phasescope.cli._output import check_writable, write_output
from phasescope.errors import InputError
from phasescope.sources.scrape import fetch, read_file, server_kpis
from phasescope.views.run_report import print_servers


@click.command()
@click.argument("target")
@click.option("--window", type=Duration(max=86_400, min_open=False), default=10.0, show_default=True,
              help="URL: time between the two scrapes that rates and percentiles cover; 0 = one scrape, "
                   "totals and percentiles since the server started.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the KPIs as JSON here.")
@click.option("--timeout", type=Duration(max=3600), default=5.0, show_default=True,
              help="HTTP timeout, e.g. 5s.")
def command(target: str, window: float, json_path: str | None, timeout: float) -> None:
    """Derive requests/s, latency p50/p95/p99, TTFT, inter-token latency and tokens/s from a serving
    engine's Prometheus metrics (a URL, or a saved scrape FILE: since-start figures only).

    Example: phasescope scrape http://localhost:8000/metrics --window 30
    """
    if json_path:
        check_writable(Path(json_path), "--json")
    if target.startswith(("http://", "https://")):
        first = fetch(target, timeout)
        if window > 0:
            time.sleep(window)
            kpis = server_kpis(fetch(target, timeout), first)
        else:
            kpis = server_kpis(first)
    else:
        kpis = server_kpis(read_file(target))
    if not kpis:
        raise InputError(target, "metrics", "vLLM (vllm:*), TGI (tgi_*) or Triton (nv_inference_*) metrics",
                         "none of them")
    print_servers(kpis, Console())
    if json_path and not write_output(Path(json_path), "--json", json.dumps(kpis, indent=1) + "\n"):
        sys.exit(2)
