"""`phasescope serve`: the agent: web dashboard, JSON API and Prometheus `/metrics` over a live source."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import click

from phasescope.cli._options import Duration, FiniteFloatRange, interval_option, live_interval
from phasescope.errors import SourceError
from phasescope.serve.server import bind, is_loopback, make_server, url_of


def pricing_note(
    usd_per_gpu_hour: float | None, usd_per_kwh: float | None, models: Sequence[str] = ()
) -> str:
    """The page's line on prices; `models`: the GPU models the config file prices on their own."""
    parts = []
    if usd_per_gpu_hour is not None:
        parts.append(f"${usd_per_gpu_hour:g} per GPU-hour")
    if usd_per_kwh is not None:
        parts.append(f"${usd_per_kwh:g} per kWh")
    if not parts and models:  # "No prices set" would be wrong beside the rows those models price
        return (f"Priced per GPU model from the config file ({', '.join(sorted(models))}); other devices: "
                "pass --usd-per-gpu-hour / --usd-per-kwh or set [prices].")
    if not parts:
        return "No prices set: pass --usd-per-gpu-hour / --usd-per-kwh or set [prices] in the config file."
    return "Priced at " + " + ".join(parts) + " (device overrides from the config file apply)."


@click.command("serve")
@click.option("--host", default=None, help="Address to bind (default from the config file: 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port (default from the config file: 9464; 0 picks a free one).")
@click.option("--token", envvar="PHASESCOPE_TOKEN", default=None,
              help="Require this token on every route but /metrics (env PHASESCOPE_TOKEN: not shown in ps).")
@click.option("--metrics-token/--metrics-public", default=False, show_default=True,
              help="Whether /metrics needs the token too (Prometheus: authorization.credentials).")
@click.option("--source", "source_spec", default="auto", show_default=True,
              help="auto | nvml | host | replay:PATH[?speed=N&loop=1]")
@interval_option("Seconds between samples.")
@click.option("--config", "config_path", default=None, help="TOML config file (prices, thresholds, port).")
@click.option("--usd-per-gpu-hour", type=FiniteFloatRange(min=0), default=None, help="Price of a held GPU.")
@click.option("--usd-per-kwh", type=FiniteFloatRange(min=0), default=None, help="Price of energy.")
@click.option("--model", "model_path", default=None, help="Phase model file (default: the shipped model).")
@click.option("--events-dir", default=None,
              help="Hook events dir of an instrumented run (phasescope run): step time, MFU, RPS, latency.")
@click.option("--history", "history_s", type=Duration(60, 30 * 86_400, min_open=False), default="15m",
              show_default=True, help="How much history per device the charts keep, e.g. 15m or 2h.")
@click.option("--store", "store_path", default=None,
              help="Also keep every sample in this SQLite store (what `verify --since/--until` reads); on "
                   "start, the charts and phases begin from its last --history samples.")
@click.option("--alarm/--no-alarm", default=True, show_default=True,
              help="Run the 'training started' alarm per GPU (the dashboard badge and the "
                   "phasescope_gpu_training_alarm metric); --no-alarm turns it off and saves its CPU.")
@click.option("--auto-scrape/--no-auto-scrape", default=True, show_default=True,
              help="Scrape the /metrics of a vLLM, TGI, SGLang or Triton server found on a GPU, unasked.")
