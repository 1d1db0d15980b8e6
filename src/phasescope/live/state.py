"""The live state: the data every live view (TUI, plain table, the web page) shows, and no screen text.

The tick loop (live/loop.py) calls `LiveState.ingest(batch)` each tick, then its `annotate` hook (the live
classifier, hook KPIs, telemetry KPIs) writes the phase and KPIs with `set_phase` / `set_kpis` /
`set_telemetry_kpis`; `ingest` advances the loop's energy meter in the same locked step as the tick (the
state owns no meter: energy so far is the loop's one meter's). Views take a consistent `snapshot()`
whenever they redraw and format it themselves (views/table.py: the table's cells and the status line).
Per-device history lives in fixed-size numpy ring buffers (one row per tick, one column per schema
signal), so a long session costs constant memory and no per-sample objects.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phasescope.classify.decide import finite_or_none
from phasescope.kpi.cost import Prices, device_cost, mig_prices
from phasescope.kpi.energy import DeviceEnergy
from phasescope.live.evidence import DeviceEvidence
from phasescope.live.fine import FineSamples
from phasescope.schema import (
    HELD_MEM_BYTES,
    PHASES,
    SIGNAL_COLUMN,
    SIGNAL_NAMES,
    DeviceInfo,
    FloatArray,
    GpuHealth,
    ProcessSample,
    TickBatch,
    Trace,
)
from phasescope.sources.host import is_host_device

DEFAULT_HISTORY = 300  # ticks kept per device (5 min at 1 Hz): the live classifier's window, sparklines
NO_DEVICE = ""  # group key for processes the source could not tie to a device
# Idle-but-held: a device some process holds (a process on it, or this much memory in use) whose phase is
# idle, or, before the classifier has spoken, whose utilisation stayed under `idle_util` for IDLE_TICKS.
# The memory bar, HELD_MEM_BYTES, lives in schema.py: `classify` and `fleet` judge recorded spans by it too.
IDLE_TICKS = 30
# The tick loop's energy meter as `ingest` calls it: (batch, uuid -> phase label) -> energy so far per device.
Meter = Callable[[TickBatch, Mapping[str, str]], Sequence[DeviceEnergy]]


class Ring:
    """Fixed-capacity ring of rows of `width` float64 values (NaN-initialised)."""

    __slots__ = ("_buf", "_head", "_n", "_times")

    def __init__(self, capacity: int, width: int) -> None:
        self._buf = np.full((capacity, width), np.nan)
        self._times = np.full(capacity, np.nan)
        self._head = 0  # next slot to write
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def push(self, t: float, row: FloatArray) -> None:
        self._buf[self._head] = row
        self._times[self._head] = t
        self._head = (self._head + 1) % self._buf.shape[0]
        self._n = min(self._n + 1, self._buf.shape[0])

    def extend(self, times: FloatArray, rows: FloatArray) -> None:
        """Push many rows at once (oldest first); only the newest `capacity` stay."""
        cap = self._buf.shape[0]
        times, rows = times[-cap:], rows[-cap:]
        slots = (self._head + np.arange(times.size)) % cap
        self._buf[slots] = rows
        self._times[slots] = times
        self._head = (self._head + times.size) % cap
        self._n = min(self._n + times.size, cap)

    def _order(self) -> np.ndarray:
        cap = self._buf.shape[0]
        return (np.arange(self._head - self._n, self._head) % cap) if self._n else np.empty(0, dtype=int)

    def column(self, col: int) -> FloatArray:
        """One column, oldest first."""
        return self._buf[self._order(), col]

    def times(self) -> FloatArray:
        return self._times[self._order()]

    def any_finite(self) -> bool:
        return bool(np.isfinite(self._buf).any())

    def last(self) -> FloatArray:
        if not self._n:
            return np.full(self._buf.shape[1], np.nan)
        return self._buf[(self._head - 1) % self._buf.shape[0]].copy()


def phase_from_hooks(info: DeviceInfo) -> bool:
    """Whether a device's phase comes only from its processes' hooks, never from the live classifier.

    The one place that decides it: the host pseudo-device (CPU load and RAM), which the phase and alarm
    models, fitted on GPU telemetry, cannot judge. `LiveClassifier` skips such devices and `LiveState`
    shows, meters and sorts them by their hooks' phases.
    """
    return is_host_device(info)


@dataclass
class DeviceState:
    info: DeviceInfo
    order: int  # position in the source's device list when first seen
    history: Ring
    lost: bool = False
    processes: list[ProcessSample] = field(default_factory=list)
    # After a preload: the first live tick further than this past the history leaves a blank row between
    # them, so sparklines show the restart as the gap it is rather than joining the two.
    resume_gap_s: float = math.nan


@dataclass(frozen=True)
class PhaseView:
    """What a view shows of a device's phase: the classifier's (`live_classify.PhaseReading`), or for a
    `phase_from_hooks` device its processes' hooks (exact: no confidence, no start, no alarm)."""

    phase: str  # a PHASES member or "unknown"; from hooks, the busiest (by CPU) phase reported
    confidence: float
    since: float
    held: bool = False  # the newest run judged nothing: phase and confidence are from an older window
    training_alarm: bool = False  # the classifier's "training started" alarm holds for the device
    hooks_label: str = ""  # from hooks: every phase reported, in PHASES order ("training+inference")

    @property
    def label(self) -> str:
        """The name its time and energy go under: the hooks' label, else the phase."""
        return self.hooks_label or self.phase


