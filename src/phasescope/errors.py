"""Errors that reach the user as one clear line: what, where, and what was expected."""

from __future__ import annotations

from pathlib import Path


class PhasescopeError(Exception):
    """Base for errors the command line turns into one line and a non-zero exit."""

    exit_code = 2


class InputError(PhasescopeError, ValueError):
    """Bad input: names the file, the row or field, and what was expected."""

    def __init__(self, path: str | Path, where: str, expected: str, got: object = None) -> None:
        self.path = str(path)
        self.where = where
        self.expected = expected
        self.got = got
        got_txt = "" if got is None else f", got {_short(got)}"
        super().__init__(f"{self.path}: {where}: expected {expected}{got_txt}")


class SourceError(PhasescopeError):
    """A telemetry source cannot be opened or read (missing library, lost device)."""


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
