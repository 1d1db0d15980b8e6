"""`phasescope demo`: watch this machine while two real, small PyTorch workloads run beside the view."""

from __future__ import annotations

import contextlib
import signal
import sys
from types import FrameType

import click

from phasescope.cli.top import open_watched, run_live
from phasescope.demo.children import DemoChildren


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so the finally that stops the workloads runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, handler)


@click.command("demo")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop after this many seconds (default: until q / Ctrl-C).")
@click.option("--plain", is_flag=True,
              help="No full screen: print a table each sample (the default when stdout is not a terminal).")
@click.option("--interval", type=click.FloatRange(0.1, 60), default=1.0, show_default=True,
              help="Seconds between samples.")
@click.option("--source", "source_spec", default="auto", show_default=True,
              help="What to watch: auto (GPUs through NVML if present, else the host), nvml, host.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="Mean inference requests per second (Poisson arrivals).")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="Training batch size.")
def command(
    duration: float | None, plain: bool, interval: float, source_spec: str, rate: float, batch: int
) -> None:
    """Live view of this machine with two real PyTorch workloads running beside it.

    Starts a training loop (MLP + AdamW on synthetic data) and an inference loop fed by Poisson-arrival
    requests, one thread each at lowered priority. Without NVML the host is watched and the workloads
    show up as its process sub-rows; with NVML the GPUs are watched, and the workloads run on a GPU when
    the installed PyTorch can use one (else on the CPU). Both stop when the demo ends.

    \b
    Examples:
      phasescope demo                          # full screen; q or Ctrl-C ends it
      phasescope demo --duration 10 --plain    # headless, prints a table each second
    """
    DemoChildren.require_torch()
    plain = plain or not sys.stdout.isatty()  # no terminal to draw on: print tables instead
    notices: list[str] = []
    source = open_watched(source_spec, notices.append, host_row=True)
    if plain:
        for line in notices:
            click.echo(f"phasescope: {line}", err=True)
    # Put the workloads on a GPU only when we are watching GPUs; the children decide if CUDA works.
    device = "auto" if source.name.startswith("nvml") else "cpu"
    children = DemoChildren()
    _exit_on_sigterm()
    try:
        children.start(device=device, rate=rate, batch=batch)
        roles = {pid: f"demo {role}" for pid, role in children.pids().items()}
        watch = getattr(source, "watch", None)
        if callable(watch):  # the host source: sample them from the first tick, before torch is loaded
            watch(roles)
        if plain:
            listing = ", ".join(f"{role} pid {pid}" for pid, role in children.pids().items())
            click.echo(f"demo: started {listing}; logs in {children.log_dir}")
        events = str(children.events_dir) if children.events_dir else None
        run_live(source, interval, duration=duration, mode="plain" if plain else "tui", process_labels=roles,
                 notices=notices, events_dir=events, consume_events=True)
        problems = children.failed()
    finally:
        children.stop()
    for line in problems:
        click.echo(f"demo: {line}", err=True)
    click.echo(f"demo: stopped {', '.join(str(p) for p in children.pids())}")
