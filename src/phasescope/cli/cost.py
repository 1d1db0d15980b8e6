"""`phasescope cost`: energy and cost of recordings, and when inference spend overtakes training spend."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import click

from phasescope import config as configmod
from phasescope.cli._options import FiniteFloatRange, price_options
from phasescope.errors import InputError, PhasescopeError
from phasescope.kpi.cost import (
    Cost,
    Prices,
    cost_per_query,
    crossover,
    device_cost,
    mig_prices,
    phase_costs,
    total_cost,
)
from phasescope.kpi.energy import DeviceEnergy, device_energy
from phasescope.schema import Trace
from phasescope.views.display import MISSING, fmt_usd
from phasescope.views.palette import look

# Also used by `report` and `top`.
_price_options = price_options(
    "USD per GPU-hour, for every device (over the config file and its per-model prices).",
    "USD per kWh, for every device (over the config file and its per-model prices).",
    "Config file (default: $PHASESCOPE_CONFIG or ~/.config/phasescope/config.toml).",
)


def _config(
    config_path: str | None, price_gpu_hour: float | None, price_kwh: float | None
) -> configmod.Config:
    return configmod.load(config_path).override(
        prices__usd_per_gpu_hour=price_gpu_hour, prices__usd_per_kwh=price_kwh
    )


def _prices(
    cfg: configmod.Config, traces: Sequence[Trace], flags: Prices
) -> tuple[dict[str, Prices], dict[str, str]]:
    """Per device: the file's prices for its model, with each price given as a flag put over them, then
    shared out over MIG instances (kpi/cost.py `mig_shares`); and the note saying each MIG row's share."""
    out = {}
    for t in traces:
        p = cfg.prices.for_device(t.device.name)
        out[t.device.uuid] = Prices(
            p.usd_per_gpu_hour if flags.usd_per_gpu_hour is None else flags.usd_per_gpu_hour,
            p.usd_per_kwh if flags.usd_per_kwh is None else flags.usd_per_kwh,
        )
    return mig_prices(out, [t.device for t in traces])


def _read(paths: Sequence[str], fmt: str) -> list[Trace]:
    from phasescope.sources.replay import read

    traces: list[Trace] = []
    for path in paths:
        traces.extend(read(path, fmt))
    return traces


def _segments(trace: Trace, model: Any) -> tuple[list[Any] | None, str]:
    """Phase segments from the classifier, or None and why not."""
    from phasescope.classify.decide import segments

    try:
        pred = model.predict_trace(trace)
    except (PhasescopeError, ValueError) as exc:
        return None, f"not classified: {exc}"
    return list(segments(pred)), ""


def _load_model() -> tuple[Any, str]:
    try:
        from phasescope.classify.decide import segments  # noqa: F401  (checks the decider is there too)
        from phasescope.classify.model import PhaseModel

        return PhaseModel.load(), ""
    except Exception as exc:  # an optional part: energy must still be reported, with the reason said
        return None, f"classifier not available ({type(exc).__name__}: {exc})"


def _cost_text(c: Cost) -> str:
    if c.total_usd is None:
        return ""
    parts = []
    if c.time_usd is not None:
        parts.append(f"time {fmt_usd(c.time_usd)}")
    if c.energy_usd is not None:
        parts.append(f"energy {fmt_usd(c.energy_usd)}")
    return f"  cost {fmt_usd(c.total_usd)} ({', '.join(parts)})"


def _measured(
    paths: Sequence[str], fmt: str, cfg: configmod.Config, flags: Prices
) -> tuple[Cost, list[DeviceEnergy], dict[str, Prices]]:
    traces = _read(paths, fmt)
    results = [device_energy(t, gap_factor=cfg.thresholds.energy_gap_factor) for t in traces]
    prices, _ = _prices(cfg, traces, flags)
    if not any(p.priced for p in prices.values()):
        raise InputError(
            paths[0], "prices", "--price-gpu-hour or --price-kwh (or [prices] in the config file)", "none set"
        )
    total = total_cost(results, prices)
    if total.total_usd is None:  # only a $/kWh price, and no device has power or energy to apply it to
        raise InputError(
            paths[0], "energy", "a power or energy signal to price per kWh (or a --price-gpu-hour)",
            "none in the recording(s)",
        )
    return total, results, prices


