"""`phasescope demo`: watch this machine while two real, small PyTorch workloads run beside the view."""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import socket
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

import click

from phasescope.cli._options import Duration, FiniteFloatRange, duration_option
from phasescope.cli.top import _watch, open_watched
from phasescope.demo.children import DemoChildren
from phasescope.errors import SourceError

if TYPE_CHECKING:
    from phasescope.config import PriceConfig
    from phasescope.serve.agent import Agent
    from phasescope.serve.server import BackgroundServer

WEB_HOST = "127.0.0.1"  # the demo has no token option: its page stays on this machine
WEB_MODULES = ("starlette", "uvicorn", "plotly", "prometheus_client")  # the web extra
# With no [prices] in the config file, the demo prices device time at this example rate, and says so on
# every status line and on the page, so its cost column shows what pricing does without passing for a bill.
DEMO_USD_PER_DEVICE_HOUR = 2.50
DEMO_PRICE_NOTE = f"demo prices: ${DEMO_USD_PER_DEVICE_HOUR:.2f}/device-hour, from `phasescope demo --help`"


def demo_prices(prices: PriceConfig) -> tuple[PriceConfig, str]:
    """The config's prices when it sets any; else the example price, with the note that labels it."""
    from phasescope.config import PriceConfig

    if prices.usd_per_gpu_hour is not None or prices.usd_per_kwh is not None or prices.gpu:
        return prices, ""
    return PriceConfig(usd_per_gpu_hour=DEMO_USD_PER_DEVICE_HOUR), DEMO_PRICE_NOTE


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so the finally that stops the workloads runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, handler)


def _listen(port: int | None, default_port: int, say: list[str]) -> socket.socket:
    """The dashboard's socket: `--port` exactly (0: a free one), else the config's port, else a free one."""
    from phasescope.serve.server import bind

    if port is not None:
        return bind(WEB_HOST, port)
    try:
        return bind(WEB_HOST, default_port)
    except SourceError as exc:  # e.g. `phasescope serve` already holds it: the demo need not fail for that
        say.append(f"{exc}; the dashboard takes a free port instead")
        return bind(WEB_HOST, 0)


def _dashboard(agent: Agent, prices: PriceConfig, price_note: str, sock: socket.socket,
               quiet: bool) -> BackgroundServer:
    from phasescope.cli.serve import pricing_note
    from phasescope.serve.app import build_app
    from phasescope.serve.server import BackgroundServer

    note = price_note + " (an example, not your price: set [prices] in the config file)" if price_note else (
        pricing_note(prices.usd_per_gpu_hour, prices.usd_per_kwh))
    app = build_app(agent, pricing_note=note)
    server = BackgroundServer(app, sock, log_level="critical" if quiet else "warning")
    server.start()
    return server


@click.command("demo")
@duration_option("Stop after this long, e.g. 90s or 5m (default: until q / Ctrl-C).")
@click.option("--plain", is_flag=True,
              help="No full screen: print a table each sample (the default when stdout is not a terminal).")
@click.option("--interval", type=Duration(0.1, 60, min_open=False), default=1.0, show_default=True,
              help="Time between samples, e.g. 1s or 0.5 (0.1 to 60 s).")
@click.option("--source", "source_spec", default="auto", show_default=True,
              help="What to watch: auto (GPUs through NVML if present, else the host), nvml, host.")
@click.option("--rate", type=FiniteFloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="Mean inference requests per second (Poisson arrivals).")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="Training batch size.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port of the web dashboard on 127.0.0.1 (default: the config file's, 9464, or a free one "
                   "when that is taken; 0 = a free one).")
@click.option("--web/--no-web", default=True, show_default=True,
              help="Also serve the web dashboard (the page of `phasescope serve`) from the same samples.")
