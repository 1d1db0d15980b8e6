"""`phasescope top`: the live table of every device (GPU through NVML, else the host and its processes)."""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

import click

from phasescope.errors import SourceError
from phasescope.live_state import SORT_KEYS, LiveState, feed
from phasescope.sources.base import LiveSource

ONCE_TICKS = 2  # per-process CPU % needs two readings
PLAIN_WIDTH = 260  # columns when stdout is a file or pipe: one line per row, nothing cut


def plain_console_width() -> int:
    """Rich wraps at 80 columns when stdout is not a terminal; the table needs more to stay one line a row."""
    if sys.stdout.isatty():
        return 0  # rich measures the terminal itself
    return max(shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns, PLAIN_WIDTH)


def run_live(
    source: LiveSource,
    interval_s: float,
    *,
    duration: float | None = None,
    mode: str = "tui",
    sort: str = "order",
    filter_text: str = "",
    process_labels: Mapping[int, str] | None = None,
    notices: Sequence[str] = (),
) -> LiveState:
    """Watch `source` in one of three modes: "tui" (full screen), "plain" (a table per tick), "once".

    The source is closed when sampling ends. Returns the state, so callers can report on what was seen.
    """
    state = LiveState(source.name)
    state.process_labels.update(process_labels or {})
    for line in notices:
        state.note(line)
    stop = threading.Event()
    if mode == "tui":
        try:
            from phasescope.tui import TopApp
        except ModuleNotFoundError as exc:
            source.close()
            if exc.name != "textual":
                raise
            raise SourceError(
                "the full-screen view needs textual: pip install 'phasescope[tui]' (or use --plain / --once)"
            ) from None

        app = TopApp(
            state,
            lambda ev: feed(state, source, interval_s, ev, duration=None),
            duration=duration,
            sort=sort,
            filter_text=filter_text,
            refresh_s=min(0.5, interval_s),
        )
        try:
            app.run()
        finally:
            app.stop_sampling()
        return state

    from rich.console import Console

    from phasescope.tui import render_table

    width = plain_console_width()
    console = Console(width=width) if width else Console()

    def sample() -> None:
        feed(state, source, interval_s, stop, duration=duration)

    worker = threading.Thread(target=sample, name="phasescope-sampler", daemon=True)
    worker.start()
    drawn = state.version
    try:
        while worker.is_alive():
            worker.join(timeout=min(0.1, interval_s / 4))
            if mode == "once":
                if state.ticks >= ONCE_TICKS:
                    break
            elif state.ticks and state.version != drawn:
                drawn = state.version
                console.print(render_table(state, sort, filter_text))
    finally:
        stop.set()
        worker.join(timeout=10)
    if mode == "once" or state.version != drawn:  # the last word: one table, or what changed at the end
        console.print(render_table(state, sort, filter_text))
    return state


@click.command("top")
@click.option("--source", "source_spec", default="auto", show_default=True,
              help="auto | nvml | host | replay:PATH[?speed=N&loop=1]")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=1.0, show_default=True,
              help="Seconds between samples (0.1 = 10 Hz).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop after this many seconds (default: until q / Ctrl-C).")
@click.option("--once", is_flag=True, help="Print one table (after two samples) and exit.")
@click.option("--plain", is_flag=True,
              help="No full screen: print a table each sample (the default when stdout is not a terminal).")
@click.option("--sort", type=click.Choice(SORT_KEYS), default="order", show_default=True)
@click.option("--filter", "filter_text", default="", help="Show only rows whose device or process matches.")
def command(
    source_spec: str,
    interval: float,
    duration: float | None,
    once: bool,
    plain: bool,
    sort: str,
    filter_text: str,
) -> None:
    """Live table of every device: the signals now and a short history.

    \b
    Examples:
      phasescope top                      # full screen; ? for keys, q to quit
      phasescope top --once               # one table, e.g. in a script
      phasescope top --source replay:run.parquet?speed=10
    """
    notices: list[str] = []
    source = open_watched(source_spec, notices.append, host_row=False)
    mode = "once" if once else "plain" if plain or not sys.stdout.isatty() else "tui"
    if mode != "tui":
        for line in notices:
            click.echo(f"phasescope: {line}", err=True)
    run_live(source, interval, duration=duration, mode=mode, sort=sort, filter_text=filter_text,
             notices=notices)


def open_watched(spec: str, say: Callable[[str], None], host_row: bool) -> LiveSource:
    """`open_source(spec)`, with NVML's GPU processes enriched by the host (CPU, RSS, threads, torch).

    `host_row=True` also shows the host itself and its torch processes that use no GPU.
    """
    from phasescope.sources.open import open_source

    source = open_source(spec, say=say)
    if source.name == "nvml":
        from phasescope.sources.host import CombinedSource, HostSource

        return CombinedSource(source, HostSource(), host_row=host_row)
    return source
