"""`phasescope verify --declare CLAIM`: check a declared use against telemetry, per device and window.

Telemetry comes from `--input` files (any format `classify` reads, or a ledger), from the live store
(`--since/--until`), or from a live source watched now (`--source SPEC --duration S`). `--bundle OUT`
writes a signed evidence bundle for `phasescope audit`. Exit code: 1 when any window is inconsistent
(3 with `--strict` when none is but some are unverifiable), 0 otherwise.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

import click

from phasescope.cli._options import (
    Duration,
    duration_option,
    interval_option,
    key_option,
    live_interval,
    model_option,
)
from phasescope.errors import InputError, PhasescopeError
from phasescope.schema import TickBatch

EXIT_INCONSISTENT = 1
EXIT_UNVERIFIABLE = 3


class Inconsistent(PhasescopeError):
    exit_code = EXIT_INCONSISTENT


class Unverifiable(PhasescopeError):
    exit_code = EXIT_UNVERIFIABLE


def _fmt_flop(v: Any) -> str:
    return "-" if v is None or not isinstance(v, (int, float)) or not math.isfinite(v) else f"{v:.2g}"


def _short_dev(uuid: str) -> str:
    return uuid if len(uuid) <= 14 else uuid[:6] + "…" + uuid[-6:]


def _when(t: float) -> str:
    """UTC for wall-clock times; a log's own clock (seconds since something) stays a number."""
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t)) if t > 1e9 else f"t={t:.0f}"


def print_table(verdicts: Sequence[dict[str, Any]], total: dict[str, Any] | None, model_version: str) -> None:
    from rich.console import Console
    from rich.table import Table

    styles = {"consistent": "green", "inconsistent": "bold red", "unverifiable": "yellow"}
    console = Console()
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="dim")
    show_flop = total is not None  # the FLOP column only for a FLOP claim: narrow terminals need the room
    cols = ["device", "window", "verdict", "p(train)", "cover"] + (["FLOP [band]"] if show_flop else [])
    for col in cols:
        table.add_column(col, no_wrap=True, min_width=12 if col == "verdict" else None)
    # No min_width: where the fixed columns leave less than it, rich would cut every line of the reason at
    # the terminal's edge instead of folding it.
    table.add_column("why", overflow="fold", ratio=1)
    for v in verdicts:
        p = (v.get("probabilities") or {}).get("training")
        f = v["flop"]
        cells = [
            _short_dev(v["device"]),
            f"{_when(v['start'])} +{v['end'] - v['start']:.0f}s",
            f"[{styles[v['verdict']]}]{v['verdict']}[/]",
            "-" if p is None else f"{p:.2f}",
            f"{(v['coverage'].get('covered_fraction') or 0):.0%}",
        ]
        if show_flop:
            cells.append(
                f"{_fmt_flop(f.get('estimate'))} [{_fmt_flop(f.get('lower'))}..{_fmt_flop(f.get('upper'))}]"
            )
        table.add_row(*cells, "; ".join(v["reasons"]))
    console.print(table)
    if total:
        tf = total["flop"]
        line = (
            f"total FLOP {_fmt_flop(tf.get('estimate'))} [{_fmt_flop(tf.get('lower'))}.."
            f"{_fmt_flop(tf.get('upper'))}]; 1e25: {total['thresholds']['1e+25']}, "
            f"1e26: {total['thresholds']['1e+26']}"
        )
        if "versus_budget" in total:
            line += f"; declared budget {total['budget']:.3g}: {total['versus_budget']}"
        console.print(line)
    if verdicts:
        console.print(f"[dim]model {model_version}. {verdicts[0]['assurance']}[/]")