def command(
    host: str | None,
    port: int | None,
    token: str | None,
    metrics_token: bool,
    source_spec: str,
    interval: float | None,
    config_path: str | None,
    usd_per_gpu_hour: float | None,
    usd_per_kwh: float | None,
    model_path: str | None,
    events_dir: str | None,
    history_s: float,
    store_path: str | None,
    alarm: bool,
    auto_scrape: bool,
) -> None:
    """Serve the live dashboard, a JSON API and Prometheus /metrics for every device.

    \b
    Examples:
      phasescope serve                                   # http://127.0.0.1:9464/
      PHASESCOPE_TOKEN=s3cret phasescope serve --host 0.0.0.0 --metrics-token
      phasescope serve --source 'replay:run.parquet?speed=10' --usd-per-gpu-hour 2.5
      phasescope serve --store live.sqlite               # keeps samples; a restart shows the recent ones
    """
    from phasescope import config as config_mod
    from phasescope.classify.model import PhaseModel
    from phasescope.cli.top import open_watched
    from phasescope.errors import InputError
    from phasescope.live.classify import LiveClassifier

    if token is not None and not token.strip():  # an empty token would disable the check
        raise InputError("--token", "token", "a non-empty token (an empty one would leave every route open)",
                         token)
    if metrics_token and not token:  # else /metrics would be served public, the opposite of what was asked
        raise InputError("--metrics-token", "token", "--token TOKEN or $PHASESCOPE_TOKEN, which /metrics "
                         "would then require", "none")
    cfg = config_mod.load(config_path).override(
        serve__host=host, serve__port=port if port else None,
        prices__usd_per_gpu_hour=usd_per_gpu_hour, prices__usd_per_kwh=usd_per_kwh,
    )
    bind_port = 0 if port == 0 else cfg.serve.port
    classifier = LiveClassifier(PhaseModel.load(model_path), alarm=alarm,
                                min_confidence=cfg.thresholds.min_confidence,
                                min_segment_s=cfg.thresholds.min_segment_s)
    classifier.warm_up()  # before the source opens: a replay's clock starts when it does
    try:
        import uvicorn  # noqa: F401  (the web extra, checked before the source opens)

        from phasescope.serve.agent import Agent
        from phasescope.serve.app import build_app
    except ModuleNotFoundError as exc:
        missing = f"serve needs the web extra ({exc.name} is missing): pip install 'phasescope[web]'"
        raise SourceError(missing) from None
    store = _open_store(store_path)  # before the source: a store another process writes is refused
    source = open_watched(source_spec, lambda line: click.echo(f"phasescope: {line}", err=True),
                          host_row=False)
    interval = live_interval(source, interval)
    history_ticks = max(2, math.ceil(history_s / interval))  # the ring holds samples; --history is a time
    if not token and not is_loopback(cfg.serve.host):
        click.echo(f"phasescope: warning: serving on {cfg.serve.host} without --token: anyone who can reach "
                   "it sees the dashboard", err=True)
    hooks = None
    if events_dir:
        from phasescope.live.annotate import HookKpiReader

        hooks = HookKpiReader(events_dir)
    agent = Agent(source, interval, classifier=classifier, prices=cfg.prices,
                  history_ticks=history_ticks, idle_util=cfg.thresholds.idle_util,
                  gap_factor=cfg.thresholds.energy_gap_factor, hooks=hooks,
                  store=store, auto_scrape=auto_scrape)
    if agent.store is not None:
        def say(line: str) -> None:
            click.echo(f"phasescope: {line}", err=True)
            agent.state.note(line)

        agent.load_history(say=say)  # charts and phase from the store's recent samples, before tick one
    app = build_app(agent, token=token, metrics_token=metrics_token,
                    pricing_note=pricing_note(cfg.prices.usd_per_gpu_hour, cfg.prices.usd_per_kwh,
                                              list(cfg.prices.gpu)))
    sock = bind(cfg.serve.host, bind_port)
    server = make_server(app)
    click.echo(f"phasescope: serving {url_of(sock)} (source: {source.name}, every {interval:g}s)", err=True)
    agent.start()
    try:
        server.run(sockets=[sock])
    finally:
        agent.stop()
        sock.close()


def _open_store(path: str | None) -> Any:
    if path is None:
        return None
    from phasescope.errors import InputError
    from phasescope.store.live import open_for_writing

    try:
        return open_for_writing(path)
    except OSError as exc:  # e.g. its directory cannot be created
        raise InputError(path, "--store", "a store file that can be created and written",
                         exc.strerror or str(exc)) from None
