"""`phasescope fleet`: classify every GPU that a Prometheus-compatible server holds."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from phasescope import config as configmod
from phasescope.cli._options import Duration, FiniteFloatRange, price_options
from phasescope.fleet.judge import DEFAULT_HELD_MEM_BYTES
from phasescope.fleet.scan import ScanOptions, scan
from phasescope.fleet.shard import parse_shard
from phasescope.kpi.cost import Prices
from phasescope.timespec import parse_duration, parse_instant


def _prices(config_path: str | None, gpu_hour: float | None, kwh: float | None) -> configmod.PriceConfig:
    cfg = configmod.load(config_path).override(prices__usd_per_gpu_hour=gpu_hour, prices__usd_per_kwh=kwh)
    return cfg.prices


@click.command(
    "fleet",
    # \b keeps each example on one line (click rewraps an epilog's paragraphs to the terminal width).
    epilog="\b\nExamples:\n"
    "  phasescope fleet --prometheus http://prometheus:9090 --since 1h\n"
    "  phasescope fleet --prometheus http://thanos-query:9090 --selector '{namespace=\"ml\"}' --json\n"
    "  phasescope fleet --prometheus http://prometheus:9090 --serve --shard 0/4 --port 9465",
)
@click.option(
    "--prometheus",
    "url",
    envvar="PHASESCOPE_PROMETHEUS",
    show_envvar=True,  # "[required]" alone would hide that the variable stands in for the flag
    required=True,
    help="Base URL of Prometheus, Thanos Query, Mimir (…/prometheus) or VictoriaMetrics.",
)
@click.option("--since", default="1h", show_default=True, help="How far back to classify (90s, 15m, 1h, 2d).")
@click.option("--end", "end_text", default=None, help="End of the range (Unix s or ISO 8601; default now).")
@click.option(
    "--step",
    default="1s",
    show_default=True,
    help="Query step; the model is validated for 0.1-20 Hz, so keep it at the scrape interval <= 10s.",
)
@click.option(
    "--selector", default="", help='Extra label matchers, e.g. \'{namespace="ml",Hostname=~"a.*"}\'.'
)
@click.option("--shard", "shard_text", default=None, help="Keep only this replica's devices: I/N (0-based).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option(
    "--held-mem-gib",
    type=FiniteFloatRange(min=0),
    default=DEFAULT_HELD_MEM_BYTES / 1024**3,
    show_default=True,
    help="An idle GPU holding this much memory (or a pod) counts as held-idle.",
)
@price_options(
    "USD per GPU-hour.",
    "USD per kWh.",
    "Config file with prices (default: $PHASESCOPE_CONFIG or ~/.config/phasescope/config.toml).",
)
@click.option(
    "--batch-samples",
    type=click.IntRange(min=10_000),
    default=ScanOptions.max_samples,
    show_default=True,
    help="Most samples asked for in one query (below the server's query.max-samples); "
    "answers of ~1M samples cost Prometheus less per sample than larger ones.",
)
@click.option(
    "--workers",
    type=click.IntRange(0, 256),
    default=0,
    show_default=True,
    help="Processes that each query a batch and classify it while the others wait on the server "
    "(so also the queries in flight); 0: one per CPU available.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=Duration(min=1.0, min_open=False),
    default=120.0,
    show_default=True,
    help="How long to wait for one query, e.g. 2m.",
)
@click.option(
    "--serve",
    "serve",
    is_flag=True,
    help="Keep running: re-classify on a schedule and serve /metrics, a fleet page and /api/fleet.",
)
@click.option("--every", default="60s", show_default=True, help="With --serve: time between passes.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --serve: address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9465,
    show_default=True,
    help="With --serve: port to listen on.",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    help="With --serve: also push the results as OTLP metrics here (needs the 'otel' extra).",
)
def command(
    url: str,
    since: str,
    end_text: str | None,
    step: str,
    selector: str,
    shard_text: str | None,
    as_json: bool,
    held_mem_gib: float,
    price_gpu_hour: float | None,
    price_kwh: float | None,
    config_path: str | None,
    batch_samples: int,
    workers: int,
    timeout_s: float,
    serve: bool,
    every: str,
    host: str,
    port: int,
    otlp_endpoint: str | None,
) -> None:
    """Classify every GPU a Prometheus-compatible server holds (phasescope or dcgm-exporter metrics).

    Prints how many GPUs train, serve, sit idle or sit held-but-idle, by host and by Kubernetes
    namespace/pod where the series carry those labels, and the held-idle waste.
    """
    if otlp_endpoint and not serve:
        raise click.UsageError("--otlp-endpoint pushes the results of --serve's passes: add --serve")
    prices = _prices(config_path, price_gpu_hour, price_kwh)
    opts = ScanOptions(
        url=url,
        since_s=parse_duration(since, "--since"),
        end=None if end_text is None else parse_instant(end_text, "--end"),
        step_s=parse_duration(step, "--step"),
        selector=selector,
        shard=parse_shard(shard_text),
        held_mem_bytes=held_mem_gib * 1024**3,
        max_samples=batch_samples,
        workers=workers,
        timeout_s=timeout_s,
    )

    def price_for(name: str) -> Prices:
        return prices.for_device(name)

    if serve:
        from phasescope.serve.fleet_app import run_service

        run_service(
            opts,
            every_s=parse_duration(every, "--every"),
            host=host,
            port=port,
            prices=price_for,
            otlp_endpoint=otlp_endpoint,
        )
        return
    result = scan(opts, prices=price_for)
    if as_json:
        json.dump(result.to_dict(), sys.stdout, allow_nan=False, default=_json_default)
        sys.stdout.write("\n")
        return
    from rich.console import Console

    from phasescope.fleet.summary import render

    # Piped into a file or `less`, rich would cut every table to 80 columns (hosts read `127.0.0.1:1…`):
    # only a terminal's width (or $COLUMNS) limits it.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    console = Console(width=1000 if wide else None)
    if not result.verdicts:
        # With --end the window is not "the last --since": name the one that was asked.
        window = (f"in the last {since}" if opts.end is None
                  else f"from {_utc(result.start)} to {_utc(result.end)}")
        matching = f" matching {selector}" if selector else ""
        console.print(f"no GPU series found at {url} {window}{matching}")
        return
    render(result.verdicts, console)
    console.print(
        f"[dim]{result.stats.devices} devices, {result.stats.series} series, "
        f"{result.stats.samples:,} samples; "
        f"{result.wall_s:.2f}s end to end with {result.workers} worker(s): query {result.query_s:.2f}s, "
        f"classify {result.classify_s:.2f}s summed over them; model {result.model_version}[/dim]"
    )


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _json_default(obj: object) -> object:
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
