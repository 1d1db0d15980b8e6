"""Per GPU, what its processes say they are (sources/process_kind.py), beside the telemetry's phase; and the
serving engines among them scraped with no configuration.

Context only: the phase stays the telemetry's. Where the processes' claim contradicts it (a vLLM server
on a GPU the telemetry calls training, a trainer on one it calls inference) the device is marked as
disagreeing: the TUI, the page and `phasescope_gpu_phase_disagreement` show it, and an alert can fire on it.
Only this host's processes are read (a replay's or another namespace's PIDs name other processes here).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phasescope.sources.process_kind import Evidence, EvidenceCache, device_role, disagrees, engines_named

if TYPE_CHECKING:
    from phasescope.live.annotate import ScrapeKpiReader
    from phasescope.live.state import LiveState


@dataclass(frozen=True)
class DeviceEvidence:
    """What one GPU's processes claim: engine names (sorted), one role or None, and whether that contradicts
    the telemetry's phase."""

    engines: tuple[str, ...] = ()
    role: str | None = None
    disagrees: bool = False

    def to_dict(self) -> dict[str, object]:
        return {"engines": list(self.engines), "role": self.role, "disagrees": self.disagrees}


def auto_scrape_url(ev: Evidence) -> str | None:
    """Where a recognised engine's metrics are: its first listening port, the engine's default first."""
    if ev.scrape is None or not ev.metrics_ports:
        return None
    return f"http://127.0.0.1:{ev.metrics_ports[0]}/metrics"


class EvidenceTracker:
    """Reads each local GPU process's evidence once (EvidenceCache), keeps a DeviceEvidence per GPU, and with
    `auto_scrape` starts a scrape reader for each recognised engine that listens on a port (stopped when the
    process goes)."""

    def __init__(self, auto_scrape: bool = True,
                 reader: Callable[[str, str], ScrapeKpiReader] | None = None) -> None:
        self.auto_scrape = auto_scrape
        self.cache = EvidenceCache()
        self.devices: dict[str, DeviceEvidence] = {}
        self.scrapes: dict[tuple[int, str], ScrapeKpiReader] = {}  # (pid, url) -> its reader
        self._reader = reader

    def update(self, state: LiveState, now: float) -> list[ScrapeKpiReader]:
        """Refresh from the newest tick's processes; returns the scrape readers that run now."""
        if not state.local_processes:
            self.devices = {}
            return self._keep({})
        alive: set[tuple[int, float]] = set()
        devices: dict[str, DeviceEvidence] = {}
        wanted: dict[tuple[int, str], str] = {}  # (pid, url) -> device uuid
        for uuid, procs in state.processes().items():
            evs = []
            for p in procs:
                start = p.start_time if math.isfinite(p.start_time) else 0.0
                alive.add((p.pid, start))
                ev = self.cache.of(p.pid, start, now)
                evs.append(ev)
                url = auto_scrape_url(ev) if self.auto_scrape else None
                if url is not None:
                    wanted[(p.pid, url)] = uuid
            role = device_role(evs)
            view = state.phase(uuid)
            devices[uuid] = DeviceEvidence(engines_named(evs), role,
                                           disagrees(view.phase if view is not None else "unknown", role))
        self.cache.forget_except(alive)
        self.devices = devices
        return self._keep(wanted)

    def _keep(self, wanted: dict[tuple[int, str], str]) -> list[ScrapeKpiReader]:
        """Stop the readers not wanted any more, start the new ones; (pid, url) -> device uuid."""
        for key in [k for k in self.scrapes if k not in wanted]:
            self.scrapes.pop(key).stop()
        for key, uuid in wanted.items():
            if key not in self.scrapes:
                reader = self._new_reader(key[1], uuid)
                reader.start()
                self.scrapes[key] = reader
        return list(self.scrapes.values())

    def _new_reader(self, url: str, uuid: str) -> ScrapeKpiReader:
        if self._reader is not None:
            return self._reader(url, uuid)
        from phasescope.live.annotate import ScrapeKpiReader

        return ScrapeKpiReader(url, uuid, label="auto-scrape")

    def stop(self) -> None:
        self._keep({})


__all__ = ["DeviceEvidence", "EvidenceTracker", "auto_scrape_url"]
