"""Progress for the long classifier commands (`eval`, `train-model`): a rich bar on a terminal, plain lines
otherwise (CI logs, pipes), nothing when quiet. Each step is one fitted fold; totals are known up front."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


class Steps:
    """Callable `step(message)`: advance by one and show `message`."""

    def __init__(self, bar: Any = None, task: Any = None, stream: IO[str] | None = None) -> None:
        self._bar, self._task, self._stream = bar, task, stream
        self.done = 0

    def __call__(self, message: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=message)
        elif self._stream is not None:
            print(f"  {message}", file=self._stream, flush=True)

    def phase(self, message: str) -> None:
        """Say what is happening without counting a step (loading, feature extraction)."""
        if self._bar is not None:
            self._bar.update(self._task, description=message)
        elif self._stream is not None:
            print(f"  {message}", file=self._stream, flush=True)


@contextmanager
def steps(total: int, quiet: bool = False, stream: IO[str] | None = None) -> Iterator[Steps]:
    out = stream or sys.stderr
    if quiet:
        yield Steps()
        return
    if not out.isatty():
        yield Steps(stream=out)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description:<48}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=out),
        transient=True,
    )
    with bar:
        task = bar.add_task("starting", total=max(total, 1))
        yield Steps(bar, task)
