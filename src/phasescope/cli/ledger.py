"""`phasescope ledger -o FILE --source SPEC`: record telemetry into a hash-chained, signed ledger.

The recorder for evidence: every `--batch` ticks each device's samples become one chained record, a
Merkle root over the new records is signed every `--root-every` records, and stopping (Ctrl-C or
`--duration`) writes the closing signed root. An existing ledger is continued (same key only).
Check one with `phasescope audit FILE --chain-only`, or verify a claim on it with
`phasescope verify --input FILE --declare ... --bundle OUT`.
"""

from __future__ import annotations

import threading

import click

from phasescope.cli._options import duration_option, interval_option, key_option, live_interval
from phasescope.sources.open import SPEC_HELP


@click.command("ledger")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=str),
    help="Ledger file (JSON Lines); appended to when it exists.",
)
@click.option("--source", default="auto", show_default=True, help=SPEC_HELP)
@duration_option("Stop after this many seconds (default: until Ctrl-C).")
@interval_option("Seconds between samples.")
@click.option(
    "--batch",
    "batch_rows",
    type=click.IntRange(min=1),
    default=60,
    show_default=True,
    help="Samples per device per chained record.",
)
@click.option(
    "--root-every",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Records per signed Merkle root.",
)
@key_option("Signing key name.")
def command(
    output: str,
    source: str,
    duration: float | None,
    interval: float | None,
    batch_rows: int,
    root_every: int,
    key_name: str,
) -> None:
    """Record telemetry into an append-only, hash-chained, Ed25519-signed ledger.

    \b
    Example:
      phasescope ledger -o evidence-ledger.jsonl --source auto --duration 3600
    """
    from phasescope.verify import require_cryptography

    require_cryptography()
    from phasescope.classify.model import PhaseModel
    from phasescope.sources.open import open_source
    from phasescope.sources.sampler import Sampler, until_played_out
    from phasescope.verify.keys import load_or_create
    from phasescope.verify.ledger import LedgerWriter

    key, key_file = load_or_create(key_name)
    src = open_source(source)
    stop = threading.Event()
    try:
        writer = LedgerWriter(
            output,
            key,
            model=PhaseModel.load(),
            meta={"command": "ledger", "source": source},
            root_every=root_every,
            batch_rows=batch_rows,
        )
    except BaseException:  # a ledger that cannot be written (a link to nothing, another key's): release
        src.close()
        raise

    try:
        stats = Sampler(src, live_interval(src, interval)).run(
            until_played_out(src, writer.on_tick, stop), duration=duration, stop=stop
        )
    except KeyboardInterrupt:
        stats = None
    finally:
        writer.close()
        src.close()
    ticks = "?" if stats is None else stats.ticks
    click.echo(
        f"ledger: {output}: {ticks} ticks, {writer.seq} records, signed with {key_file.with_suffix('.pub')}"
    )