@click.group(name="cost")
def command() -> None:
    """Energy and cost of recordings, and the training/inference cost crossover.

    \b
    Examples:
      phasescope cost energy run.parquet --price-kwh 0.12
      phasescope cost crossover --train-cost 10e6 --queries-per-day 1e6 --cost-per-query 0.001
    """


@command.command(name="crossover")
@click.option("--train-cost", type=FiniteFloatRange(min=0), default=None, help="Training spend in USD.")
@click.option(
    "--train-recording",
    multiple=True,
    type=click.Path(),
    help="Measure the training spend from this recording or log instead (whole file, all devices).",
)
@click.option(
    "--queries-per-day", type=FiniteFloatRange(min=0), required=True, help="Inference queries per day."
)
@click.option(
    "--cost-per-query",
    "cost_per_query_usd",
    type=FiniteFloatRange(min=0),
    default=None,
    help="USD per inference query.",
)
@click.option(
    "--inference-recording",
    multiple=True,
    type=click.Path(),
    help="Measure the cost per query from this recording or log instead; needs --requests.",
)
@click.option(
    "--requests",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Requests served during --inference-recording.",
)
@click.option("--format", "fmt", default="auto", show_default=True, help="Format of the recordings.")
@_price_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def crossover_cmd(
    train_cost: float | None,
    train_recording: tuple[str, ...],
    queries_per_day: float,
    cost_per_query_usd: float | None,
    inference_recording: tuple[str, ...],
    requests: float | None,
    fmt: str,
    price_gpu_hour: float | None,
    price_kwh: float | None,
    config_path: str | None,
    as_json: bool,
) -> None:
    """Days until cumulative inference spend passes the training spend: train cost / (queries/day x $/query).

    Either figure can be measured: --train-recording prices a training recording, and --inference-recording
    with --requests gives the measured cost per query, both at the configured prices.

    \b
    Examples:
      phasescope cost crossover --train-cost 10e6 --queries-per-day 1e6 --cost-per-query 0.001   # 10,000 days
      phasescope cost crossover --train-recording train.parquet --queries-per-day 5e4 \\
          --inference-recording serve.parquet --requests 12000 --price-gpu-hour 2.5 --price-kwh 0.12
    """
    flags = Prices(price_gpu_hour, price_kwh)
    cfg = _config(config_path, price_gpu_hour, price_kwh)
    if (train_cost is None) == (not train_recording):
        raise click.UsageError("give exactly one of --train-cost and --train-recording")
    if (cost_per_query_usd is None) == (not inference_recording):
        raise click.UsageError("give exactly one of --cost-per-query and --inference-recording")
    source = {"train_cost": "given", "cost_per_query": "given"}
    if train_recording:
        measured, _, _ = _measured(train_recording, fmt, cfg, flags)
        train_cost = measured.total_usd
        source["train_cost"] = f"measured from {len(train_recording)} recording(s)"
    if inference_recording:
        if requests is None:
            raise click.UsageError("--inference-recording needs --requests (requests served in it)")
        _, results, prices = _measured(inference_recording, fmt, cfg, flags)
        per_query = cost_per_query(results, requests, prices)
        cost_per_query_usd = per_query.total_usd
        source["cost_per_query"] = (
            f"measured from {len(inference_recording)} recording(s), {requests:g} requests"
        )
    assert train_cost is not None and cost_per_query_usd is not None  # set above, priced by _measured
    days = crossover(train_cost, queries_per_day, cost_per_query_usd)
    daily = queries_per_day * cost_per_query_usd
    if as_json:
        click.echo(
            json.dumps(
                {
                    "days": None if math.isinf(days) else days,
                    "train_cost_usd": train_cost,
                    "queries_per_day": queries_per_day,
                    "cost_per_query_usd": cost_per_query_usd,
                    "inference_usd_per_day": daily,
                    "source": source,
                }
            )
        )
        return
    click.echo(f"training spend     {fmt_usd(train_cost)} ({source['train_cost']})")
    click.echo(f"cost per query     {fmt_usd(cost_per_query_usd)} ({source['cost_per_query']})")
    click.echo(f"inference per day  {fmt_usd(daily)} at {queries_per_day:,.0f} queries/day")
    if math.isinf(days):
        click.echo("crossover          never (inference costs nothing per day)")
    else:
        click.echo(f"crossover          {days:,.1f} days ({days / 365.25:,.2f} years)")


