"""The live table every terminal view draws (the TUI, `top --plain` / `--once`, the demo), and its status
line: columns, formatted cells, sort, filter and the "+N more" rows, all from a `LiveState` snapshot.

The state (live/state.py) holds data only; this module is the one place its numbers become screen text
(the telemetry-only KPIs' cell comes from views/kpis.py, as in every view). Process sub-rows reuse the
device columns: util = CPU of one core, memory = RSS (and device memory where the source knows it), the
first sparkline = that process's CPU history.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from phasescope.kpi.cost import device_cost
from phasescope.live.state import (
    NO_DEVICE,
    DeviceSnapshot,
    LiveSnapshot,
    LiveState,
    PhaseView,
    ProcessSnapshot,
    device_name,
    mem_share,
    phase_from_hooks,
)
from phasescope.schema import PHASES, ProcessSample
from phasescope.verify.audit import WALL_CLOCK_FROM
from phasescope.views import kpis as telemetry
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

SPARK_WIDTH = 30
MAX_PROCESS_ROWS = 8  # sub-rows per device; the rest are summarised as "+N more"
IDLE_HELD = "IDLE·HELD"
HELD_MARK = " (held)"  # after a phase the newest classifier run could not judge: its % is from before
HOOKS_MARK = " (hooks)"  # a phase the process's own hooks reported: exact, not the classifier's estimate
HOST_NO_PHASE = "phase: hooks only"  # Notes of a hooks-only device (`phase_from_hooks`) no hook reports on
TRAINING_ALARM_NOTE = "⚑ training started"  # the onset alarm holds (fires before the phase turns training)
UUID_CHARS = 14  # of a uuid shown in the name column when the source gives no model name
DISAGREES = "≠ processes:"  # Notes of a device whose processes claim the other phase (a vLLM server training)
CMD_CELL_CHARS = 60  # of a process's command line in the table's Notes; the TUI's detail line has it whole


@dataclass(frozen=True)
class Column:
    key: str
    title: str


# In order of priority (as nvitop at 80-120 columns): a terminal too narrow for all shows ESSENTIAL and then
# as many of the others as fit, in this order; Notes (NO DATA, IDLE·HELD, MIG) is last and always shown.
COLUMNS: tuple[Column, ...] = (
    Column("name", "Device / process"),
    Column("phase", "Phase"),
    Column("util", "Util"),
    Column("mem", "Mem used / total"),
    Column("power", "Power / cap"),
    Column("energy", "Energy · cost"),
    Column("kpi", "Phase KPIs"),
    Column("rhythm", "Telemetry KPIs"),
    Column("temp", "Temp"),
    Column("clocks", "SM / mem clock"),
    Column("pcie", "PCIe rx / tx"),
    Column("spark_util", f"Util (last {SPARK_WIDTH})"),
    Column("spark_power", f"Power (last {SPARK_WIDTH})"),
    Column("info", "Notes"),
)
COLUMN_KEYS: tuple[str, ...] = tuple(c.key for c in COLUMNS)
ESSENTIAL: frozenset[str] = frozenset({"name", "phase", "util", "mem", "power", "info"})
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


def _snap(state: LiveState | LiveSnapshot) -> LiveSnapshot:
    return state.snapshot() if isinstance(state, LiveState) else state


def rows(state: LiveState | LiveSnapshot, sort: str = "order", filter_text: str = "") -> list[Row]:
    """The table: device rows in `sort` order, each followed by its process sub-rows (at most
    MAX_PROCESS_ROWS, then "+N more"); with `filter_text`, only what matches it."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
    snap = _snap(state)
    needle = filter_text.strip().lower()
    devices = sorted(snap.devices, key=lambda d: _device_sort_key(d, sort))
    groups: list[tuple[DeviceSnapshot | None, list[ProcessSnapshot]]] = [(d, d.processes) for d in devices]
    if snap.orphans:
        groups.append((None, snap.orphans))
    out: list[Row] = []
    for dev, procs in groups:
        dev_match = not needle or needle in _device_search_text(dev)
        shown = procs if dev_match else [p for p in procs if needle in _process_search_text(p)]
        if not dev_match and not shown:
            continue
        out.append(_device_row(dev))
        shown = sorted(shown, key=lambda p: _process_sort_key(p.sample, sort))
        uuid = dev.info.uuid if dev else NO_DEVICE
        shown_phase = dev.phase.phase if dev is not None and dev.phase is not None else ""
        out.extend(_process_row(uuid, p, shown_phase, snap.host_mem_total) for p in shown[:MAX_PROCESS_ROWS])
        if len(shown) > MAX_PROCESS_ROWS:
            more = dict.fromkeys(COLUMN_KEYS, "")
            more["name"] = f"  └ +{len(shown) - MAX_PROCESS_ROWS} more"
            out.append(Row("process", f"{uuid}/more", uuid, more))
    return out