@click.command("verify")
@click.option(
    "--declare",
    "declare",
    required=True,
    metavar="CLAIM",
    help="inference | idle | training | no-training | max-flop=N",
)
@click.option(
    "--input",
    "inputs",
    multiple=True,
    type=click.Path(dir_okay=True, path_type=str),
    help="Recording, log or ledger to check (repeatable).",
)
@click.option("--format", "fmt", default="auto", show_default=True, help="Reader for --input files.")
@click.option(
    "--devices",
    "devices",
    multiple=True,
    metavar="UUID",
    help="Only these devices (repeatable, or comma-separated).",
)
@click.option("--since", default=None, help="Live window start: Unix s, ISO 8601 or an age (10m, 2h).")
@click.option("--until", default=None, help="Live window end (default: now).")
@click.option(
    "--store",
    "store_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=str),
    help="Live store to read --since/--until from (default: the agent's).",
)
@click.option(
    "--source", default=None, help="Watch a live source now: auto, nvml, host or replay:PATH?speed=N."
)
@duration_option("Seconds to watch --source.")
@interval_option("Sampling interval for --source, seconds.")
@click.option(
    "--window",
    "window_s",
    type=Duration(),
    default=None,
    help="Verdict window length, e.g. 10m (default: one verdict per device over the whole span).",
)
@model_option("Model file (default: the shipped model).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per verdict per line, then a summary.")
@click.option(
    "--bundle",
    "bundle",
    default=None,
    type=click.Path(dir_okay=False, path_type=str),
    help="Write a signed evidence bundle here (for phasescope audit).",
)
@key_option("Name of the signing key (generated on first use, stored 0600).")
@click.option(
    "--strict", is_flag=True, help="Exit 3 when no window is inconsistent but some are unverifiable."
)
def command(
    declare: str,
    inputs: tuple[str, ...],
    fmt: str,
    devices: tuple[str, ...],
    since: str | None,
    until: str | None,
    store_path: str | None,
    source: str | None,
    duration: float | None,
    interval: float | None,
    window_s: float | None,
    model_path: str | None,
    as_json: bool,
    bundle: str | None,
    key_name: str,
    strict: bool,
) -> None:
    """Check a declared use (e.g. inference only) against telemetry: consistent, inconsistent or unverifiable.

    \b
    Examples:
      phasescope verify --declare no-training --input run.parquet
      phasescope verify --declare inference --since 2h --bundle evidence.jsonl
      phasescope verify --declare max-flop=1e21 --input train.csv --json
    """
    from phasescope.classify.model import PhaseModel
    from phasescope.verify import inputs as inp
    from phasescope.verify.check import CheckParams, check_traces, flop_total
    from phasescope.verify.claims import parse_claim

    claim = parse_claim(declare)
    modes = sum([bool(inputs), since is not None or until is not None, source is not None])
    if modes != 1:
        raise InputError(
            "verify", "scope", "exactly one of --input, --since/--until or --source", f"{modes} given"
        )
    if source is not None and duration is None:
        raise InputError("verify", "--duration", "seconds to watch --source", "missing")
    model = PhaseModel.load(model_path)
    params = CheckParams()
    writer: Any = None  # verify.ledger.LedgerWriter, imported only for --bundle (needs cryptography)
    # What a live source's processes say they are (sources/process_kind.py): listed, unverified, never judged
    context: dict[str, dict[str, object]] = {}
    meta: dict[str, Any] = {"claim": claim.text, "command": "verify"}
    if bundle:
        from phasescope.verify import require_cryptography

        require_cryptography()
        from phasescope.verify.keys import load_or_create
        from phasescope.verify.ledger import LedgerWriter, require_new

        require_new(bundle, "--bundle")  # before any work: an existing file, or a link to one or to nothing
        key, _ = load_or_create(key_name)
    wanted = {d.strip() for item in devices for d in item.split(",") if d.strip()}
    if inputs:
        traces, sources = inp.read_inputs(inputs, fmt)
        meta["inputs"] = sources
    elif source is not None:
        from phasescope.sources.open import open_source

        src = open_source(source)
        if bundle:
            writer = LedgerWriter(
                bundle, key, model=model, meta={**meta, "source": source}, create_only=True
            )
        assert duration is not None
        seen: dict[str, set[int]] = {}  # device -> PIDs on it: context only, never in the verdict or bundle

        def on_tick(batch: TickBatch) -> None:
            if writer is not None:
                writer.on_tick(batch)
            for p in batch.processes:
                if p.device_uuid:
                    seen.setdefault(p.device_uuid, set()).add(p.pid)

        try:
            traces = inp.sample_live(src, duration, live_interval(src, interval), on_tick=on_tick)
        finally:
            src.close()
        if getattr(src, "local_processes", False):  # this host's PIDs: they can be asked what they are
            from phasescope.sources.process_kind import claims

            context = claims(seen)
    else:
        now = time.time()
        lo = inp.parse_time(since, "--since", now) if since else None
        hi = inp.parse_time(until, "--until", now) if until else now
        traces = inp.read_store(store_path, lo, hi)
        meta["window"] = {"since": lo, "until": hi}
    if wanted:
        unknown = wanted - {t.device.uuid for t in traces}
        if unknown:
            raise InputError("--devices", "uuid", "a device in the telemetry", sorted(unknown)[0])
        traces = [t for t in traces if t.device.uuid in wanted]
    traces = [t for t in traces if len(t)]
    if not traces:
        raise InputError("verify", "telemetry", "at least one device with samples in scope", "none")
    verdicts = check_traces(traces, claim, model, window_s, params)
    rows = [v.to_dict() for v in verdicts]
    total = flop_total(verdicts, claim.max_flop)
    if bundle:
        if writer is None:
            writer = LedgerWriter(bundle, key, model=model, meta=meta, create_only=True)
            for t in traces:
                writer.append_trace(t)
        else:
            writer.flush_ticks()
        for r in rows:
            writer.append_verdict(r, claim.text, window_s, params.to_dict())
        writer.close()
    counts = {k: sum(r["verdict"] == k for r in rows) for k in ("consistent", "inconsistent", "unverifiable")}
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, allow_nan=False))
        click.echo(
            json.dumps(
                {
                    "summary": counts,
                    "claim": claim.text,
                    "model_version": model.version,
                    "flop_total": total,
                    "bundle": bundle,
                    "process_context": context,
                },
                allow_nan=False,
            )
        )
    else:
        print_table(rows, total if claim.kind == "max-flop" else None, model.version)
        for uuid, c in context.items():
            engines = " + ".join(str(e) for e in c["engines"])  # type: ignore[attr-defined]  # a list
            click.echo(f"context (unverified, not part of the verdict): {_short_dev(uuid)}: processes name "
                       f"themselves {engines}" + (f" ({c['role']})" if c["role"] else ""))
        if bundle:
            click.echo(f"bundle: {bundle} (check it with: phasescope audit {bundle} --pubkey KEY.pub)")
    failed = counts["inconsistent"] or (claim.kind == "max-flop" and total.get("versus_budget") == "above")
    if failed:
        raise Inconsistent(
            f"'{claim.text}' is inconsistent with the telemetry in {counts['inconsistent']} of "
            f"{len(rows)} device-windows"
        )
    if strict and (
        counts["unverifiable"] or (claim.kind == "max-flop" and total.get("versus_budget") != "below")
    ):
        raise Unverifiable(
            f"'{claim.text}' could not be verified in {counts['unverifiable']} of {len(rows)} device-windows"
        )