@dataclass(frozen=True)
class ProcessKpis:
    """One process of the newest tick whose own hooks report KPIs (e.g. the demo's two workloads)."""

    pid: int
    device_uuid: str  # the device it was seen on (NO_DEVICE when the source tied it to none)
    label: str  # its role, as `process_labels` names it ("demo training"), or ""
    phase: str | None  # the phase its hooks report; None when they report none
    kpis: dict[str, float]  # as kpi/training.py and kpi/inference.py name them


@dataclass(frozen=True)
class ProcessSnapshot:
    """One process of the newest tick, with what the state knows of it besides the sample."""

    sample: ProcessSample
    cpu_history: FloatArray  # its CPU ratio per tick, oldest first
    label: str  # its role (`process_labels`), or ""
    hook_phase: str  # the phase its hooks report, or ""
    kpis: dict[str, float]  # its hook KPIs (empty when none)


@dataclass(frozen=True)
class DeviceSnapshot:
    """One device as of the newest tick: what a view formats, computed under the state's lock."""

    info: DeviceInfo
    order: int  # position in the source's device list when first seen
    lost: bool  # no longer listed by the source
    dark: bool  # lost, or no value at all in its newest tick after it had data (what views mark NO DATA)
    latest: FloatArray  # newest values, one per schema signal (all NaN when lost)
    power_limit: float  # the newest, else (not dark) the highest read: a limit read once still holds
    util_history: FloatArray  # gpu_util per tick, oldest first
    power_history: FloatArray  # power per tick, oldest first
    phase: PhaseView | None  # as `LiveState.phase`
    idle_held: bool
    kpis: dict[str, float]  # the device's phase KPIs (hooks, scrapes)
    energy: DeviceEnergy | None  # energy so far, None before it was metered
    prices: Prices  # what its cost is reckoned at (a MIG row: its share of the GPU's)
    processes: list[ProcessSnapshot]
    # Telemetry-only KPIs of its current phase (kpi/rhythm.py `trace_kpis`'s dict; empty before the first)
    telemetry_kpis: dict[str, Any] = field(default_factory=dict)
    # What its processes say they are (live/evidence.py): context beside the phase; None where not read
    evidence: DeviceEvidence | None = None

    def value(self, signal: str) -> float:
        return float(self.latest[SIGNAL_COLUMN[signal]])