def status_line(state: LiveState | LiveSnapshot) -> str:
    """The one line under the table: source (a replay's speed and trace time), devices, ticks and their age,
    failed reads, NO DATA and IDLE·HELD devices, energy and cost so far, the price note and the newest
    event."""
    snap = _snap(state)
    source = snap.source_name or "source"
    if math.isfinite(snap.trace_time):  # a replay: its own clock, not wall time running `speed` times faster
        t = snap.trace_time
        # A log on its own clock (uptime seconds) is shown as such, not as a time in January 1970.
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t >= WALL_CLOCK_FROM else f"t={t:.0f}s"
        source = f"{source} {snap.speed:g}× · {at} (trace time)"
    parts = [source, f"{len(snap.devices)} device(s)", f"tick {snap.ticks}"]
    if snap.ticks:
        parts.append(f"last {snap.since_tick_s:.0f}s ago")
    else:
        parts.append("waiting for the first sample")
    failures = sum(snap.errors.values())
    if failures:
        worst = max(snap.errors.items(), key=lambda kv: kv[1])
        parts.append(f"{failures} failed reads (most: {worst[0]} x{worst[1]})")
    lost = [d for d in snap.devices if d.dark]
    if lost:
        parts.append(f"NO DATA: {', '.join(device_name(d.info) for d in lost)}")
    held = [d for d in snap.devices if d.idle_held]
    if held:
        parts.append(f"{IDLE_HELD}: {', '.join(device_name(d.info) for d in held)}")
    # kpi/energy's rule: a host row, or a GPU before its first covered second, has no energy yet
    measured = [r for r in snap.energy if r.measured]
    each = (device_cost(r, snap.prices[r.device]).total_usd for r in snap.energy)
    costs = [c for c in each if c is not None]
    usd = f" {fmt_usd(sum(costs))}" if costs else ""
    if measured:
        parts.append(f"energy {sum(r.joules for r in measured) / 3.6e6:.3f} kWh{usd}")
    elif costs:  # time-based cost only: say the energy is not measured rather than 0
        parts.append(f"energy {MISSING} kWh · cost{usd}")
    if snap.price_note:
        parts.append(snap.price_note)
    if snap.events:
        parts.append(snap.events[-1])
    return " · ".join(parts)


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


# ---- cells ----


def _short_name(info_name: str, uuid: str, index: int | None) -> str:
    """The name column: as `device_name`, a uuid cut to UUID_CHARS (the filter still matches it whole)."""
    idx = "" if index is None else f"#{index} "
    cut = len(uuid) > UUID_CHARS + 1
    return f"{idx}{info_name or (uuid[:UUID_CHARS] + '…' if cut else uuid)}"


def _phase_cell(view: PhaseView | None) -> tuple[str, str]:
    if view is None:
        return MISSING, ""
    if view.hooks_label:
        return view.hooks_label + HOOKS_MARK, view.phase
    conf = f" {view.confidence * 100:.0f}%" if math.isfinite(view.confidence) else ""
    return f"{view.phase}{conf}{HELD_MARK if view.held else ''}", view.phase