def command(
    duration: float | None, plain: bool, interval: float, source_spec: str, rate: float, batch: int,
    port: int | None, web: bool,
) -> None:
    """Live view of this machine with two real PyTorch workloads running beside it, in the terminal and
    on a web dashboard.

    Starts a training loop (MLP + AdamW on synthetic data) and an inference loop fed by Poisson-arrival
    requests, one thread each at lowered priority. Without NVML the host is watched and the workloads
    show up as its process sub-rows; with NVML the GPUs are watched, and the workloads run on a GPU when
    the installed PyTorch can use one (else on the CPU). One sampler feeds both the terminal view and
    the dashboard (http://127.0.0.1:9464/ by default; its URL is printed, and kept in the full-screen header).
    Everything stops when the demo ends.

    Cost: from the config file's [prices]; when it sets none, device time is priced at an example
    $2.50/device-hour, labelled "demo prices" wherever it shows. The live host source reads no power, so its
    energy shows as "– kWh" and its cost is device time only, split by the phase its workloads' hooks report.

    \b
    Examples:
      phasescope demo                          # full screen + dashboard; q or Ctrl-C ends it
      phasescope demo --duration 10 --plain    # headless, prints a table each second
      phasescope demo --port 8080              # dashboard at http://127.0.0.1:8080/
      phasescope demo --no-web                 # terminal only
    """
    from phasescope import config as configmod
    from phasescope.live.annotate import HookKpiReader
    from phasescope.live.classify import LiveClassifier
    from phasescope.serve.agent import Agent

    DemoChildren.require_torch()
    plain = plain or not sys.stdout.isatty()  # no terminal to draw on: print tables instead
    cfg = configmod.load(None)
    notices: list[str] = []
    sock = None
    if web:
        missing = [m for m in WEB_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            notices.append(f"no dashboard: {', '.join(missing)} missing: pip install 'phasescope[web]'")
        else:
            sock = _listen(port, cfg.serve.port, notices)  # before the workloads: a bad --port starts nothing
    source = open_watched(source_spec, notices.append, host_row=True)
    # Put the workloads on a GPU only when we are watching GPUs; the children decide if CUDA works.
    device = "auto" if source.name.startswith("nvml") else "cpu"
    children = DemoChildren()
    server = None
    _exit_on_sigterm()
    try:
        children.start(device=device, rate=rate, batch=batch)
        roles = {pid: f"demo {role}" for pid, role in children.pids().items()}
        watch = getattr(source, "watch", None)
        if callable(watch):  # the host source: sample them from the first tick, before torch is loaded
            watch(roles)
        hooks = HookKpiReader(children.events_dir, consume=True) if children.events_dir else None
        # One agent samples for both views: the terminal reads its state, the page its snapshots.
        prices, price_note = demo_prices(cfg.prices)
        classifier = LiveClassifier(min_confidence=cfg.thresholds.min_confidence,
                                    min_segment_s=cfg.thresholds.min_segment_s)
        agent = Agent(source, interval, classifier=classifier, prices=prices,
                      idle_util=cfg.thresholds.idle_util, gap_factor=cfg.thresholds.energy_gap_factor,
                      hooks=hooks)
        agent.state.process_labels.update(roles)
        agent.state.price_note = price_note
        # Parse the model's boosters beside the first ticks rather than before them (seconds).
        threading.Thread(target=agent.classifier.warm_up, name="phasescope-warm-up", daemon=True).start()
        for line in notices:
            agent.state.note(line)
        if sock is not None:
            server = _dashboard(agent, prices, price_note, sock, quiet=not plain)
            # On the screen's status line; --plain prints it once below, as `demo: dashboard at URL`.
            agent.state.note(f"dashboard: {server.url}")
        if plain:
            for line in notices:
                click.echo(f"phasescope: {line}", err=True)
            listing = ", ".join(f"{role} pid {pid}" for pid, role in children.pids().items())
            click.echo(f"demo: started {listing}; logs in {children.log_dir}")
            if server is not None:
                click.echo(f"demo: dashboard at {server.url}", nl=True)
            sys.stdout.flush()
        # Ctrl-C ends the demo as q does (README): the workloads stopped, its stop line, exit 0.
        with contextlib.suppress(KeyboardInterrupt):
            _watch(agent.loop, "plain" if plain else "tui", duration, "order", "",
                   web_url=server.url if server is not None else None)
        problems = children.failed()
    finally:
        if server is not None:
            server.stop()
        elif sock is not None:
            sock.close()
        children.stop()
    for line in problems:
        click.echo(f"demo: {line}", err=True)
    click.echo(f"demo: stopped {', '.join(str(p) for p in children.pids())}")