@dataclass(frozen=True)
class LiveSnapshot:
    """Everything the state holds for the views, taken at once (`LiveState.snapshot`)."""

    source_name: str
    ticks: int
    since_tick_s: float  # seconds since the newest tick; NaN before the first
    devices: list[DeviceSnapshot]  # in the order first seen
    orphans: list[ProcessSnapshot]  # processes tied to no known device
    errors: dict[str, int]  # failed reads so far, by call
    events: list[str]  # the newest last
    energy: list[DeviceEnergy]  # every metered device's, listed now or not
    prices: dict[str, Prices]  # per uuid of `energy` and `devices`
    price_note: str
    host_mem_total: float
    # A replay's own clock at the newest tick (its trace time), and its speed; NaN and 1 for a live source
    trace_time: float = math.nan
    speed: float = 1.0


class LiveState:
    """Thread-safe store of the latest tick and a short history per device, plus status for the views."""

    def __init__(
        self,
        source_name: str = "",
        capacity: int = DEFAULT_HISTORY,
        *,
        prices: Prices | Callable[[DeviceInfo], Prices] | None = None,
        idle_util: float = 0.05,
    ) -> None:
        self.source_name = source_name
        self.capacity = capacity
        self._lock = threading.Lock()
        self._devices: dict[str, DeviceState] = {}
        self._planned_order: dict[str, int] = {}  # uuid -> row position, from a preload's device list
        self._proc_cpu: dict[int, deque[float]] = {}
        self._events: deque[str] = deque(maxlen=20)
        self._errors: dict[str, int] = {}
        self._orphans: list[ProcessSample] = []  # processes tied to no known device
        self.process_labels: dict[int, str] = {}  # pid -> a role to show (e.g. "demo training")
        self.prices = prices or Prices()  # one price for all, or per device (e.g. by model name)
        self.idle_util = idle_util
        # uuid -> energy so far, as the tick loop's meter gave it at the last `ingest`
        self._energy: dict[str, DeviceEnergy] = {}
        self._health: dict[str, GpuHealth] = {}  # uuid -> the source's last health read (NVML)
        self._phases: dict[str, PhaseView] = {}
        self._kpis: dict[str, dict[str, float]] = {}  # device uuid -> hook KPIs (kpi/training, kpi/inference)
        self._telemetry_kpis: dict[str, dict[str, Any]] = {}  # device uuid -> `trace_kpis` of its phase
        self._evidence: dict[str, DeviceEvidence] = {}  # device uuid -> its processes' claim (local only)
        self.fine = FineSamples()  # NVML's sub-second samples (TickBatch.fine), for the telemetry KPIs
        self._proc_kpis: dict[int, dict[str, float]] = {}  # pid -> hook KPIs of that process
        self._proc_phase: dict[int, str] = {}  # pid -> the phase that process's hooks report
        self.price_note = ""  # said on every status line while set (e.g. the demo's example prices)
        self.version = 0  # bumped on every change; views redraw when it moves
        self.ticks = 0
        self._last_tick_mono = math.nan
        self.last_tick_time = math.nan
        # Whether the processes shown are this host's (the host source's, `set_local_processes`): only then
        # may a view signal them. Off for a replay or anything else that reports PIDs from elsewhere.
        self.local_processes = False
        self.host_mem_total = math.nan  # bytes of host RAM: a process's %MEM is its RSS over this
        # Add to a tick's time for the source's own clock (a replay's trace time; the tick loop sets it,
        # `set_clock`); 0 and speed 1 for a live source, whose ticks are on the wall clock.
        self.clock_offset_s = 0.0
        self.clock_speed = 1.0

    def set_clock(self, offset_s: float, speed: float = 1.0) -> None:
        """The source's clock: its time is a tick's time + `offset_s`, running `speed` times the wall's."""
        with self._lock:
            self.clock_offset_s, self.clock_speed = float(offset_s), float(speed)
            self.version += 1

    def set_local_processes(self, local: bool, host_mem_total: float = math.nan) -> None:
        """Say whether the source's processes run on this host (the tick loop does, from the source's
        `local_processes`), and its RAM in bytes (`live.processes.host_ram_bytes`) for %MEM."""
        with self._lock:
            self.local_processes = local
            if local and host_mem_total > 0:
                self.host_mem_total = float(host_mem_total)
            self.version += 1

    # ---- writers (sampler thread) ----

    def ingest(self, batch: TickBatch, errors: Mapping[str, int] | None = None,
               meter: Meter | None = None) -> None:
        """One tick into the rings, processes, health and events. `meter(batch, phases)`: the tick loop's
        energy meter, advanced under each device's phase label now (`_metered_phases`: the phase current at
        this tick) and its figures kept, in the same step, so no view ever sees a tick without its energy."""
        with self._lock:
            seen: set[str] = set()
            for i, dev in enumerate(batch.devices):
                state = self._devices.get(dev.uuid)
                if state is None:
                    state = self._new_device(dev)
                elif state.lost:
                    state.lost = False
                    self._events.append(f"{device_name(dev)} is back")
                state.info = dev
                if math.isfinite(state.resume_gap_s):
                    last = float(state.history.times()[-1])
                    if batch.time - last > state.resume_gap_s:
                        state.history.push((last + batch.time) / 2, np.full(len(SIGNAL_NAMES), np.nan))
                    state.resume_gap_s = math.nan
                state.history.push(batch.time, batch.values[i])
                if is_host_device(dev):  # a host row (a replay's too) tells its own RAM for %MEM
                    total = float(batch.values[i][SIGNAL_COLUMN["mem_total"]])
                    if math.isfinite(total) and total > 0:
                        self.host_mem_total = total
                seen.add(dev.uuid)
            for uuid, state in self._devices.items():
                if uuid not in seen and not state.lost:
                    state.lost = True
                    state.processes = []
                    self._events.append(f"{device_name(state.info)} lost: no data this tick")
            self._take_processes(batch.processes)
            if meter is not None:
                self._energy = {r.device: r for r in meter(batch, self._metered_phases())}
            self._health.update(batch.health)
            self._events.extend(batch.events)
            self.fine.ingest(batch)
            if errors is not None:
                self._errors = dict(errors)
            self.ticks += 1
            self.last_tick_time = batch.time
            self._last_tick_mono = time.monotonic()
            self.version += 1

    def _new_device(self, dev: DeviceInfo) -> DeviceState:
        """A row for a device seen the first time, where a preload placed it (caller holds the lock)."""
        order = self._planned_order.get(dev.uuid)
        if order is None:
            order = 1 + max([d.order for d in self._devices.values()] + list(self._planned_order.values()),
                            default=-1)
        state = DeviceState(dev, order, Ring(self.capacity, len(SIGNAL_NAMES)))
        self._devices[dev.uuid] = state
        return state

    def preload(self, traces: Sequence[Trace], devices: Sequence[DeviceInfo]) -> int:
        """History from before this session (e.g. the live store) into the ring buffers, before the first
        tick, so rows show their sparklines at once and the classifier has a window to judge.

        `devices` are the watched devices in the source's order (rows keep that order); a trace of one of
        them fills its history with its newest `capacity` samples, and traces of other devices are left
        out (the caller says so). Ticks, energy and cost are untouched: they count this session only.
        Returns the samples loaded.
        """
        watched = {d.uuid: i for i, d in enumerate(devices)}
        loaded = 0
        with self._lock:
            self._planned_order.update(watched)
            for tr in traces:
                if tr.device.uuid not in watched or not len(tr):
                    continue
                info = next(d for d in devices if d.uuid == tr.device.uuid)  # the live identity wins
                state = self._devices.get(info.uuid) or self._new_device(info)
                order = np.argsort(tr.time, kind="stable")[-self.capacity :]
                rows = np.column_stack([tr[s][order] for s in SIGNAL_NAMES])
                state.history.extend(tr.time[order], rows)
                step = np.diff(tr.time[order])
                step = step[step > 0]
                state.resume_gap_s = 3.0 * float(np.median(step)) if step.size else 3.0
                loaded += int(order.size)
            self.version += 1
        return loaded

    def _take_processes(self, processes: list[ProcessSample]) -> None:
        by_dev: dict[str, list[ProcessSample]] = {u: [] for u in self._devices}
        only = next(iter(self._devices)) if len(self._devices) == 1 else None
        for p in processes:
            uuid = p.device_uuid if p.device_uuid in self._devices else (only or NO_DEVICE)
            by_dev.setdefault(uuid, []).append(p)
            hist = self._proc_cpu.get(p.pid)
            if hist is None:
                hist = self._proc_cpu[p.pid] = deque(maxlen=self.capacity)
            hist.append(p.cpu_util)
        for uuid, state in self._devices.items():
            state.processes = by_dev.pop(uuid, [])
        self._orphans = by_dev.get(NO_DEVICE, [])
        alive = {p.pid for p in processes}
        for pid in [pid for pid in self._proc_cpu if pid not in alive]:
            del self._proc_cpu[pid]

    def note(self, message: str) -> None:
        """A status message from outside the tick (sampler failure, source closed)."""
        with self._lock:
            self._events.append(message)
            self.version += 1

    def set_phase(
        self, uuid: str, phase: str, confidence: float, since: float, held: bool = False,
        training_alarm: bool = False,
    ) -> None:
        """The classifier's current phase for a device (written by the annotate hook); `held`: kept from an
        older window, the newest run having judged nothing; `training_alarm`: its onset alarm holds.
        Not shown for a `phase_from_hooks` device: its hooks' phases stand."""
        view = PhaseView(phase, confidence, since, held, training_alarm)
        with self._lock:
            if self._phases.get(uuid) != view:
                self._phases[uuid] = view
                self.version += 1

    def set_process_phases(self, phases: Mapping[int, str]) -> None:
        """pid -> the phase its hooks report (training / inference / idle), replacing the previous set."""
        with self._lock:
            if dict(phases) != self._proc_phase:
                self._proc_phase = dict(phases)
                self.version += 1

    def set_kpis(self, device: dict[str, dict[str, float]], process: dict[int, dict[str, float]]) -> None:
        """Hook KPIs per device uuid and per pid (replacing the previous set). Keys as in kpi/training.py
        and kpi/inference.py: step_time_p50_s, samples_per_s, mfu, requests_per_s, latency_p50_s/p99_s."""
        with self._lock:
            if device != self._kpis or process != self._proc_kpis:
                self._kpis, self._proc_kpis = dict(device), dict(process)
                self.version += 1

    def set_telemetry_kpis(self, uuid: str, kpis: Mapping[str, Any] | None) -> None:
        """A device's telemetry-only KPIs (kpi/rhythm.py `trace_kpis` of its current phase), replacing
        the previous ones; None forgets them."""
        with self._lock:
            if kpis is None:
                changed = self._telemetry_kpis.pop(uuid, None) is not None
            else:
                changed = self._telemetry_kpis.get(uuid) != kpis
                self._telemetry_kpis[uuid] = dict(kpis)
            if changed:
                self.version += 1

    def set_evidence(self, devices: Mapping[str, DeviceEvidence]) -> None:
        """What each device's processes claim (live/evidence.py), replacing the previous set."""
        with self._lock:
            if dict(devices) != self._evidence:
                self._evidence = dict(devices)
                self.version += 1

    # ---- readers (any thread) ----

    def evidence(self) -> dict[str, DeviceEvidence]:
        with self._lock:
            return dict(self._evidence)

    def device_info(self, uuid: str) -> DeviceInfo:
        with self._lock:
            dev = self._devices.get(uuid)
            return dev.info if dev is not None else DeviceInfo(uuid)

    def processes(self) -> dict[str, list[ProcessSample]]:
        """uuid -> the processes the newest tick saw on that device (a lost device has none)."""
        with self._lock:
            return {uuid: list(dev.processes) for uuid, dev in self._devices.items() if dev.processes}

    def process_sample(self, uuid: str, pid: int) -> ProcessSample | None:
        """The newest sample of process `pid` under device `uuid` (a row's `device_uuid`, NO_DEVICE for
        the no-device group); None once it is gone."""
        with self._lock:
            dev = self._devices.get(uuid)
            procs = dev.processes if dev is not None else self._orphans if uuid == NO_DEVICE else []
            return next((p for p in procs if p.pid == pid), None)

    def process_entries(self) -> dict[str, list[dict[str, object]]]:
        """uuid -> one JSON-ready dict per process of the newest tick: the sample's fields, elapsed seconds
        and %MEM of host RAM as a ratio; unknown numbers are None, never NaN. Not served: /api/state has no
        per-process entries, and a command line (it can hold a secret) must not go there without a choice."""
        with self._lock:
            groups = [(u, d.processes) for u, d in self._devices.items() if d.processes]
            if self._orphans:
                groups.append((NO_DEVICE, self._orphans))
            return {u: [_process_entry(p, self.host_mem_total) for p in procs] for u, procs in groups}

    def phase(self, uuid: str) -> PhaseView | None:
        """The phase shown for a device (see `_phase_view`); None while there is none."""
        with self._lock:
            dev = self._devices.get(uuid)
            return self._phases.get(uuid) if dev is None else self._phase_view(dev)

    def process_kpis(self) -> dict[str, list[ProcessKpis]]:
        """uuid -> every process of the newest tick that has hook KPIs, by PID (not the table's rows: those
        are capped and filtered)."""
        with self._lock:
            groups = [(u, d.processes) for u, d in self._devices.items()] + [(NO_DEVICE, self._orphans)]
            out: dict[str, list[ProcessKpis]] = {}
            for uuid, procs in groups:
                for p in sorted(procs, key=lambda p: p.pid):
                    kpis = self._proc_kpis.get(p.pid)
                    if kpis:
                        out.setdefault(uuid, []).append(ProcessKpis(
                            p.pid, uuid, self.process_labels.get(p.pid, ""), self._proc_phase.get(p.pid),
                            dict(kpis)))
            return out

    def device_kpis(self) -> dict[str, dict[str, float]]:
        """uuid -> the device's phase KPIs (hooks, and a serving engine's /metrics where scraped)."""
        with self._lock:
            return {u: dict(k) for u, k in self._kpis.items()}

    def telemetry_kpis(self) -> dict[str, dict[str, Any]]:
        """uuid -> the device's telemetry-only KPIs (`set_telemetry_kpis`), for devices that have them."""
        with self._lock:
            return {u: dict(k) for u, k in self._telemetry_kpis.items()}

    def process_phases(self) -> dict[int, str]:
        with self._lock:
            return dict(self._proc_phase)

    def host_phases(self) -> dict[str, str]:
        """`phase_from_hooks` device uuid -> the phase its processes' hooks report ("" when none report):
        the label its time and cost go under, in place of the GPU classifier's."""
        with self._lock:
            return {u: self._hook_phase(d)[0] for u, d in self._devices.items() if phase_from_hooks(d.info)}

    def idle_held(self) -> list[str]:
        """Uuids of devices held by a process (or its memory) while idle: paid for, doing nothing."""
        with self._lock:
            return [u for u, d in self._devices.items() if self._is_idle_held(d)]

    def energy_results(self) -> dict[str, DeviceEnergy]:
        """uuid -> the device's energy so far (method, per-phase figures, and whether any was `measured`)."""
        with self._lock:
            return dict(self._energy)

    def health(self) -> dict[str, GpuHealth]:
        """uuid -> the GPU's last health read (ECC, remapped rows, PCIe replays, memory temperature, XIDs);
        GPUs whose source reads none are absent."""
        with self._lock:
            return dict(self._health)

    def energy_totals(self) -> tuple[float | None, float | None]:
        """(joules so far over the measured devices, or None while none is `measured`; USD so far or None
        when no price is set), all devices."""
        with self._lock:
            results = list(self._energy.values())
            prices, _ = self._row_prices()
            costs = [device_cost(r, prices[r.device]).total_usd for r in results]
        measured = [r.joules for r in results if r.measured]
        known = [c for c in costs if c is not None]
        return (sum(measured) if measured else None), (sum(known) if known else None)

    def device_uuids(self) -> list[str]:
        with self._lock:
            return list(self._devices)

    def latest(self, uuid: str) -> FloatArray:
        with self._lock:
            return self._devices[uuid].history.last()

    def history(self, uuid: str, signal: str) -> FloatArray:
        with self._lock:
            return self._devices[uuid].history.column(SIGNAL_COLUMN[signal])

    def history_times(self, uuid: str) -> FloatArray:
        with self._lock:
            return self._devices[uuid].history.times()

    def history_columns(self, uuid: str, signals: Sequence[str]) -> tuple[FloatArray, dict[str, FloatArray]]:
        """(times, signal -> values) of one device's history, oldest first, read at once: a tick between two
        separate reads would give columns one sample longer than the times."""
        with self._lock:
            ring = self._devices[uuid].history
            return ring.times(), {s: ring.column(SIGNAL_COLUMN[s]) for s in signals}

    def is_lost(self, uuid: str) -> bool:
        with self._lock:
            return self._devices[uuid].lost

    def is_dark(self, uuid: str) -> bool:
        """Lost, or no value at all in its newest tick after it had data (NVML keeps a GPU that fell off the
        bus as an all-NaN row): what the views mark NO DATA."""
        with self._lock:
            dev = self._devices[uuid]
            return dev.lost or _went_dark(dev)

    def snapshot(self) -> LiveSnapshot:
        """The devices, processes, phases, KPIs, energy and status as of now, consistent with each other."""
        with self._lock:
            prices, _ = self._row_prices()
            devices = [self._device_snapshot(d, prices[u]) for u, d in self._devices.items()]
            return LiveSnapshot(
                self.source_name, self.ticks, time.monotonic() - self._last_tick_mono, devices,
                [self._process_snapshot(p) for p in self._orphans], dict(self._errors), list(self._events),
                list(self._energy.values()), prices, self.price_note, self.host_mem_total,
                self.last_tick_time + self.clock_offset_s if self.clock_offset_s else math.nan,
                self.clock_speed)

    def _device_snapshot(self, dev: DeviceState, prices: Prices) -> DeviceSnapshot:
        dark = dev.lost or _went_dark(dev)
        latest = np.full(len(SIGNAL_NAMES), np.nan) if dev.lost else dev.history.last()
        limit = float(latest[SIGNAL_COLUMN["power_limit"]])
        if not math.isfinite(limit) and not dark:
            limit = _finite_max(dev.history.column(SIGNAL_COLUMN["power_limit"]))
        uuid = dev.info.uuid
        return DeviceSnapshot(
            dev.info, dev.order, dev.lost, dark, latest, limit, dev.history.column(SIGNAL_COLUMN["gpu_util"]),
            dev.history.column(SIGNAL_COLUMN["power"]), self._phase_view(dev), self._is_idle_held(dev),
            dict(self._kpis.get(uuid, {})), self._energy.get(uuid), prices,
            [self._process_snapshot(p) for p in dev.processes], dict(self._telemetry_kpis.get(uuid, {})),
            self._evidence.get(uuid))

    def _process_snapshot(self, p: ProcessSample) -> ProcessSnapshot:
        return ProcessSnapshot(p, np.asarray(self._proc_cpu.get(p.pid, ()), dtype=np.float64),
                               self.process_labels.get(p.pid, ""), self._proc_phase.get(p.pid, ""),
                               dict(self._proc_kpis.get(p.pid, {})))

    def events(self) -> list[str]:
        with self._lock:
            return list(self._events)

    def row_prices(self) -> tuple[dict[str, Prices], dict[str, str]]:
        """Per device uuid: the prices its cost is reckoned at, and for a MIG row the note that says its
        share of the physical GPU (see `_row_prices`)."""
        with self._lock:
            return self._row_prices()

    # ---- row building (caller holds the lock) ----

    def _price(self, uuid: str) -> Prices:
        if isinstance(self.prices, Prices):
            return self.prices
        dev = self._devices.get(uuid)
        return self.prices(dev.info if dev is not None else DeviceInfo(uuid))

    def _row_prices(self) -> tuple[dict[str, Prices], dict[str, str]]:
        """Each metered or listed device's prices, MIG rows at their share of the physical GPU's
        (kpi/cost.py `mig_prices`, the rule `cost` and `report` use): the parent row and its instances
        together cost one GPU-hour per hour, not one each. Shares are over every device seen this session."""
        uuids = list(self._devices) + [u for u in self._energy if u not in self._devices]
        base = {u: self._price(u) for u in uuids}
        return mig_prices(base, [d.info for d in self._devices.values()])

    def _is_idle_held(self, dev: DeviceState) -> bool:
        if dev.lost or _went_dark(dev):
            return False
        mem = float(dev.history.last()[SIGNAL_COLUMN["mem_used"]])
        if not (dev.processes or (math.isfinite(mem) and mem >= HELD_MEM_BYTES)):
            return False
        view = self._phase_view(dev)
        phase = view.phase if view is not None else ""
        if phase in PHASES:
            return phase == "idle"
        util = dev.history.column(SIGNAL_COLUMN["gpu_util"])[-IDLE_TICKS:]
        if util.size < IDLE_TICKS or not np.isfinite(util).all():
            return False
        return float(util.max()) < self.idle_util

    def _hook_phase(self, dev: DeviceState) -> tuple[str, str]:
        """(label, badge phase) from the hooks of the device's processes: working phases joined in PHASES
        order ("training+inference"), else "idle" when all that report are idle; the badge phase is the
        busiest (by CPU) working one. ("", "") when no process on it reports."""
        reported = [(p, self._proc_phase[p.pid]) for p in dev.processes if p.pid in self._proc_phase]
        if not reported:
            return "", ""
        work = [(p, ph) for p, ph in reported if ph != "idle"]
        if not work:
            return "idle", "idle"
        rank = {ph: i for i, ph in enumerate(PHASES)}
        names = sorted({ph for _, ph in work}, key=lambda ph: rank.get(ph, len(PHASES)))
        cpu = {ph: 0.0 for ph in names}
        for p, ph in work:
            cpu[ph] += p.cpu_util if math.isfinite(p.cpu_util) else 0.0
        busiest = max(names, key=lambda ph: cpu[ph])
        return "+".join(names), busiest

    def _phase_view(self, dev: DeviceState) -> PhaseView | None:
        """The device's phase as every view shows, sorts, filters and meters it (caller holds the lock):
        the classifier's, or for a `phase_from_hooks` device its hooks' (None while none report)."""
        if not phase_from_hooks(dev.info):
            return self._phases.get(dev.info.uuid)
        label, busiest = self._hook_phase(dev)
        return PhaseView(busiest, math.nan, math.nan, hooks_label=label) if label else None

    def _metered_phases(self) -> dict[str, str]:
        """uuid -> the phase label its energy and time go under this tick; none: "unknown" (caller holds
        the lock)."""
        views = ((u, self._phase_view(d)) for u, d in self._devices.items())
        return {u: v.label for u, v in views if v is not None}