def _energy_cell(dev: DeviceSnapshot) -> str:
    result = dev.energy
    if result is None:
        return MISSING
    cost = device_cost(result, dev.prices).total_usd
    usd = f" · {fmt_usd(cost)}" if cost is not None else ""
    if not result.measured:  # no power sensor, the first tick, a dropout since start: energy unmeasured,
        return f"{MISSING} kWh{usd}" if usd else MISSING  # the time-based cost alone
    return f"{result.kwh:.3f} kWh{usd}"


def _device_row(dev: DeviceSnapshot | None) -> Row:
    cells = dict.fromkeys(COLUMN_KEYS, MISSING)
    if dev is None:
        cells.update(name="processes (no device)", spark_util="", spark_power="", info="")
        return Row("device", NO_DEVICE, NO_DEVICE, cells)
    v = dev.value
    limit = dev.power_limit
    cells["name"] = _short_name(dev.info.name, dev.info.uuid, dev.info.index)
    cells["util"] = fmt_ratio(v("gpu_util"))
    cells["mem"] = fmt_pair(fmt_bytes(v("mem_used")), fmt_bytes(v("mem_total")))
    cells["power"] = fmt_pair(fmt_watts(v("power")), fmt_watts(limit))
    cells["temp"] = fmt_signal("temperature", v("temperature"))
    cells["clocks"] = _clocks(v("sm_clock"), v("mem_clock"))
    cells["pcie"] = fmt_pair(fmt_rate(v("pcie_rx")), fmt_rate(v("pcie_tx")))
    cells["spark_util"] = sparkline(dev.util_history, SPARK_WIDTH, 0.0, 1.0)
    power_hi = limit if math.isfinite(limit) else None  # else: scale to the peak in the history
    cells["spark_power"] = sparkline(dev.power_history, SPARK_WIDTH, 0.0, power_hi)
    view = dev.phase
    cells["phase"], phase = _phase_cell(view)
    cells["kpi"] = kpi_text(dev.kpis, phase)  # the side of the phase shown
    cells["rhythm"] = telemetry.kpi_text(dev.telemetry_kpis)  # from telemetry alone, no hooks
    cells["energy"] = _energy_cell(dev)
    notes = [IDLE_HELD] if dev.idle_held else []
    if view is not None and view.training_alarm and not dev.dark:
        notes.insert(0, TRAINING_ALARM_NOTE)
    if dev.lost:
        notes.append("LOST")
    elif dev.dark:
        notes.append("NO DATA")  # e.g. NVML marked it lost: the source keeps the row, all NaN
    if dev.info.parent_uuid:
        notes.append("MIG")
    if view is None and phase_from_hooks(dev.info):
        notes.append(HOST_NO_PHASE)
    if dev.processes:
        notes.append(f"{len(dev.processes)} proc")
    claim = dev.evidence
    if claim is not None and claim.engines:  # what its processes say they are: context, not the phase
        said = "+".join(claim.engines)
        if claim.disagrees:
            notes.insert(0, f"{DISAGREES} {said} ({claim.role})")
        else:
            notes.append(said)
    cells["info"] = " · ".join(notes)
    return Row("device", dev.info.uuid, dev.info.uuid, cells, phase, dev.idle_held)


