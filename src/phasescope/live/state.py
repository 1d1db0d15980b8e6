"""UI-agnostic live state: what every live view (TUI, plain table, later the web page) shows.

The sampler thread calls `LiveState.ingest(batch)` each tick, then `feed`'s `annotate` hook (the live
classifier, hook KPIs) writes the phase and KPIs with `set_phase` / `set_kpis`; views call `rows(...)` and
`status_line()` whenever they redraw. Energy so far is metered per device and attributed to the phase
current at each tick. Per-device history lives in fixed-size numpy ring buffers (one row per tick, one
column per schema signal), so a long session costs constant memory and no per-sample objects.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import psutil

from phasescope.kpi.cost import Prices, device_cost, mig_prices
from phasescope.kpi.energy import DEFAULT_GAP_FACTOR, FleetEnergyMeter
from phasescope.schema import (
    HELD_MEM_BYTES,
    PHASES,
    SIGNAL_COLUMN,
    SIGNAL_NAMES,
    DeviceInfo,
    FloatArray,
    ProcessSample,
    TickBatch,
    Trace,
)
from phasescope.sources.base import LiveSource
from phasescope.sources.host import is_host_device
from phasescope.views.display import (
    MISSING,
    ellipsize,
    fmt_bytes,
    fmt_elapsed,
    fmt_pair,
    fmt_rate,
    fmt_ratio,
    fmt_seconds,
    fmt_si,
    fmt_signal,
    fmt_usd,
    fmt_watts,
    sparkline,
)

DEFAULT_HISTORY = 300  # ticks kept per device (5 min at 1 Hz): the live classifier's window, sparklines
SPARK_WIDTH = 30
MAX_PROCESS_ROWS = 8  # sub-rows per device; the rest are summarised as "+N more"
NO_DEVICE = ""  # group key for processes the source could not tie to a device
# Idle-but-held: a device some process holds (a process on it, or this much memory in use) whose phase is
# idle, or, before the classifier has spoken, whose utilisation stayed under `idle_util` for IDLE_TICKS.
# The memory bar, HELD_MEM_BYTES, lives in schema.py: `classify` and `fleet` judge recorded spans by it too.
IDLE_TICKS = 30
IDLE_HELD = "IDLE·HELD"
HELD_MARK = " (held)"  # after a phase the newest classifier run could not judge: its % is from before
HOOKS_MARK = " (hooks)"  # a phase the process's own hooks reported: exact, not the classifier's estimate
HOST_NO_PHASE = "phase: hooks only"  # Notes of a hooks-only device (`phase_from_hooks`) no hook reports on
TRAINING_ALARM_NOTE = "⚑ training started"  # the onset alarm holds (fires before the phase turns training)
UUID_CHARS = 14  # of a uuid shown in the name column when the source gives no model name
CMD_CELL_CHARS = 60  # of a process's command line in the table's Notes; the TUI's detail line has it whole


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
class Column:
    key: str
    title: str


# The table every view draws. Process sub-rows reuse the columns: util = CPU of one core, memory = RSS
# (and device memory where the source knows it), the first sparkline = that process's CPU history.
COLUMNS: tuple[Column, ...] = (
    Column("name", "Device / process"),
    Column("phase", "Phase"),
    Column("kpi", "Phase KPIs"),
    Column("util", "Util"),
    Column("mem", "Memory used / total"),
    Column("power", "Power / limit"),
    Column("energy", "Energy · cost"),
    Column("temp", "Temp"),
    Column("clocks", "SM / mem clock"),
    Column("pcie", "PCIe rx / tx"),
    Column("spark_util", f"Util (last {SPARK_WIDTH})"),
    Column("spark_power", f"Power (last {SPARK_WIDTH})"),
    Column("info", "Notes"),
)
COLUMN_KEYS: tuple[str, ...] = tuple(c.key for c in COLUMNS)
# What `s` cycles through: "order" is the source's own device order.
SORT_KEYS: tuple[str, ...] = ("order", "phase", "util", "mem", "power", "temp", "name")


@dataclass(frozen=True)
class Row:
    kind: str  # "device" or "process"
    key: str  # unique per table: device uuid, or "uuid/pid"
    device_uuid: str
    cells: dict[str, str]
    phase: str = ""  # the device's phase (PHASES or "unknown"), "" before the classifier spoke
    idle_held: bool = False
    pid: int | None = None  # a process row's PID (None on device rows and the "+N more" row)
    cmd: str = ""  # a process row's command line as its Notes end with it (a narrow table leaves it out)


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


class LiveState:
    """Thread-safe store of the latest tick and a short history per device, plus status for the views."""

    def __init__(
        self,
        source_name: str = "",
        capacity: int = DEFAULT_HISTORY,
        *,
        prices: Prices | Callable[[DeviceInfo], Prices] | None = None,
        idle_util: float = 0.05,
        gap_factor: float = DEFAULT_GAP_FACTOR,
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
        # No interval given: each device's meter learns the period from its ticks' own (data-clock) spacing,
        # so a replay at 10 s or `top --interval 5` is metered with the offline gap rule, not a 1 s tick's.
        self.energy = FleetEnergyMeter(gap_factor=gap_factor)
        self._phases: dict[str, PhaseView] = {}
        self._kpis: dict[str, dict[str, float]] = {}  # device uuid -> hook KPIs (kpi/training, kpi/inference)
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

    def set_local_processes(self, local: bool) -> None:
        """Say whether the source's processes run on this host (`feed` does, from the source's
        `local_processes`); local, host RAM is read once here for %MEM."""
        with self._lock:
            self.local_processes = local
            if local:
                self.host_mem_total = float(psutil.virtual_memory().total)
            self.version += 1

    # ---- writers (sampler thread) ----

    def ingest(self, batch: TickBatch, errors: Mapping[str, int] | None = None) -> None:
        with self._lock:
            seen: set[str] = set()
            for i, dev in enumerate(batch.devices):
                state = self._devices.get(dev.uuid)
                if state is None:
                    state = self._new_device(dev)
                elif state.lost:
                    state.lost = False
                    self._events.append(f"{_dev_name(dev)} is back")
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
                    self._events.append(f"{_dev_name(state.info)} lost: no data this tick")
            self._take_processes(batch.processes)
            self.energy.update(batch, self._metered_phases())
            self._events.extend(batch.events)
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

    # ---- readers (any thread) ----

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

    def energy_totals(self) -> tuple[float | None, float | None]:
        """(joules so far over the measured devices, or None while none is `measured`; USD so far or None
        when no price is set), all devices."""
        with self._lock:
            results = self.energy.results()
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

    def is_lost(self, uuid: str) -> bool:
        with self._lock:
            return self._devices[uuid].lost

    def is_dark(self, uuid: str) -> bool:
        """Lost, or no value at all in its newest tick after it had data (NVML keeps a GPU that fell off the
        bus as an all-NaN row): what the views mark NO DATA."""
        with self._lock:
            dev = self._devices[uuid]
            return dev.lost or _went_dark(dev)

    def events(self) -> list[str]:
        with self._lock:
            return list(self._events)

    def status_line(self) -> str:
        with self._lock:
            parts = [self.source_name or "source", f"{len(self._devices)} device(s)", f"tick {self.ticks}"]
            if self.ticks:
                parts.append(f"last {time.monotonic() - self._last_tick_mono:.0f}s ago")
            else:
                parts.append("waiting for the first sample")
            failures = sum(self._errors.values())
            if failures:
                worst = max(self._errors.items(), key=lambda kv: kv[1])
                parts.append(f"{failures} failed reads (most: {worst[0]} x{worst[1]})")
            lost = [d for d in self._devices.values() if d.lost or _went_dark(d)]
            if lost:
                parts.append(f"NO DATA: {', '.join(_dev_name(d.info) for d in lost)}")
            held = [d for d in self._devices.values() if self._is_idle_held(d)]
            if held:
                parts.append(f"{IDLE_HELD}: {', '.join(_dev_name(d.info) for d in held)}")
            results = self.energy.results()
            # kpi/energy's rule: a host row, or a GPU before its first covered second, has no energy yet
            measured = [r for r in results if r.measured]
            prices, _ = self._row_prices()
            each = (device_cost(r, prices[r.device]).total_usd for r in results)
            costs = [c for c in each if c is not None]
            usd = f" {fmt_usd(sum(costs))}" if costs else ""
            if measured:
                parts.append(f"energy {sum(r.joules for r in measured) / 3.6e6:.3f} kWh{usd}")
            elif costs:  # time-based cost only: say the energy is not measured rather than 0
                parts.append(f"energy {MISSING} kWh · cost{usd}")
            if self.price_note:
                parts.append(self.price_note)
            if self._events:
                parts.append(self._events[-1])
            return " · ".join(parts)

    def rows(self, sort: str = "order", filter_text: str = "") -> list[Row]:
        """The table: device rows in `sort` order, each followed by its process sub-rows."""
        if sort not in SORT_KEYS:
            raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
        needle = filter_text.strip().lower()
        with self._lock:
            devices = sorted(self._devices.values(), key=lambda d: self._device_sort_key(d, sort))
            out: list[Row] = []
            prices, _ = self._row_prices()
            groups: list[tuple[DeviceState | None, list[ProcessSample]]] = [(d, d.processes) for d in devices]
            if self._orphans:
                groups.append((None, self._orphans))
            for dev, procs in groups:
                dev_text = self._device_search_text(dev)
                dev_match = not needle or needle in dev_text
                shown = procs if dev_match else [p for p in procs if needle in _process_search_text(p, self)]
                if not dev_match and not shown:
                    continue
                out.append(self._device_row(dev, prices))
                shown = sorted(shown, key=lambda p: _process_sort_key(p, sort))
                uuid = dev.info.uuid if dev else NO_DEVICE
                out.extend(self._process_row(uuid, p) for p in shown[:MAX_PROCESS_ROWS])
                if len(shown) > MAX_PROCESS_ROWS:
                    more = {k: "" for k in COLUMN_KEYS}
                    more["name"] = f"  └ +{len(shown) - MAX_PROCESS_ROWS} more"
                    out.append(Row("process", f"{uuid}/more", uuid, more))
            return out

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
        uuids = list(self._devices) + [u for u in self.energy.meters if u not in self._devices]
        base = {u: self._price(u) for u in uuids}
        return mig_prices(base, [d.info for d in self._devices.values()])

    def _is_idle_held(self, dev: DeviceState) -> bool:
        if dev.lost or _went_dark(dev):
            return False
        mem = float(dev.history.last()[SIGNAL_COLUMN["mem_used"]])
        if not (dev.processes or (math.isfinite(mem) and mem >= HELD_MEM_BYTES)):
            return False
        phase = self._shown_phase(dev)
        if phase in PHASES:
            return phase == "idle"
        util = dev.history.column(SIGNAL_COLUMN["gpu_util"])[-IDLE_TICKS:]
        if util.size < IDLE_TICKS or not np.isfinite(util).all():
            return False
        return float(util.max()) < self.idle_util

    def _device_sort_key(self, d: DeviceState, sort: str) -> tuple[object, ...]:
        if sort == "phase":  # training, inference, other, idle, unknown; the most confident first
            view = self._phase_view(d)
            phase = view.phase if view is not None else ""
            rank = PHASES.index(phase) if phase in PHASES else len(PHASES)
            conf = view.confidence if view and math.isfinite(view.confidence) else 1.0 if phase else 0.0
            return (rank, -conf, d.order)
        return _device_sort_key(d, sort)

    def _device_search_text(self, d: DeviceState | None) -> str:
        text = _device_search_text(d)
        if d is None:
            return text
        view = self._phase_view(d)
        if view is not None and view.label:
            text += f" {view.label}"
        if self._is_idle_held(d):
            text += " idle-held idle·held"
        return text

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

    def _shown_phase(self, dev: DeviceState) -> str:
        view = self._phase_view(dev)
        return view.phase if view is not None else ""

    def _metered_phases(self) -> dict[str, str]:
        """uuid -> the phase label its energy and time go under this tick; none: "unknown" (caller holds
        the lock)."""
        views = ((u, self._phase_view(d)) for u, d in self._devices.items())
        return {u: v.label for u, v in views if v is not None}

    def _phase_cell(self, view: PhaseView | None) -> tuple[str, str]:
        if view is None:
            return MISSING, ""
        if view.hooks_label:
            return view.hooks_label + HOOKS_MARK, view.phase
        conf = f" {view.confidence * 100:.0f}%" if math.isfinite(view.confidence) else ""
        return f"{view.phase}{conf}{HELD_MARK if view.held else ''}", view.phase

    def _energy_cell(self, uuid: str, prices: Mapping[str, Prices]) -> str:
        meter = self.energy.meters.get(uuid)
        if meter is None:
            return MISSING
        result = meter.result(uuid)
        cost = device_cost(result, prices[uuid]).total_usd
        usd = f" · {fmt_usd(cost)}" if cost is not None else ""
        if not result.measured:  # no power sensor, the first tick, a dropout since start: energy unmeasured,
            return f"{MISSING} kWh{usd}" if usd else MISSING  # the time-based cost alone
        return f"{result.kwh:.3f} kWh{usd}"

    def _device_row(self, dev: DeviceState | None, prices: Mapping[str, Prices]) -> Row:
        cells = dict.fromkeys(COLUMN_KEYS, MISSING)
        if dev is None:
            cells.update(name="processes (no device)", spark_util="", spark_power="", info="")
            return Row("device", NO_DEVICE, NO_DEVICE, cells)
        now = np.full(len(SIGNAL_NAMES), np.nan) if dev.lost else dev.history.last()

        def v(sig: str) -> float:
            return float(now[SIGNAL_COLUMN[sig]])

        dark = dev.lost or _went_dark(dev)
        limit = v("power_limit")
        if not math.isfinite(limit) and not dark:  # a limit read once still holds when one read fails
            limit = _finite_max(dev.history.column(SIGNAL_COLUMN["power_limit"]))
        cells["name"] = _dev_name(dev.info, short=True)
        cells["util"] = fmt_ratio(v("gpu_util"))
        cells["mem"] = fmt_pair(fmt_bytes(v("mem_used")), fmt_bytes(v("mem_total")))
        cells["power"] = fmt_pair(fmt_watts(v("power")), fmt_watts(limit))
        cells["temp"] = fmt_signal("temperature", v("temperature"))
        cells["clocks"] = _clocks(v("sm_clock"), v("mem_clock"))
        cells["pcie"] = fmt_pair(fmt_rate(v("pcie_rx")), fmt_rate(v("pcie_tx")))
        cells["spark_util"] = sparkline(dev.history.column(SIGNAL_COLUMN["gpu_util"]), SPARK_WIDTH, 0.0, 1.0)
        power_hi = limit if math.isfinite(limit) else None  # else: scale to the peak in the history
        power_hist = dev.history.column(SIGNAL_COLUMN["power"])
        cells["spark_power"] = sparkline(power_hist, SPARK_WIDTH, 0.0, power_hi)
        view = self._phase_view(dev)
        cells["phase"], phase = self._phase_cell(view)
        cells["kpi"] = kpi_text(self._kpis.get(dev.info.uuid), phase)  # the side of the phase shown
        cells["energy"] = self._energy_cell(dev.info.uuid, prices)
        idle_held = self._is_idle_held(dev)
        notes = [IDLE_HELD] if idle_held else []
        if view is not None and view.training_alarm and not dark:
            notes.insert(0, TRAINING_ALARM_NOTE)
        if dev.lost:
            notes.append("LOST")
        elif dark:
            notes.append("NO DATA")  # e.g. NVML marked it lost: the source keeps the row, all NaN
        if dev.info.parent_uuid:
            notes.append("MIG")
        if view is None and phase_from_hooks(dev.info):
            notes.append(HOST_NO_PHASE)
        if dev.processes:
            notes.append(f"{len(dev.processes)} proc")
        cells["info"] = " · ".join(notes)
        return Row("device", dev.info.uuid, dev.info.uuid, cells, phase, idle_held)

    def _process_row(self, uuid: str, p: ProcessSample) -> Row:
        cells = dict.fromkeys(COLUMN_KEYS, "")
        user = f" ({p.user})" if p.user else ""
        cells["name"] = f"  └ {p.pid} {p.name}".rstrip() + user
        cells["util"] = fmt_ratio(p.cpu_util)
        mem = f"rss {fmt_bytes(p.rss)}"
        share = mem_share(p.rss, self.host_mem_total)
        if math.isfinite(share):
            mem += f" ({share * 100:.1f}%)"
        if math.isfinite(p.gpu_mem_used):
            mem = f"dev {fmt_bytes(p.gpu_mem_used)} · {mem}"
        cells["mem"] = mem
        hist = np.asarray(self._proc_cpu.get(p.pid, ()), dtype=np.float64)
        peak = _finite_max(hist)
        cells["spark_util"] = sparkline(hist, SPARK_WIDTH, 0.0, peak if peak > 1.0 else 1.0)
        notes = [f"cpu {fmt_ratio(p.cpu_util)}"]
        if math.isfinite(p.sm_util):
            notes.append(f"sm {fmt_ratio(p.sm_util)}")
        notes.append(f"{p.threads:.0f} thr" if math.isfinite(p.threads) else f"{MISSING} thr")
        notes.append("torch" if p.uses_torch else "no torch")
        role = self.process_labels.get(p.pid)
        if role:
            notes.append(role)
        up = p.time - p.start_time
        if math.isfinite(up):
            notes.append(f"up {fmt_elapsed(up)}")
        cmd = ellipsize(p.cmdline, CMD_CELL_CHARS)
        if cmd:  # last: the one long, free-form note (as nvitop's COMMAND column)
            notes.append(cmd)
        cells["info"] = " · ".join(notes)
        hook_phase = self._proc_phase.get(p.pid, "")
        if hook_phase:
            cells["phase"] = hook_phase + HOOKS_MARK
        kpis = self._proc_kpis.get(p.pid)
        if kpis:
            dev = self._devices.get(uuid)
            cells["kpi"] = kpi_text(kpis, hook_phase or (self._shown_phase(dev) if dev else ""))
        return Row("process", f"{uuid}/{p.pid}", uuid, cells, hook_phase, pid=p.pid, cmd=cmd)


def kpi_text(kpis: Mapping[str, float] | None, phase: str) -> str:
    """The KPIs that matter for `phase`: step time, samples/s, MFU for training; requests/s, p50/p99 latency
    for inference. With no phase, whichever side the hooks measured. MISSING when there are none."""
    if not kpis:
        return MISSING

    def has(key: str) -> bool:
        v = kpis.get(key)
        return v is not None and math.isfinite(v)

    training = [k for k in ("step_time_p50_s", "samples_per_s", "mfu") if has(k)]
    inference = [k for k in ("requests_per_s", "latency_p50_s", "latency_p99_s") if has(k)]
    side = inference if (phase == "inference" and inference) or not training else training
    fmt = {
        "step_time_p50_s": lambda v: f"step {fmt_seconds(v)}",
        "samples_per_s": lambda v: f"{fmt_si(v)} samp/s",
        "mfu": lambda v: f"MFU {v * 100:.1f}%",
        "requests_per_s": lambda v: f"{fmt_si(v)} req/s",
        "latency_p50_s": lambda v: f"p50 {fmt_seconds(v)}",
        "latency_p99_s": lambda v: f"p99 {fmt_seconds(v)}",
    }
    parts = [fmt[k](float(kpis[k])) for k in side]
    return " · ".join(parts) or MISSING


def _dev_name(info: DeviceInfo, short: bool = False) -> str:
    """'#0 NVIDIA H100 80GB HBM3', or the uuid where the source gives no model name (cut when `short`:
    the table's column, where the filter still matches the whole uuid)."""
    idx = "" if info.index is None else f"#{info.index} "
    cut = short and len(info.uuid) > UUID_CHARS + 1
    name = info.name or (info.uuid[:UUID_CHARS] + "…" if cut else info.uuid)
    return f"{idx}{name}"


def _finite_max(values: FloatArray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else math.nan


def _went_dark(dev: DeviceState) -> bool:
    """The latest tick has no value at all for a device that had values before."""
    if len(dev.history) < 2 or np.isfinite(dev.history.last()).any():
        return False
    return dev.history.any_finite()


def _clocks(sm: float, mem: float) -> str:
    if not math.isfinite(sm) and not math.isfinite(mem):
        return MISSING
    part = [f"{x / 1e6:.0f}" if math.isfinite(x) else MISSING for x in (sm, mem)]
    return f"{part[0]} / {part[1]} MHz"


def _nan_last(value: float, descending: bool) -> tuple[int, float]:
    if not math.isfinite(value):
        return (1, 0.0)
    return (0, -value if descending else value)


def _device_sort_key(d: DeviceState, sort: str) -> tuple[object, ...]:
    if sort == "order":
        return (d.order,)
    if sort == "name":
        return (_dev_name(d.info).lower(), d.order)
    sig = {"util": "gpu_util", "mem": "mem_used", "power": "power", "temp": "temperature"}[sort]
    value = math.nan if d.lost else float(d.history.last()[SIGNAL_COLUMN[sig]])
    return (*_nan_last(value, descending=True), d.order)  # busiest first, missing last


def _process_sort_key(p: ProcessSample, sort: str) -> tuple[object, ...]:
    if sort == "util":
        return (*_nan_last(p.cpu_util, True), p.pid)
    if sort == "mem":
        mem = p.gpu_mem_used if math.isfinite(p.gpu_mem_used) else p.rss
        return (*_nan_last(mem, True), p.pid)
    if sort == "name":
        return (p.name.lower(), p.pid)
    return (p.pid,)


def _device_search_text(d: DeviceState | None) -> str:
    if d is None:
        return "processes (no device)"
    return f"{_dev_name(d.info)} {d.info.uuid} {d.info.name} {d.info.host}".lower()


def _process_search_text(p: ProcessSample, state: LiveState) -> str:
    torch = "torch" if p.uses_torch else ""
    return f"{p.pid} {p.name} {p.user} {torch} {state.process_labels.get(p.pid, '')} {p.cmdline}".lower()


def mem_share(rss: float, host_mem_total: float) -> float:
    """A process's RSS as a ratio of host RAM (top's %MEM); NaN when either is unknown."""
    return rss / host_mem_total if host_mem_total > 0 else math.nan  # NaN compares False: stays NaN


def process_detail(p: ProcessSample, host_mem_total: float = math.nan) -> str:
    """One process in full for a detail line: PID, user, start and elapsed time, %MEM, whole command."""
    parts = [f"PID {p.pid}", p.user or f"user {MISSING}"]
    if math.isfinite(p.start_time):
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.start_time))
        parts.append(f"started {started} (up {fmt_elapsed(p.time - p.start_time)})")
    share = mem_share(p.rss, host_mem_total)
    of_ram = f" = {share * 100:.1f}% of RAM" if math.isfinite(share) else ""
    parts.append(f"rss {fmt_bytes(p.rss)}{of_ram}")
    parts.append(p.cmdline or p.name or MISSING)
    return " · ".join(parts)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _process_entry(p: ProcessSample, host_mem_total: float) -> dict[str, object]:
    return {
        "pid": p.pid, "name": p.name, "user": p.user, "cmdline": p.cmdline,
        "start_time": _finite_or_none(p.start_time), "elapsed_s": _finite_or_none(p.time - p.start_time),
        "gpu_mem_used": _finite_or_none(p.gpu_mem_used), "sm_util": _finite_or_none(p.sm_util),
        "cpu_util": _finite_or_none(p.cpu_util), "rss": _finite_or_none(p.rss),
        "mem_ratio": _finite_or_none(mem_share(p.rss, host_mem_total)),
        "threads": _finite_or_none(p.threads), "uses_torch": p.uses_torch,
    }


