"""`phasescope report INPUT... [-o report.html]`: one self-contained HTML report of recordings or logs."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from phasescope.cli.cost import _config, _price_options
from phasescope.errors import InputError
from phasescope.kpi.cost import Prices
from phasescope.schema import Trace


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (one step per device, plus reading and writing); a no-op when disabled."""
    if not enabled:
        yield lambda _msg: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # markup=False: a device name or uuid such as "GPU-[/]x" is text, not rich markup (which raised).
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("report", total=total)

        def step(msg: str) -> None:
            bar.update(task, advance=1, description=msg[:60])

        yield step


def _short_name(trace: Trace) -> str:
    """'#0 NVIDIA H100 (PCIe)', '#1 device'; without name and index (a pod's log): its uuid."""
    dev = trace.device
    if dev.index is None:
        return dev.name or dev.uuid
    return f"#{dev.index} {dev.name or 'device'}"


@click.command("report")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", default="phasescope-report.html", show_default=True,
              type=click.Path(dir_okay=False, path_type=str), help="HTML file to write.")
@click.option("--format", "fmt", default="auto", show_default=True,
              help="Input format: auto, or a reader name (see docs/FORMATS.md), with options after ':'.")
@click.option("--model", "model_path", default=None, type=click.Path(dir_okay=False, path_type=str),
              help="Phase model file (default: the model shipped with phasescope).")
@click.option("--events", "events_dir", default=None, type=click.Path(path_type=str),
              help="Hook events directory (from `phasescope run` / PHASESCOPE_EVENTS_DIR): adds step time, "
                   "samples/s, MFU, requests/s and latency.")
@_price_options
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
def command(inputs: tuple[str, ...], output: str, fmt: str, model_path: str | None, events_dir: str | None,
            price_gpu_hour: float | None, price_kwh: float | None, config_path: str | None,
            progress: bool | None) -> None:
    """Write one HTML file (plotly inline, opens with no network): timelines with phase segments, the
    features that drove each segment, KPIs, and energy and cost per phase.

    \b
    Examples:
      phasescope report run.parquet -o run.html
      phasescope report nvml.csv --price-gpu-hour 2.5 --price-kwh 0.12
      phasescope report train.csv --events ./events   # with hook KPIs from `phasescope run`
    """
    from phasescope.report import build, render
    from phasescope.report.data import load_model
    from phasescope.sources.replay import read

    cfg = _config(config_path, price_gpu_hour, price_kwh)
    out = Path(output)
    if out.parent and not out.parent.is_dir():
        raise InputError(output, "output", "a file in an existing directory", "no such directory")
    hooks = None
    if events_dir is not None:
        from phasescope.instrument.events import load_events
        from phasescope.kpi.run_summary import summarize

        hooks = summarize(load_events(events_dir))
    loaded: list[tuple[str, list[Trace]]] = [(p, read(p, fmt)) for p in inputs]
    model, note = load_model(model_path)
    n_devices = sum(len(t) for _, t in loaded)
    show = sys.stderr.isatty() if progress is None else progress

    def prices(trace: Trace) -> Prices:
        p = cfg.prices.for_device(trace.device.name)
        return Prices(p.usd_per_gpu_hour if price_gpu_hour is None else price_gpu_hour,
                      p.usd_per_kwh if price_kwh is None else price_kwh)

    with _progress(show, n_devices + 1) as step:
        data = build(loaded, model=model, model_note=note, prices=prices,
                     gap_factor=cfg.thresholds.energy_gap_factor, hooks=hooks,
                     progress=lambda dev: step(f"classifying {dev}"))
        page = render(data)
        step("writing")
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise InputError(output, "output", "a writable file", exc.strerror or str(exc)) from None
    def where(path: str) -> str:  # several files (often of one GPU): say which file each device is from
        return f"{Path(path).name} " if len(inputs) > 1 else ""

    labels = ", ".join(f"{where(d.path)}{_short_name(d.trace)}: {d.label}" for d in data.devices[:8])
    more = f" (+{len(data.devices) - 8} more)" if len(data.devices) > 8 else ""
    click.echo(f"wrote {out} ({len(page) / 1e6:.1f} MB, {len(data.devices)} device(s): {labels}{more})")