def _process_row(uuid: str, proc: ProcessSnapshot, device_phase: str, host_mem_total: float) -> Row:
    p = proc.sample
    cells = dict.fromkeys(COLUMN_KEYS, "")
    user = f" ({p.user})" if p.user else ""
    cells["name"] = f"  └ {p.pid} {p.name}".rstrip() + user
    cells["util"] = fmt_ratio(p.cpu_util)
    mem = f"rss {fmt_bytes(p.rss)}"
    share = mem_share(p.rss, host_mem_total)
    if math.isfinite(share):
        mem += f" ({share * 100:.1f}%)"
    if math.isfinite(p.gpu_mem_used):
        mem = f"dev {fmt_bytes(p.gpu_mem_used)} · {mem}"
    cells["mem"] = mem
    hist = proc.cpu_history
    finite = hist[np.isfinite(hist)]
    peak = float(finite.max()) if finite.size else math.nan
    cells["spark_util"] = sparkline(hist, SPARK_WIDTH, 0.0, peak if peak > 1.0 else 1.0)
    notes = [f"cpu {fmt_ratio(p.cpu_util)}"]
    if math.isfinite(p.sm_util):
        notes.append(f"sm {fmt_ratio(p.sm_util)}")
    notes.append(f"{p.threads:.0f} thr" if math.isfinite(p.threads) else f"{MISSING} thr")
    notes.append("torch" if p.uses_torch else "no torch")
    if proc.label:
        notes.append(proc.label)
    up = p.time - p.start_time
    if math.isfinite(up):
        notes.append(f"up {fmt_elapsed(up)}")
    cmd = ellipsize(p.cmdline, CMD_CELL_CHARS)
    if cmd:  # last: the one long, free-form note (as nvitop's COMMAND column)
        notes.append(cmd)
    cells["info"] = " · ".join(notes)
    if proc.hook_phase:
        cells["phase"] = proc.hook_phase + HOOKS_MARK
    if proc.kpis:
        cells["kpi"] = kpi_text(proc.kpis, proc.hook_phase or device_phase)
    return Row("process", f"{uuid}/{p.pid}", uuid, cells, proc.hook_phase, pid=p.pid, cmd=cmd)


def _clocks(sm: float, mem: float) -> str:
    if not math.isfinite(sm) and not math.isfinite(mem):
        return MISSING
    part = [f"{x / 1e6:.0f}" if math.isfinite(x) else MISSING for x in (sm, mem)]
    return f"{part[0]} / {part[1]} MHz"


# ---- sort and filter ----


def _nan_last(value: float, descending: bool) -> tuple[int, float]:
    if not math.isfinite(value):
        return (1, 0.0)
    return (0, -value if descending else value)


def _device_sort_key(d: DeviceSnapshot, sort: str) -> tuple[object, ...]:
    if sort == "order":
        return (d.order,)
    if sort == "name":
        return (device_name(d.info).lower(), d.order)
    if sort == "phase":  # training, inference, other, idle, unknown; the most confident first
        view = d.phase
        phase = view.phase if view is not None else ""
        rank = PHASES.index(phase) if phase in PHASES else len(PHASES)
        conf = view.confidence if view and math.isfinite(view.confidence) else 1.0 if phase else 0.0
        return (rank, -conf, d.order)
    sig = {"util": "gpu_util", "mem": "mem_used", "power": "power", "temp": "temperature"}[sort]
    return (*_nan_last(d.value(sig), descending=True), d.order)  # busiest first, missing last


def _process_sort_key(p: ProcessSample, sort: str) -> tuple[object, ...]:
    if sort == "util":
        return (*_nan_last(p.cpu_util, True), p.pid)
    if sort == "mem":
        mem = p.gpu_mem_used if math.isfinite(p.gpu_mem_used) else p.rss
        return (*_nan_last(mem, True), p.pid)
    if sort == "name":
        return (p.name.lower(), p.pid)
    return (p.pid,)


def _device_search_text(d: DeviceSnapshot | None) -> str:
    if d is None:
        return "processes (no device)"
    text = f"{device_name(d.info)} {d.info.uuid} {d.info.name} {d.info.host}".lower()
    if d.phase is not None and d.phase.label:
        text += f" {d.phase.label}"
    if d.idle_held:
        text += " idle-held idle·held"
    return text


def _process_search_text(proc: ProcessSnapshot) -> str:
    p = proc.sample
    torch = "torch" if p.uses_torch else ""
    return f"{p.pid} {p.name} {p.user} {torch} {proc.label} {p.cmdline}".lower()