def device_name(info: DeviceInfo) -> str:
    """'#0 NVIDIA H100 80GB HBM3', or the uuid where the source gives no model name (events, status line)."""
    idx = "" if info.index is None else f"#{info.index} "
    return f"{idx}{info.name or info.uuid}"


def _finite_max(values: FloatArray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else math.nan


def _went_dark(dev: DeviceState) -> bool:
    """The latest tick has no value at all for a device that had values before."""
    if len(dev.history) < 2 or np.isfinite(dev.history.last()).any():
        return False
    return dev.history.any_finite()


def mem_share(rss: float, host_mem_total: float) -> float:
    """A process's RSS as a ratio of host RAM (top's %MEM); NaN when either is unknown."""
    return rss / host_mem_total if host_mem_total > 0 else math.nan  # NaN compares False: stays NaN


def _process_entry(p: ProcessSample, host_mem_total: float) -> dict[str, object]:
    return {
        "pid": p.pid, "name": p.name, "user": p.user, "cmdline": p.cmdline,
        "start_time": finite_or_none(p.start_time), "elapsed_s": finite_or_none(p.time - p.start_time),
        "gpu_mem_used": finite_or_none(p.gpu_mem_used), "sm_util": finite_or_none(p.sm_util),
        "cpu_util": finite_or_none(p.cpu_util), "rss": finite_or_none(p.rss),
        "mem_ratio": finite_or_none(mem_share(p.rss, host_mem_total)),
        "threads": finite_or_none(p.threads), "uses_torch": p.uses_torch,
    }
