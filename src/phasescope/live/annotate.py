"""What the live views add on top of raw telemetry, each tick: the phase (live classifier) and the KPIs of
the phase, from in-process hooks or from a serving engine's /metrics.

`Annotator(classifier, hooks)` is the `annotate` callable the tick loop (live/loop.py) runs after every
tick, in the sampler thread. `HookKpiReader` follows a hook events directory (what `phasescope run` and
`PHASESCOPE_EVENTS_DIR` write) incrementally: each immutable .npz chunk is read once, and only the last
`window_s` seconds of events are kept and summarised, so a long run costs constant memory and time.

Telemetry-only KPIs (kpi/rhythm.py: step period and stall share, busy fraction and bursts, activity) need no
hooks: the `Annotator` computes them per device from its ring buffers (`ring_kpis`) for the phase the
classifier reads, only when the classifier has run again for that device (once per its stride, not every
tick), over its last `KPI_WINDOW_S` seconds in that phase (the classifier's window that first called the
phase counts as in it).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from phasescope.errors import InputError
from phasescope.instrument import events as ev
from phasescope.kpi.rhythm import trace_kpis
from phasescope.live.evidence import EvidenceTracker
from phasescope.live.state import LiveState
from phasescope.schema import SIGNAL_NAMES, Trace

# KPIs summed over the processes of one device; the rest come from its busiest process.
_SUMMED = ("samples_per_s", "requests_per_s")
TRAINING_KEYS = ("step_time_p50_s", "samples_per_s", "mfu")
# A process whose last hooked work (step or forward) ended longer ago than this is idle, by its hooks.
HOOK_PHASE_RECENT_S = 10.0
INFERENCE_KEYS = ("requests_per_s", "latency_p50_s", "latency_p99_s")
# The span the live telemetry KPIs cover: the current rhythm, not the run's average (a warm-up or an earlier
# phase would blur it), and long enough to hold MIN_PERIODS (3) repeats of a step of up to 100 s.
KPI_WINDOW_S = 300.0


class Classifier(Protocol):
    """`live_classify.LiveClassifier`, as far as the views need it."""

    window_s: float  # the data each run judges

    def update(self, state: LiveState, now: float | None = None) -> None: ...

    def reading(self, uuid: str) -> Any: ...


def ring_kpis(state: LiveState, uuid: str, phase: str, start: float = -math.inf) -> dict[str, Any]:
    """The telemetry-only KPIs (`trace_kpis`) of `phase` over one device's ring samples at or after
    `start` (data clock)."""
    times, cols = state.history_columns(uuid, SIGNAL_NAMES)
    keep = times >= start
    trace = Trace(state.device_info(uuid), times[keep], {s: c[keep] for s, c in cols.items()})
    # NVML's own sub-second samples, where the source has them, for the rhythm a 1 Hz row cannot show
    fine = state.fine.span(uuid, start, {s: (trace.time, trace[s]) for s in ("gpu_util", "power")})
    return trace_kpis(trace, phase, fine=fine)


@dataclass
class _Proc:
    rows: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty((0, ev.ROW)))
    chunks: set[str] = field(default_factory=set)
    meta: dict[str, Any] = field(default_factory=dict)
    wall_offset: float = 0.0
    # The newest hooked work seen (wall-clock end, phase), kept when its rows leave the window: a process
    # whose work ended long ago is idle, not gone, for as long as its meta file says it was hooked.
    last_end: float = -math.inf
    last_phase: str = ""


class HookKpiReader:
    """Live training/inference KPIs per device and per process from a hook events directory."""

    def __init__(
        self,
        events_dir: str | Path,
        window_s: float = 60.0,
        every_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        consume: bool = False,
    ) -> None:
        self.dir = Path(events_dir)
        # Delete each chunk once read: for a directory only this view reads (the demo's), which would
        # otherwise grow by ~0.5 GB an hour for a fast training loop.
        self.consume = consume
        self.window_s = window_s
        self.every_s = every_s
        self._clock = clock
        self._procs: dict[int, _Proc] = {}
        self._last = -math.inf
        self.device: dict[str, dict[str, float]] = {}
        self.process: dict[int, dict[str, float]] = {}
        # pid -> the phase its hooks saw last (training / inference / idle): exact, not a classifier's guess
        self.phases: dict[int, str] = {}

    def update(self, state: LiveState | None = None) -> bool:
        """Re-read and re-summarise when due; write the KPIs into `state`. True when it ran."""
        now = self._clock()
        if now - self._last < self.every_s:
            return False
        self._scan(now)
        self._summarise(now)
        self._last = self._clock()  # the next scan is `every_s` after this one ended, however long it took
        if state is not None:
            state.set_kpis(self.device, self.process)
            state.set_process_phases(self.phases)
        return True

    def _scan(self, now: float) -> None:
        if not self.dir.is_dir():  # the run has not started writing yet: nothing to show, not an error
            return
        for pid in [pid for pid in self._procs if not (self.dir / f"meta-{pid}.json").exists()]:
            del self._procs[pid]  # its meta file was removed: no longer a hooked process to report
        for meta_path in self.dir.glob("meta-*.json"):
            try:
                meta = json.loads(meta_path.read_text())
                pid = int(meta["pid"])
                anchor = meta["anchor"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced right now, or not ours: the next scan reads it
            if meta.get("format") != ev.FORMAT:
                continue
            proc = self._procs.setdefault(pid, _Proc())
            proc.meta = meta
            proc.wall_offset = float(anchor[0]) - float(anchor[1])
            new = []
            for chunk in sorted(self.dir.glob(f"events-{pid}-*.npz")):
                if chunk.name in proc.chunks:
                    continue
                proc.chunks.add(chunk.name)
                # Chunks are written whole (tmp + rename): one that cannot be read now never will be.
                with contextlib.suppress(InputError):
                    new.append(ev.read_rows(chunk))  # version 1 chunks too, padded to today's width
                if self.consume:
                    chunk.unlink(missing_ok=True)
            rows = np.concatenate([proc.rows, *new]) if new else proc.rows
            # Keep the window only (on the wall clock: the events' monotonic t plus the anchor's offset).
            proc.rows = rows[rows[:, 1] + proc.wall_offset >= now - self.window_s]

    def _summarise(self, now: float) -> None:
        from phasescope.kpi.run_summary import summarize

        procs = [ev.ProcessEvents(pid, p.rows, p.wall_offset, p.meta) for pid, p in self._procs.items()
                 if p.rows.shape[0]]
        doc = summarize(procs, now=now) if procs else {"processes": []}
        process: dict[int, dict[str, float]] = {}
        phases: dict[int, str] = {}
        by_device: dict[str, list[tuple[float, dict[str, float]]]] = {}
        for p in doc["processes"]:
            proc = self._procs[int(p["pid"])]
            work = [s for s in p.get("segments") or [] if s.get("phase") in ("training", "inference")]
            if work:
                last = max(work, key=lambda s: float(s["end"]))
                if float(last["end"]) >= proc.last_end:
                    proc.last_end, proc.last_phase = float(last["end"]), str(last["phase"])
        for pid, proc in self._procs.items():  # also those with no rows left in the window
            if proc.last_phase:
                phases[pid] = proc.last_phase if now - proc.last_end <= HOOK_PHASE_RECENT_S else "idle"
        for p in doc["processes"]:
            kpis: dict[str, float] = {}
            for side, keys in (("training", TRAINING_KEYS), ("inference", INFERENCE_KEYS)):
                for k in keys:
                    v = (p.get(side) or {}).get(k)
                    if v is not None and math.isfinite(float(v)):
                        kpis[k] = float(v)
            if not kpis:
                continue
            process[int(p["pid"])] = kpis
            by_device.setdefault(str(p["device"]), []).append((float(p["steps"] + p["requests"]), kpis))
        device: dict[str, dict[str, float]] = {}
        for uuid, items in by_device.items():
            items.sort(key=lambda x: -x[0])
            merged: dict[str, float] = {}
            for _, kpis in items:
                for k, v in kpis.items():
                    if k in _SUMMED:
                        merged[k] = merged.get(k, 0.0) + v
                    else:
                        merged.setdefault(k, v)
            device[uuid] = merged
        self.device, self.process, self.phases = device, process, phases


class ScrapeKpiReader:
    """Inference KPIs of a serving engine (vLLM, TGI, Triton) from its Prometheus /metrics, for one device.

    Polls on a thread of its own, so a slow or dead server never delays a telemetry tick. Requests/s and the
    latency percentiles cover the window between the last two good scrapes (until there are two: latency
    since the server started, and no rate). A failing scrape is said once as a note, then counted.
    """

    def __init__(
        self,
        url: str,
        device: str | None = None,
        every_s: float = 5.0,
        timeout: float = 2.0,
        fetch: Callable[[str, float], Any] | None = None,
        label: str = "--scrape",
    ) -> None:
        from phasescope.sources.scrape import fetch as http_fetch

        self.label = label  # what its notes start with: the option that asked for it, or "auto-scrape"
        self.url = url
        self.device = device  # a uuid, a device index, or None for "the only device"
        self.every_s = every_s
        self.timeout = timeout
        self._fetch = fetch or http_fetch
        self._prev: Any = None
        self.kpis: dict[str, float] = {}
        self.engine = ""
        self.notes: list[str] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        from phasescope.errors import PhasescopeError
        from phasescope.sources.scrape import server_kpis

        try:
            cur = self._fetch(self.url, self.timeout)
        except PhasescopeError as exc:
            self.failures += 1
            if self.failures == 1:
                self.notes.append(f"{self.label}: {exc}")
            self.kpis = {}  # a server that stopped answering has no current figures: "–", not the last ones
            return
        engines = server_kpis(cur, self._prev)
        self._prev = cur
        if not engines:
            if not self.notes:
                self.notes.append(f"{self.label}: {self.url}: no vLLM, TGI, SGLang or Triton metrics")
            return
        e = engines[0]
        latency = e.get("latency_s") or {}
        out = {
            "requests_per_s": e.get("requests_per_s"),
            "latency_p50_s": latency.get("p50"),
            "latency_p99_s": latency.get("p99"),
        }
        self.engine = str(e.get("engine", ""))
        self.kpis = {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="phasescope-scrape", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.poll_once()
        while not self._stop.wait(self.every_s):
            self.poll_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)

    def target(self, state: LiveState) -> str | None:
        """The uuid of the device these KPIs belong to, or None when it cannot be told."""
        uuids = state.device_uuids()
        if self.device is None:
            return uuids[0] if len(uuids) == 1 else None
        for u in uuids:
            if u == self.device or str(state.device_info(u).index) == self.device:
                return u
        return None


class Annotator:
    """The tick loop's `annotate` hook: phase from the classifier, KPIs from hooks and scrapes."""

    def __init__(
        self,
        classifier: Classifier | None = None,
        hooks: HookKpiReader | None = None,
        scrapes: Sequence[ScrapeKpiReader] = (),
        evidence: EvidenceTracker | None = None,
    ) -> None:
        self.classifier = classifier
        self.hooks = hooks
        self.scrapes = list(scrapes)
        self.evidence = evidence  # the processes' own claims, and the engines among them scraped
        self._said: set[str] = set()
        self._kpi_runs: dict[str, tuple[float, str]] = {}  # uuid -> (classifier run, phase) of its KPIs

    def __call__(self, state: LiveState) -> None:
        if self.classifier is not None:
            self.classifier.update(state)
            for uuid in state.device_uuids():
                r = self.classifier.reading(uuid)
                if r is not None:
                    state.set_phase(uuid, r.phase, r.confidence, r.since, r.held, r.training_alarm)
                    self._telemetry_kpis(state, uuid, r, self.classifier.window_s)
        auto: list[ScrapeKpiReader] = []
        if self.evidence is not None:
            auto = self.evidence.update(state, time.monotonic())
            state.set_evidence(self.evidence.devices)
        if self.hooks is None and not self.scrapes and not auto:
            return
        if self.hooks is not None:
            self.hooks.update()
        device = {u: dict(k) for u, k in self.hooks.device.items()} if self.hooks is not None else {}
        for scrape in [*self.scrapes, *auto]:
            for line in scrape.notes:
                if line not in self._said:
                    self._said.add(line)
                    state.note(line)
            target = scrape.target(state)
            if target is None and scrape.device is not None and state.device_uuids():
                ask = (f"--scrape {scrape.url}@{scrape.device}: no such device here (expected the index or "
                       "uuid of a watched device)")
                if ask not in self._said:
                    self._said.add(ask)
                    state.note(ask)
                continue
            if target is None:
                ask = f"--scrape {scrape.url}: which device? give it as URL@INDEX"
                if ask not in self._said and len(state.device_uuids()) > 1:
                    self._said.add(ask)
                    state.note(ask)
                continue
            if scrape.kpis:
                device.setdefault(target, {}).update(scrape.kpis)  # the server's own figures win
        state.set_kpis(device, self.hooks.process if self.hooks is not None else {})
        if self.hooks is not None:
            state.set_process_phases(self.hooks.phases)

    def _telemetry_kpis(self, state: LiveState, uuid: str, reading: Any, window_s: float) -> None:
        """Recompute a device's telemetry KPIs when the classifier has run again for it (`reading.t`
        moved) or its phase changed; between runs they stand, so a tick costs nothing here."""
        run = (float(reading.t), str(reading.phase))
        if self._kpi_runs.get(uuid) == run:
            return
        self._kpi_runs[uuid] = run
        since = float(reading.since)
        start = max(since - window_s if math.isfinite(since) else -math.inf, run[0] - KPI_WINDOW_S)
        try:
            kpis: dict[str, Any] | None = ring_kpis(state, uuid, reading.phase, start)
        except Exception as exc:  # a KPI that cannot be had must not stop the phase: say it once
            kpis = None
            line = f"telemetry KPIs of {uuid}: {type(exc).__name__}: {exc}"
            if line not in self._said:
                self._said.add(line)
                state.note(line)
        state.set_telemetry_kpis(uuid, kpis)