def feed(
    state: LiveState,
    source: LiveSource,
    interval_s: float,
    stop: threading.Event,
    duration: float | None = None,
    annotate: Callable[[LiveState], None] | None = None,
    *,
    before: Callable[[], None] | None = None,
    sink: Callable[[TickBatch], None] | None = None,
) -> None:
    """Sample `source` into `state` until `stop` is set or `duration` has passed, then close the source.

    `annotate(state)` runs after each tick in the same thread (the live classifier, hook KPIs), so the view
    never waits on it. `before()` runs once in this thread before the first sample (e.g. the classifier
    over preloaded history); `sink(batch)` gets every tick after the state (e.g. the live store). Runs in a
    worker thread; a failure ends sampling (or, in `annotate`, `before` or `sink`, that part) with a status
    message instead of taking the view down.
    """
    hooks = [annotate] if annotate is not None else []
    sinks = [sink] if sink is not None else []
    state.set_local_processes(bool(getattr(source, "local_processes", False)))
    if before is not None:
        try:
            before()
        except Exception as exc:
            state.note(f"before sampling: {type(exc).__name__}: {exc}")

    def on_tick(batch: TickBatch) -> None:
        if getattr(source, "exhausted", False):  # a replay that reached its end: keep the last picture
            for event in batch.events:
                state.note(event)
            stop.set()
            return
        state.ingest(batch, source.error_counts())
        for put in list(sinks):
            try:
                put(batch)
            except Exception as exc:  # e.g. a full disk: the view goes on without the store
                sinks.remove(put)
                state.note(f"store writes stopped: {type(exc).__name__}: {exc}")
        for hook in list(hooks):
            try:
                hook(state)
            except Exception as exc:  # keep the telemetry coming; say once why the phase stopped updating
                hooks.remove(hook)
                state.note(f"phase/KPI updates stopped: {type(exc).__name__}: {exc}")

    try:
        from phasescope.sources.sampler import Sampler

        Sampler(source, interval_s).run(on_tick, duration=duration, stop=stop)
    except Exception as exc:  # a view must survive any source failure and say what happened
        state.note(f"sampling stopped: {type(exc).__name__}: {exc}")
    finally:
        try:
            source.close()
        except Exception as exc:
            state.note(f"closing {source.name} failed: {exc}")
