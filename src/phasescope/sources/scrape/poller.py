"""Scrape a /metrics endpoint in the background while something else runs (`phasescope run --scrape`)."""

from __future__ import annotations

import threading
from typing import Any

from phasescope.errors import PhasescopeError
from phasescope.sources.scrape.kpis import server_kpis
from phasescope.sources.scrape.parse import Scrape, fetch


class Poller:
    """Keeps the first and the latest good scrape of `url`; failures become notes, never errors, so a server
    that is slow to come up (or goes away) does not stop the command being run."""

    def __init__(self, url: str, interval: float = 5.0, timeout: float = 5.0) -> None:
        self.url = url
        self.interval = interval
        self.timeout = timeout
        self.first: Scrape | None = None
        self.last: Scrape | None = None
        self.notes: list[str] = []
        self._errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        try:
            s = fetch(self.url, self.timeout)
        except PhasescopeError as exc:
            self._errors += 1
            if self._errors == 1:
                self.notes.append(str(exc))
            return
        if self.first is None:
            self.first = s
        self.last = s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="phasescope-scrape", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.poll_once()
        while not self._stop.wait(self.interval):
            self.poll_once()

    def finish(self) -> list[dict[str, Any]]:
        """Stop, take a last scrape, and return the KPIs over the whole time between first and last."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)
        self.poll_once()
        if self._errors > 1:
            self.notes.append(f"{self.url}: {self._errors} scrapes failed")
        if self.last is None:
            return []
        prev = self.first if self.first is not self.last else None
        kpis = server_kpis(self.last, prev)
        if not kpis:
            self.notes.append(f"{self.url}: no vLLM, TGI, SGLang or Triton metrics in the scrape")
        return kpis
