"""`phasescope run -- CMD ...`: run a program with PyTorch hooks injected and its device watched."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
import numpy as np
from rich.console import Console

from phasescope.cli._options import Duration, interval_option, live_interval
from phasescope.cli._output import check_writable, write_output
from phasescope.errors import InputError, PhasescopeError
from phasescope.instrument.events import load_events
from phasescope.instrument.inject import child_env
from phasescope.kpi.energy import DEFAULT_GAP_FACTOR
from phasescope.kpi.run_summary import summarize
from phasescope.kpi.training import SERIES_POINTS
from phasescope.schema import SIGNAL_COLUMN, TickBatch
from phasescope.sources.sampler import DEFAULT_INTERVAL_S
from phasescope.sources.scrape.poller import Poller
from phasescope.views.run_report import print_summary, render_html

if TYPE_CHECKING:
    from phasescope.live.loop import TickLoop
    from phasescope.sources.base import LiveSource

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class CommandNotFound(PhasescopeError):
    exit_code = 127


class DeviceWatch:
    """Watches `--source` while the command runs, through the live pipeline; a failure becomes a note.

    The readings go through `live/loop.py`'s `TickLoop` (its sampler thread, its one `FleetEnergyMeter`), as
    `top`, `serve` and `demo` take them, so a run's energy is metered by the same code on the same rule (the
    energy counter where a device has one, resets bridged by power; else power integrated only across
    intervals within `gap_factor` sample periods, the period learnt on the readings' own clock): what
    `phasescope cost energy` gives on the same samples. The loop's one sink keeps the running figures
    (utilisation, memory, power), so memory stays constant however long the command runs.
    """

    SINK = "summarising the device readings"  # the sink's name on a note, should it fail

    def __init__(self, spec: str, interval: float | None, gap_factor: float = DEFAULT_GAP_FACTOR) -> None:
        self.spec = spec
        self.interval = interval  # None: `live_interval`'s, once the source is open (a replay: its own rate)
        self.gap_factor = gap_factor
        self.stop = threading.Event()
        self.loop: TickLoop | None = None  # once the source is open
        self.stats: dict[str, _DeviceStats] = {}  # uuid -> running figures, in the order devices appeared
        self.notes: list[str] = []
        self._lock = threading.Lock()  # finish() may read while a late tick is still being taken
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.spec == "none":
            return
        self._thread = threading.Thread(target=self._run, name="phasescope-watch", daemon=True)
        self._thread.start()

    def attach(self, source: LiveSource) -> TickLoop:
        """The tick loop over the open `source` (the watch thread's; a test may hand in its own)."""
        from phasescope.live.loop import TickLoop  # here: `--source none` never loads the live layer
        from phasescope.live.state import LiveState

        self.interval = live_interval(source, self.interval, say=self.notes.append)
        self.loop = TickLoop(source, self.interval, LiveState(source.name), sinks=[(self.SINK, self._take)],
                             gap_factor=self.gap_factor)
        return self.loop

    def _take(self, tick: TickBatch) -> None:
        """The loop's sink: notes of the tick's events and each device's running figures."""
        for event in tick.events:  # e.g. a GPU lost mid-run: the summary says so, once
            if f"device: {event}" not in self.notes:
                self.notes.append(f"device: {event}")
        with self._lock:
            for row, dev in enumerate(tick.devices):
                stats = self.stats.get(dev.uuid)
                if stats is None:
                    stats = self.stats[dev.uuid] = _DeviceStats(dev.name)
                stats.add(tick.values[row], tick.time)

    def _run(self) -> None:
        try:
            # The live layer is loaded before the source opens: a replay's clock starts at its opening.
            import phasescope.live.loop  # noqa: F401
            from phasescope.sources.open import open_source

            source = open_source(self.spec)
        except Exception as exc:  # an unusable source must not stop the user's program
            self.notes.append(f"device not watched: {exc}")
            return
        try:
            loop = self.attach(source)
        except Exception as exc:
            with contextlib.suppress(Exception):
                source.close()
            self.notes.append(f"device not watched: {exc}")
            return
        loop.run(self.stop)  # closes the source; a source failing mid-run is `loop.failure`

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        loop = self.loop
        if loop is not None:
            if loop.failure:
                self.notes.append(f"device watch: {loop.failure}")
            self.notes += [e for e in loop.state.events() if e.startswith(self.SINK)]
        with self._lock:
            if not self.stats or loop is None:
                return {"source": self.spec, "devices": []}
            energy = loop.energy_results()
            out, partial = [], []
            for uuid, stats in self.stats.items():
                e = energy[uuid]
                row = e.to_dict()  # unmeasured energy (no power or energy reading) is null, never 0 J
                for key in ("device", "name", "phases"):  # said once per device; no phase split here
                    del row[key]
                if e.method != "none" and e.span_s > 0 and e.covered_s < e.span_s - 1e-9:
                    partial.append(f"{uuid} {e.coverage:.0%} of {e.span_s:.3g} s")
                out.append({"uuid": uuid, "name": stats.name, **stats.to_dict(),
                            "energy_j": row["joules"], "energy": row})
        if partial:  # one line however many GPUs: the per-device coverage is in the table and the JSON
            self.notes.append("energy covers only part of the time watched (readings missing or too far "
                              f"apart to bridge; not guessed): {', '.join(partial)}")
        return {"source": self.spec, "interval_s": self.interval, "devices": out}


class _DeviceStats:
    """Ticks seen, mean utilisation, peak memory and mean power of one device, from the finite readings; and
    those three over time for the run report's charts, thinned so memory stays bounded however long the run:
    every `stride`-th tick is kept, and when SERIES_POINTS are held every other one goes and the stride
    doubles."""

    SERIES = ("gpu_util", "mem_used", "power")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ticks = 0
        self.util = [0.0, 0]  # sum, count
        self.power = [0.0, 0]
        self.mem_max: float | None = None
        self.stride = 1
        self.series: dict[str, list[float | None]] = {"t": [], **{s: [] for s in self.SERIES}}

    def add(self, values: np.ndarray, t: float) -> None:
        if self.ticks % self.stride == 0:
            self.series["t"].append(t)
            for s in self.SERIES:
                v = float(values[SIGNAL_COLUMN[s]])
                self.series[s].append(v if math.isfinite(v) else None)
            if len(self.series["t"]) >= SERIES_POINTS:
                self.series = {k: v[::2] for k, v in self.series.items()}
                self.stride *= 2
        self.ticks += 1
        util, power, mem = (float(values[SIGNAL_COLUMN[s]]) for s in ("gpu_util", "power", "mem_used"))
        for acc, x in ((self.util, util), (self.power, power)):
            if math.isfinite(x):
                acc[0] += x
                acc[1] += 1
        if math.isfinite(mem):
            self.mem_max = mem if self.mem_max is None else max(self.mem_max, mem)

    def to_dict(self) -> dict[str, Any]:
        def mean(acc: list[float]) -> float | None:
            return acc[0] / acc[1] if acc[1] else None

        return {"samples": self.ticks, "gpu_util_mean": mean(self.util), "mem_used_max": self.mem_max,
                "power_mean": mean(self.power), "series": {k: list(v) for k, v in self.series.items()}}


def _tty_foreground() -> bool:
    """True when we are the terminal's foreground group: a Ctrl-C from it already reached the child too."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run_command(cmd: list[str], events_dir: Path, flush_s: float) -> tuple[int, float, float]:
    """Run `cmd` with the hooks injected; forward signals; return (exit code, start, end) in wall time."""
    env = child_env(events_dir, flush_s=flush_s)
    start = time.time()
    try:
        proc = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        raise CommandNotFound(f"{cmd[0]}: command not found") from None
    except PermissionError:
        raise CommandNotFound(f"{cmd[0]}: permission denied") from None

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _tty_foreground():
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {}
    for sig in _FORWARDED:
        with contextlib.suppress(ValueError, OSError):  # not the main thread: cannot forward
            previous[sig] = signal.signal(sig, forward)
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # Killed by a signal: the shell's convention, 128 + N.
    return (128 - code if code < 0 else code), start, time.time()



@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="HTML report to write (default: phasescope-run-<time>-<pid>.html in --report-dir; "
                   "'-' for none).")
@click.option("--report-dir", type=click.Path(file_okay=False),
              help="Folder for the default report (created when missing; default: the config's "
                   "[run] report_dir, else phasescope-runs).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the summary as JSON here.")
@interval_option("Device sampling interval, seconds (0.1 = 10 Hz).")
@click.option("--source", default="auto", show_default=True,
              help="Device to watch: auto, nvml, host, replay:PATH, or none.")
@click.option("--events", "events_path", type=click.Path(file_okay=False),
              help="Keep the raw hook events in this directory (default: a temporary one).")
@click.option("--idle-gap", type=Duration(), default=10.0, show_default=True,
              help="A pause longer than this (e.g. 10s) between forwards is an idle segment.")
@click.option("--scrape", "scrape_urls", multiple=True, metavar="URL",
              help="Also scrape this vLLM / TGI / SGLang / Triton /metrics endpoint while the command runs "
                   "and report its inference KPIs over that time (repeatable).")
@click.option("--scrape-interval", type=Duration(0.1, 3600, min_open=False), default=5.0, show_default=True,
              help="Time between scrapes of --scrape endpoints, e.g. 5s.")
@click.option("--quiet", is_flag=True, help="Do not print the summary.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def command(report_path: str | None, report_dir: str | None, json_path: str | None, interval: float | None,
            source: str,
            events_path: str | None, idle_gap: float, scrape_urls: tuple[str, ...], scrape_interval: float,
            quiet: bool, cmd: tuple[str, ...]) -> None:
    """Run CMD with PyTorch hooks injected and the device watched; print and write its phases and KPIs.

    Example: phasescope run --json run.json -- python train.py --epochs 1
    """
    # Outputs that cannot be written are refused now, not after the command has run for hours.
    from phasescope import config as configmod

    cfg = configmod.load(None)
    report_dir = report_dir or cfg.run.report_dir
    report = None if report_path == "-" else Path(report_path) if report_path else default_report(report_dir)
    outputs = [(Path(json_path), "--json")] if json_path else []
    outputs += [(report, "--report")] if report is not None else []
    for path, option in outputs:
        check_writable(path, option)
    if source.strip().lower() == "none":  # as the other kinds: any case, spaces around
        source = "none"
    gap_factor = DEFAULT_GAP_FACTOR
    if source != "none":  # a typo is refused now; a source that fails while running is only a note
        from phasescope.sources.open import check_spec

        check_spec(source)
        # The config's gap rule, as `cost energy` and `top` apply it: the same samples, the same figure.
        gap_factor = cfg.thresholds.energy_gap_factor
    watch = DeviceWatch(source, interval, gap_factor)
    with contextlib.ExitStack() as stack:
        if events_path:
            events_dir = _make_dir(Path(events_path), "--events",
                                   "a directory that can be created and written")
        else:
            events_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="phasescope-run-")))
        watch.start()
        pollers = [Poller(url, scrape_interval) for url in scrape_urls]
        for poller in pollers:
            poller.start()
        # The hooks flush on the command's own (wall) clock: a replay's rate has no bearing on it.
        flush_s = max(0.5, (interval or DEFAULT_INTERVAL_S) * 2)
        code, start, end = run_command(list(cmd), events_dir, flush_s=flush_s)
        telemetry = watch.finish()
        servers = [kpi for poller in pollers for kpi in poller.finish()]
        notes = list(watch.notes) + [n for poller in pollers for n in poller.notes]
        try:
            events = load_events(events_dir)
            # An --events directory kept from an earlier run: only this run's processes (their last write
            # is after it started) are summarised, not the earlier run's too.
            mine = [pe for pe in events if float((pe.meta.get("anchor") or [start])[0]) >= start]
            if len(mine) < len(events):
                left = len(events) - len(mine)
                notes.append(f"{left} process(es) of an earlier run in {events_dir} left out")
            doc: dict[str, Any] = summarize(mine, idle_gap_s=idle_gap)
        except Exception as exc:  # the command's exit code must survive a bad or partial event log
            notes.append(f"hook events not summarised: {type(exc).__name__}: {exc}")
            doc = summarize([], idle_gap_s=idle_gap)
    if not doc["processes"]:
        notes.append("no PyTorch forward or optimizer step was seen; is phasescope importable by the "
                     "command's "
                     "Python, and does it import torch?")
    doc.update(command=list(cmd), exit_code=code, start=start, end=end, duration_s=end - start,
               telemetry=telemetry, servers=servers, notes=notes)
    if not quiet:
        print_summary(doc, Console(stderr=True))
    # A write that fails now (disk full) is one line; the other output is still written and the command's
    # exit code still returned.
    if json_path:
        write_output(Path(json_path), "--json", json.dumps(doc, indent=1, default=_json_default) + "\n")
    if report is not None and write_output(report, "--report", render_html(doc)) and not quiet:
        click.echo(f"report: {report}", err=True)
    sys.exit(code)


def _make_dir(path: Path, option: str, expected: str) -> Path:
    """`path`, created with its parents; one InputError line (naming `option`) when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(path, option, expected, exc.strerror or str(exc)) from None
    return path


def default_report(folder: str) -> Path:
    """`folder`/phasescope-run-<local time>-<pid>.html, the folder created: the PID keeps two runs started in
    the same second apart (they used to write one file), and the folder keeps reports out of the code's."""
    path = _make_dir(Path(folder), "--report-dir", "a folder that can be created")
    return path / f"phasescope-run-{time.strftime('%Y%m%d-%H%M%S', time.localtime())}-{os.getpid()}.html"


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
