"""The one tick pipeline of a process, and its one energy meter: what `top`, `serve`, `demo` and `run`'s
device watch all run.

Each tick, in the sampler thread: the source's batch goes into the `LiveState` (rings, processes, health)
together with the energy meter's step, under each device's phase current at that tick (`LiveState.ingest`
calls the meter under its lock, so no view sees a tick without its energy); then to the sinks (the live
store; `run`'s running figures); then through `annotate` (the live classifier's phase, hook and scrape
KPIs), whose phase the next tick's energy goes under. The status line, the table, the dashboard and
`/metrics` all show one meter's figures: there is no second meter to keep equal. See
docs/design/live-pipeline.md.

A failing sink or annotation is said once on the status line and dropped; the telemetry goes on. A failing
source ends sampling with a status line, never with a traceback in the view.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from phasescope.kpi.energy import DEFAULT_GAP_FACTOR, DeviceEnergy, FleetEnergyMeter
from phasescope.live.processes import host_ram_bytes
from phasescope.live.state import LiveState
from phasescope.schema import TickBatch
from phasescope.sources.base import LiveSource
from phasescope.sources.sampler import Sampler

Annotate = Callable[[LiveState], None]
# (what it does, for the status line if it fails: "writing the store"; the callable that takes each tick)
Sink = tuple[str, Callable[[TickBatch], None]]


class TickLoop:
    """Samples `source` every `interval_s` seconds into `state`; owns the process's energy meter."""

    def __init__(
        self,
        source: LiveSource,
        interval_s: float,
        state: LiveState,
        *,
        annotate: Annotate | None = None,
        sinks: Sequence[Sink] = (),
        gap_factor: float = DEFAULT_GAP_FACTOR,
    ) -> None:
        self.source = source
        self.state = state
        self.sampler = Sampler(source, interval_s)
        self.annotate = annotate
        self.sinks = list(sinks)
        # The one meter. No interval given: each device's meter learns the period from its ticks' own (data
        # clock) spacing, so a replay at 10 s or `--interval 5` over a 1 s replay is metered by the offline
        # gap rule on the ticks taken, not called all gaps.
        self.energy = FleetEnergyMeter(gap_factor=gap_factor)
        self.exhausted = False  # a replay that reached its end: the views keep its last picture
        self.failure = ""  # why sampling stopped, when a source failed
        self.running = False
        self.last_tick_mono = math.nan  # monotonic time of the last tick taken
        self.stop_event = threading.Event()
        # Only a source of this host's processes lets a view signal them, and gives them a %MEM of this RAM.
        local = bool(getattr(source, "local_processes", False))
        state.set_local_processes(local, host_ram_bytes() if local else math.nan)

    def on_tick(self, batch: TickBatch) -> None:
        """One sample of all devices through the pipeline (the sampler calls it; tests may too)."""
        state = self.state
        if getattr(self.source, "exhausted", False):  # a replay that reached its end: keep the last picture
            for event in batch.events:
                state.note(event)
            self.exhausted = True
            self.stop_event.set()
            return
        trace_time = getattr(self.source, "trace_time", None)
        if trace_time is not None:  # a replay: the views show its own clock, not wall time at its speed
            offset = trace_time(batch.time) - batch.time  # per tick: a loop's next pass starts it over
            if abs(offset - state.clock_offset_s) > 1e-3:
                state.set_clock(offset, getattr(self.source, "speed", 1.0))
        state.ingest(batch, self.source.error_counts(), meter=self._meter)
        for sink in list(self.sinks):
            try:
                sink[1](batch)
            except Exception as exc:  # e.g. a full disk: the views go on without the store
                self.sinks.remove(sink)
                state.note(f"{sink[0]} stopped: {type(exc).__name__}: {exc}")
        if self.annotate is not None:
            try:
                self.annotate(state)
            except Exception as exc:  # keep the telemetry coming; say once why the phase stopped updating
                self.annotate = None
                state.note(f"phase/KPI updates stopped: {type(exc).__name__}: {exc}")
        self.last_tick_mono = time.monotonic()

    def _meter(self, batch: TickBatch, phases: Mapping[str, str]) -> list[DeviceEnergy]:
        """The energy step of a tick (`LiveState.ingest` calls it): only this thread writes the meter, and
        readers get its immutable results, kept by the state."""
        self.energy.update(batch, phases)
        return self.energy.results()

    def run(
        self,
        stop: threading.Event | None = None,
        duration: float | None = None,
        before: Callable[[], None] | None = None,
    ) -> None:
        """Sample until `stop` (or `self.stop_event`) is set or `duration` has passed, then close the source.

        Blocks: run it in a worker thread beside the view. `before()` runs first, in this thread (parsing
        the classifier's model, or replaying it over preloaded history); if it fails, that is said and
        sampling goes on.
        """
        if stop is not None:  # the view's event: it and `stop()` both end sampling
            self.stop_event = stop
        self.running = True
        try:
            if before is not None:
                try:
                    before()
                except Exception as exc:
                    self.state.note(f"before sampling: {type(exc).__name__}: {exc}")
            self.sampler.run(self.on_tick, duration=duration, stop=self.stop_event)
        except Exception as exc:  # a view must survive any source failure and say what happened
            self.failure = f"sampling stopped: {type(exc).__name__}: {exc}"
            self.state.note(self.failure)
        finally:
            self.running = False
            try:
                self.source.close()
            except Exception as exc:
                self.state.note(f"closing {self.source.name} failed: {exc}")

    def stop(self) -> None:
        self.stop_event.set()

    def energy_results(self) -> dict[str, DeviceEnergy]:
        """uuid -> the device's energy so far (what the state holds as of the last tick)."""
        return self.state.energy_results()


def feed(
    state: LiveState,
    source: LiveSource,
    interval_s: float,
    stop: threading.Event,
    duration: float | None = None,
    annotate: Annotate | None = None,
    *,
    before: Callable[[], None] | None = None,
    sinks: Sequence[Sink] = (),
    gap_factor: float = DEFAULT_GAP_FACTOR,
) -> TickLoop:
    """A `TickLoop` over `source` into `state`, run until `stop` or `duration` (tests, scripts)."""
    loop = TickLoop(source, interval_s, state, annotate=annotate, sinks=sinks, gap_factor=gap_factor)
    loop.run(stop, duration, before=before)
    return loop
