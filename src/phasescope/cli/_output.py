"""Output files a live command writes after it has run (`run --json/--report`, `scrape --json`).

A path that cannot be written is refused before the work starts, not after it (a training run of hours);
a write that still fails at the end (disk full) is one line, and what else was to be written still is.
"""

from __future__ import annotations

from pathlib import Path

import click

from phasescope.errors import InputError


def check_writable(path: Path, option: str) -> None:
    """InputError unless `path` can be written (tried by opening it for append; a new file is removed)."""
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise InputError(path, option, "a writable file path", exc.strerror or str(exc)) from None
    if not existed:
        path.unlink(missing_ok=True)


def write_output(path: Path, option: str, text: str) -> bool:
    """Write `text` to `path`; False after one line on stderr when it cannot be written."""
    try:
        path.write_text(text)
    except OSError as exc:
        error = InputError(path, option, "a writable file path", exc.strerror or str(exc))
        click.echo(f"phasescope: {error}", err=True)
        return False
    return True
