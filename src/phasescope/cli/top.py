"""`phasescope top`: the live table of every device (GPU through NVML, else the host and its processes)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from phasescope.cli._options import duration_option, interval_option, live_interval
from phasescope.cli.cost import _config, _price_options
from phasescope.errors import SourceError
from phasescope.instrument.events import EVENTS_DIR_ENV
from phasescope.kpi.cost import Prices
from phasescope.kpi.energy import DEFAULT_GAP_FACTOR
from phasescope.live.history import DEFAULT_HISTORY_S, backfill_phases, open_history
from phasescope.live.loop import Sink, TickLoop
from phasescope.live.state import DEFAULT_HISTORY, LiveState
from phasescope.schema import DeviceInfo
from phasescope.sources.base import LiveSource
from phasescope.sources.sampler import DEFAULT_INTERVAL_S
from phasescope.timespec import parse_duration
from phasescope.views.table import SORT_KEYS

if TYPE_CHECKING:
    from phasescope.config import Config
    from phasescope.live.annotate import ScrapeKpiReader
    from phasescope.live.evidence import EvidenceTracker

ONCE_TICKS = 2  # per-process CPU % needs two readings
PLAIN_WIDTH = 400  # columns when stdout is a file or pipe: one line per row, nothing cut


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
    classify: bool = True,
    alarm: bool = True,
    events_dir: str | None = None,
    prices: Prices | Callable[[DeviceInfo], Prices] | None = None,
    idle_util: float = 0.05,
    annotate: Callable[[LiveState], None] | None = None,
    scrapes: Sequence[str] = (),
    consume_events: bool = False,
    store: str | Path | None = None,
    history_s: float = DEFAULT_HISTORY_S,
    store_write: bool = True,
    min_confidence: float | None = None,
    min_segment_s: float | None = None,
    gap_factor: float = DEFAULT_GAP_FACTOR,
    auto_scrape: bool = True,
) -> LiveState:
    """Watch `source` in one of three modes: "tui" (full screen), "plain" (a table per tick), "once".

    With `classify`, each device gets its phase from the live classifier (and, with `alarm`, its
    "training started" alarm); with `events_dir` (default:
    $PHASESCOPE_EVENTS_DIR), hook KPIs; with `scrapes` (URL[@INDEX]), a serving engine's KPIs. `prices`
    (default: the config file's) turn metered energy into cost. Each local GPU process's own claim (a serving
    engine, a trainer) is shown beside the phase, and with `auto_scrape` a recognised engine's /metrics is
    scraped unasked. `annotate` replaces the classifier and the KPI readers (tests). With `store` (a live
    store's path), the watched devices' last `history_s` seconds in it are loaded before the first sample, and
    with `store_write` every new tick is written to it (see `open_history`). `min_confidence` /
    `min_segment_s` (the config's [thresholds], None: unset) go to the classifier; `gap_factor` (the config's
    energy_gap_factor) to the energy meter. The source is closed when sampling ends. Returns the state.
    """
    if prices is None:  # not given: the config file's, per device model (none set -> energy without cost)
        from phasescope import config as configmod

        prices = device_prices(configmod.load(None), None, None)
    said: list[str] = []
    history = None
    if store is not None:
        history = open_history(Path(store), source.devices(), history_s, store_write, said.append)
    capacity = DEFAULT_HISTORY if history is None else history.capacity(history_s, interval_s)
    if classify and annotate is None:
        from phasescope.live.classify import ring_ticks

        # A replay keeps its recorded spacing: the ring must hold what the classifier and alarm read.
        data_interval_s = float(getattr(source, "native_interval_s", interval_s))
        capacity = max(capacity, ring_ticks(data_interval_s, alarm=alarm))
    state = LiveState(source.name, capacity, prices=prices, idle_util=idle_util)
    state.process_labels.update(process_labels or {})
    for line in notices:
        state.note(line)
    if history is not None and history.traces:
        state.preload(history.traces, source.devices())
    for line in said:
        state.note(line)
        if mode != "tui":
            click.echo(f"phasescope: {line}", err=True)
    scrapers = [scrape_reader(spec) for spec in scrapes]
    if annotate is None:
        from phasescope.live.evidence import EvidenceTracker

        annotate = make_annotator(state, classify, events_dir or os.environ.get(EVENTS_DIR_ENV) or None,
                                  scrapers, consume_events, alarm=alarm, min_confidence=min_confidence,
                                  min_segment_s=min_segment_s, evidence=EvidenceTracker(auto_scrape))
    before = None
    classifier = getattr(annotate, "classifier", None)  # an Annotator's; a test's own annotate has none
    if history is not None and history.traces and classifier is not None:
        def before() -> None:
            backfill_phases(state, classifier)
    sinks: list[Sink] = []
    if history is not None and history.writer is not None:
        sinks.append(("writing the store", history.writer.ingest))
    loop = TickLoop(source, interval_s, state, annotate=annotate, sinks=sinks, gap_factor=gap_factor)
    for scraper in scrapers:
        scraper.start()
    try:
        return _watch(loop, mode, duration, sort, filter_text, before=before)
    finally:
        for scraper in scrapers:
            scraper.stop()
        evidence = getattr(annotate, "evidence", None)
        if evidence is not None:
            evidence.stop()  # the engines it scraped unasked
        if history is not None:
            history.close()


def _watch(loop: TickLoop, mode: str, duration: float | None, sort: str, filter_text: str, *,
           before: Callable[[], None] | None = None,
           sample: Callable[[threading.Event, float | None], None] | None = None,
           web_url: str | None = None) -> LiveState:
    """Show `loop.state` while the loop runs in a worker thread (`before` as in `TickLoop.run`; the demo
    passes its dashboard agent's loop, so the view and the page read one pipeline). `sample(stop, duration)`
    replaces the loop's run (tests). `web_url`: a dashboard served beside the view, kept in the header / each
    table's title."""
    state, source, interval_s = loop.state, loop.source, loop.sampler.interval_s
    if sample is None:
        def sample(ev: threading.Event, seconds: float | None) -> None:
            loop.run(ev, seconds, before=before)

    stop = threading.Event()
    if mode == "tui":
        try:
            from phasescope.views.tui import TopApp
        except ModuleNotFoundError as exc:
            source.close()
            if exc.name != "textual":
                raise
            raise SourceError(
                "the full-screen view needs textual: pip install 'phasescope[tui]' (or use --plain / --once)"
            ) from None

        app = TopApp(
            state,
            lambda ev: sample(ev, None),
            duration=duration,
            sort=sort,
            filter_text=filter_text,
            refresh_s=min(0.5, interval_s),
            web_url=web_url,
        )
        try:
            app.run()
        finally:
            app.stop_sampling()
        return state

    from rich.console import Console

    from phasescope.views.tui import render_table

    width = plain_console_width()
    console = Console(width=width) if width else Console()
    fit = None if width else console.width  # a terminal: fit the table to it; a file or pipe: nothing cut

    worker = threading.Thread(target=sample, args=(stop, duration), name="phasescope-sampler", daemon=True)
    worker.start()
    drawn = state.version
    try:
        while worker.is_alive():
            worker.join(timeout=min(0.1, interval_s / 4))
            if mode == "once":
                # With --duration: the table at its end (a phase and its KPIs need a window of samples).
                if duration is None and state.ticks >= ONCE_TICKS:
                    break
            elif state.ticks and state.version != drawn:
                drawn = state.version
                console.print(render_table(state, sort, filter_text, web_url, fit))
    except KeyboardInterrupt:  # Ctrl-C ends a plain view as q ends the full screen: a normal end
        if mode == "once":  # but --once was cut short of its table: no half-read snapshot, exit 130
            raise
    finally:
        stop.set()
        worker.join(timeout=10)
    if mode == "once" or state.version != drawn:  # the last word: one table, or what changed at the end
        console.print(render_table(state, sort, filter_text, web_url, fit))
    return state


def device_prices(
    cfg: Config, gpu_hour: float | None, kwh: float | None
) -> Callable[[DeviceInfo], Prices]:
    """Per device: the config file's prices for its model, with each price given as a flag put over them."""

    def price(info: DeviceInfo) -> Prices:
        p = cfg.prices.for_device(info.name)
        return Prices(p.usd_per_gpu_hour if gpu_hour is None else gpu_hour,
                      p.usd_per_kwh if kwh is None else kwh)

    return price


def scrape_reader(spec: str) -> ScrapeKpiReader:
    """'http://host:8000/metrics@1' -> a reader for GPU index 1 ('@GPU-…' uuid too; none: the only device)."""
    from phasescope.live.annotate import ScrapeKpiReader

    url, at, device = spec.rpartition("@")
    if at and (device.isdigit() or device.startswith(("GPU-", "MIG-", "host:"))):
        return ScrapeKpiReader(url, device)
    return ScrapeKpiReader(spec)


def make_annotator(
    state: LiveState,
    classify: bool,
    events_dir: str | None,
    scrapes: Sequence[ScrapeKpiReader] = (),
    consume_events: bool = False,
    alarm: bool = True,
    min_confidence: float | None = None,
    min_segment_s: float | None = None,
    evidence: EvidenceTracker | None = None,
) -> Callable[[LiveState], None] | None:
    """The live classifier, hook-KPI and /metrics readers and the processes' evidence, as far as they can run
    here (a missing part is a notice)."""
    from phasescope.live.annotate import Annotator, HookKpiReader

    classifier = None
    if classify:
        try:
            from phasescope.live.classify import LiveClassifier

            classifier = LiveClassifier(
                alarm=alarm, min_confidence=min_confidence, min_segment_s=min_segment_s
            )
            # Parse the model's boosters (seconds) beside the first ticks rather than inside one.
            threading.Thread(target=classifier.warm_up, name="phasescope-warm-up", daemon=True).start()
        except Exception as exc:  # e.g. lightgbm missing: telemetry still shows, the phase says why not
            state.note(f"no phase: classifier not available ({type(exc).__name__}: {exc})")
    hooks = HookKpiReader(events_dir, consume=consume_events) if events_dir else None
    if classifier is None and hooks is None and not scrapes and evidence is None:
        return None
    return Annotator(classifier, hooks, scrapes, evidence)


@click.command("top")
@click.option("--source", "source_spec", default="auto", show_default=True,
              help="auto | nvml | host | replay:PATH[?speed=N&loop=1]")
@interval_option("Seconds between samples (0.1 = 10 Hz).")
@duration_option("Stop after this long, e.g. 90s or 1h (default: until q / Ctrl-C).")
@click.option("--once", is_flag=True,
              help="Print one table (after two samples, or at the end of --duration) and exit.")
@click.option("--plain", is_flag=True,
              help="No full screen: print a table each sample (the default when stdout is not a terminal).")
@click.option("--sort", type=click.Choice(SORT_KEYS), default="order", show_default=True)
@click.option("--filter", "filter_text", default="",
              help="Show only rows whose device, process (name, PID, user or command line), phase or "
                   "'idle-held' matches.")
@click.option("--classify/--no-classify", default=True, show_default=True,
              help="Classify each device's phase live with the shipped model.")
@click.option("--alarm/--no-alarm", default=True, show_default=True,
              help="Run the 'training started' alarm per GPU beside the phase (its onset model costs about "
                   "as much CPU again as the phase classifier); --no-alarm turns it off.")
@click.option("--events", "events_dir", default=None, type=click.Path(file_okay=False, path_type=str),
              help="Hook events directory for step time, samples/s, MFU, req/s, latency "
                   "(default: $PHASESCOPE_EVENTS_DIR).")
@click.option("--store", "store_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Live store (SQLite; what serve/record --store write): load recent history from it on "
                   "start, and write every new sample to it. Default: read-only history from "
                   "$PHASESCOPE_HOME/live.sqlite (else ~/.local/share/phasescope/live.sqlite) if it exists.")
@click.option("--history", "history_text", default="10m", show_default=True, metavar="DURATION",
              help="How much history to load from the store on start (90s, 10m, 1h; 0 = none).")
@click.option("--read-only-store", is_flag=True,
              help="Only read history from --store; write nothing to it.")
@click.option("--scrape", "scrapes", multiple=True, metavar="URL[@INDEX]",
              help="A vLLM / TGI / SGLang / Triton /metrics URL: requests/s and p50/p99 latency for the GPU "
                   "at INDEX (or uuid; the only device when omitted). Repeatable.")
@click.option("--auto-scrape/--no-auto-scrape", default=True, show_default=True,
              help="Scrape the /metrics of a vLLM, TGI, SGLang or Triton server found on a GPU, unasked.")
@_price_options
def command(
    source_spec: str,
    interval: float | None,
    duration: float | None,
    once: bool,
    plain: bool,
    sort: str,
    filter_text: str,
    classify: bool,
    alarm: bool,
    events_dir: str | None,
    store_path: Path | None,
    history_text: str,
    read_only_store: bool,
    scrapes: tuple[str, ...],
    auto_scrape: bool,
    price_gpu_hour: float | None,
    price_kwh: float | None,
    config_path: str | None,
) -> None:
    """Live table of every device: its phase and confidence, the KPIs for that phase, the signals now, a
    short history, energy and cost so far, and its processes. Idle GPUs that a process holds stand out.

    \b
    Examples:
      phasescope top                      # full screen; ? for keys, q to quit
      phasescope top --once               # one table, e.g. in a script
      phasescope top --source 'replay:run.parquet?speed=10' --price-gpu-hour 2.5
      phasescope top --events ./events    # with KPIs from `phasescope run` hooks
      phasescope top --scrape http://localhost:8000/metrics@0   # vLLM serving on GPU 0
      phasescope top --store live.sqlite --history 30m          # history after a restart
    """
    history_s = parse_duration(history_text, "--history", allow_zero=True)
    store_write = not read_only_store
    if store_path is None:
        from phasescope.store.live import default_store_path

        default = default_store_path()  # read when there, never created: nobody asked to keep samples
        store_path, store_write = (default, False) if default.is_file() and history_s > 0 else (None, False)
    cfg = _config(config_path, price_gpu_hour, price_kwh)
    notices: list[str] = []
    source = open_watched(source_spec, notices.append, host_row=False)
    mode = "once" if once else "plain" if plain or not sys.stdout.isatty() else "tui"
    interval_s = live_interval(source, interval, say=notices.append)
    if once and interval is None:
        # One table after two samples: a replay's own rate (a minute for Alibaba's file) would make it
        # wait that long for a second sample; 1 s at most, as before, shows the same table.
        interval_s = min(interval_s, DEFAULT_INTERVAL_S)
    if mode != "tui":
        for line in notices:
            click.echo(f"phasescope: {line}", err=True)
    run_live(source, interval_s, duration=duration, mode=mode, sort=sort,
             filter_text=filter_text, notices=notices, classify=classify, alarm=alarm, events_dir=events_dir,
             prices=device_prices(cfg, price_gpu_hour, price_kwh),
             idle_util=cfg.thresholds.idle_util, scrapes=scrapes, store=store_path, history_s=history_s,
             store_write=store_write, min_confidence=cfg.thresholds.min_confidence,
             min_segment_s=cfg.thresholds.min_segment_s, gap_factor=cfg.thresholds.energy_gap_factor,
             auto_scrape=auto_scrape)


def open_watched(spec: str, say: Callable[[str], None], host_row: bool) -> LiveSource:
    """`open_source(spec)`, with NVML's GPU processes enriched by the host (CPU, RSS, threads, torch).

    `host_row=True` also shows the host itself and its torch processes that use no GPU.
    """
    from phasescope.sources.host import CombinedSource, HostSource
    from phasescope.sources.open import open_source

    source = open_source(spec, say=say)
    if source.name == "nvml":
        return CombinedSource(source, HostSource(), host_row=host_row)
    if isinstance(source, CombinedSource):  # `auto` found NVML: the host row as asked, as for `nvml`
        source.host_row = host_row
    return source