@command.command(name="energy")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--format", "fmt", default="auto", show_default=True, help="Input format (auto-detected by default)."
)
@click.option(
    "--phases/--no-phases",
    default=True,
    show_default=True,
    help="Split by phase with the shipped classifier, when it is installed.",
)
@_price_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per device per line.")
def energy_cmd(
    paths: tuple[str, ...],
    fmt: str,
    phases: bool,
    price_gpu_hour: float | None,
    price_kwh: float | None,
    config_path: str | None,
    as_json: bool,
) -> None:
    """Energy per device (and per phase), the method used (counter or integrated power), coverage and cost.

    The energy counter is used where the file has one, else power is integrated over time; gaps longer than a
    few sample periods are not bridged, and coverage says how much of the span the figure covers.

    \b
    Examples:
      phasescope cost energy run.parquet
      phasescope cost energy nvml.csv --price-gpu-hour 2.5 --price-kwh 0.12 --json
    """
    cfg = _config(config_path, price_gpu_hour, price_kwh)
    flags = Prices(price_gpu_hour, price_kwh)
    traces = _read(paths, fmt)
    model, why_not = _load_model() if phases else (None, "--no-phases")
    results: list[DeviceEnergy] = []
    notes: list[str] = []
    for trace in traces:
        segs, note = _segments(trace, model) if model is not None else (None, why_not)
        notes.append(note)
        results.append(device_energy(trace, segs, gap_factor=cfg.thresholds.energy_gap_factor))
    prices, mig_notes = _prices(cfg, traces, flags)
    for trace, r, note in zip(traces, results, notes, strict=True):
        cost = device_cost(r, prices[r.device])
        by_phase = phase_costs([r], prices)
        if as_json:
            row = r.to_dict()
            row["path"] = trace.meta.get("source_path", "")
            row["cost"] = cost.to_dict()
            row["phase_costs"] = {k: v.to_dict() for k, v in by_phase.items()}
            row["phases_note"] = note
            row["mig_note"] = mig_notes.get(r.device, "")
            click.echo(json.dumps(row))
            continue
        idx = trace.meta.get("gpu_index", trace.device.index)
        label = (
            f"{trace.meta.get('source_path', '')} gpu {idx if idx is not None else '?'} {r.device}".strip()
        )
        click.echo(label)
        click.echo(
            f"  {_joules(r.measured_joules)} J ({_kwh(r.measured_kwh)} kWh)  method {r.method}  "
            f"coverage {_pct(r.coverage)} "
            f"of {r.span_s:,.0f} s  mean {_watts(r.mean_power_w)}"
            + (f"  counter resets {r.resets}" if r.resets else "")
            + _cost_text(cost)
        )
        if r.device in mig_notes:
            click.echo(f"  {mig_notes[r.device]}")
        if note:
            click.echo(f"  whole trace only: {note}")
        for name, pe in sorted(r.phases.items(), key=lambda kv: -kv[1].seconds):
            click.echo(  # the palette's word for the label, as every view writes it
                f"  {look(name).name:<12} {_joules(pe.measured_joules):>14} J  {pe.seconds:>9,.0f} s  "
                f"coverage {_pct(pe.coverage)}"
                + _cost_text(by_phase[name])
            )


def _joules(x: float | None) -> str:
    return MISSING if x is None else f"{x:,.0f}"


def _kwh(x: float | None) -> str:
    return MISSING if x is None else f"{x:.4f}"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def _watts(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:,.1f} W"
