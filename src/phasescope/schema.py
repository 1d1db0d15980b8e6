"""The one definition of every signal phasescope knows, and the batch types that carry them.

Units are base units, as in Prometheus: ratio 0-1, bytes, watts, joules, hertz, celsius,
bytes per second. Every reader converts into this schema at its edge; nothing downstream
knows a file format. A missing value is NaN, never a silent 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # the Verdict's parts, for types only: at run time schema imports nothing of phasescope
    from phasescope.classify.decide import Segment
    from phasescope.classify.held import Held
    from phasescope.classify.model import WindowPredictions

FloatArray = npt.NDArray[np.float64]

Unit = Literal["ratio", "bytes", "watts", "joules", "celsius", "hertz", "bytes_per_second", "bitmask"]


@dataclass(frozen=True)
class Signal:
    """One telemetry signal: its name, base unit, storage dtype and meaning."""

    name: str
    unit: Unit
    help: str
    dtype: str = "float64"
    # Counters only grow (energy); gauges go up and down.
    kind: Literal["gauge", "counter"] = "gauge"
    # The 9 NVML signals of the reference paper (Rahman & Tajdari) at 1 Hz.
    paper: bool = False
    # Present only on some devices (NVLink, GPM); absence there is normal, not a fault.
    optional: bool = False


_SIGNALS: tuple[Signal, ...] = (
    Signal("gpu_util", "ratio", "Fraction of the last sample period in which a kernel ran", paper=True),
    Signal("mem_util", "ratio", "Fraction of the last sample period in which memory was read or written",
           paper=True),
    Signal("mem_used", "bytes", "Device memory in use", paper=True),
    Signal("power", "watts", "Board power draw", paper=True),
    Signal("temperature", "celsius", "GPU core temperature", paper=True),
    Signal("sm_clock", "hertz", "Streaming multiprocessor clock", paper=True),
    Signal("mem_clock", "hertz", "Memory clock", paper=True),
    Signal("pcie_tx", "bytes_per_second", "PCIe transmit throughput (device to host)", paper=True),
    Signal("pcie_rx", "bytes_per_second", "PCIe receive throughput (host to device)", paper=True),
    Signal("mem_total", "bytes", "Device memory capacity"),
    Signal("energy", "joules", "Energy consumed since the driver loaded", kind="counter"),
    Signal("power_limit", "watts", "Enforced power limit"),
    Signal("throttle_reasons", "bitmask", "NVML clocks-event (throttle) reasons bitmask"),
    Signal("nvlink_tx", "bytes_per_second", "NVLink transmit throughput, all links", optional=True),
    Signal("nvlink_rx", "bytes_per_second", "NVLink receive throughput, all links", optional=True),
    Signal("sm_active", "ratio", "Fraction of SM cycles with at least one warp resident (GPM / DCGM)",
           optional=True),
    Signal("tensor_active", "ratio", "Fraction of cycles the tensor pipes were active (GPM / DCGM)",
           optional=True),
    Signal("dram_active", "ratio", "Fraction of cycles the memory interface was busy (GPM / DCGM)",
           optional=True),
)

SIGNALS: Mapping[str, Signal] = {s.name: s for s in _SIGNALS}
SIGNAL_NAMES: tuple[str, ...] = tuple(SIGNALS)
PAPER_SIGNALS: tuple[str, ...] = tuple(s.name for s in _SIGNALS if s.paper)

# The physical range of each unit, bounds included. A value outside is not telemetry (a corrupt row, a
# driver sentinel, a unit mix-up): readers and live sources turn it into NaN (missing) and say so, so no
# joule, cost or verdict is ever computed from it. Generous on purpose: they catch the impossible, not
# the unusual.
RATIO_SLACK = 0.05  # utilisation is a rounded percent or a window average: 100.4 % happens, 150 % does not
_UNIT_RANGE: dict[Unit, tuple[float, float]] = {
    "ratio": (0.0, 1.0 + RATIO_SLACK),
    "watts": (0.0, 5000.0),  # per device; the largest boards draw about 1.2 kW (B200), 2.7 kW (GB200)
    "celsius": (-40.0, 150.0),  # coldest rated ambient to far past every GPU's shutdown (about 90-105 C)
    "hertz": (0.0, 1e11),  # GDDR7 memory clocks read 14 GHz in nvidia-smi; 100 GHz leaves room
    "bytes": (0.0, 2.0**50),  # 1 PiB of device memory; the largest GPUs have under 300 GB
    "bytes_per_second": (0.0, 1e14),  # NVLink 5 moves 1.8 TB/s per GPU; 100 TB/s leaves room
    "joules": (0.0, 1e15),  # an energy counter: 1 kW for 30,000 years; never negative
    "bitmask": (0.0, 2.0**64 - 1),  # NVML's 64-bit reasons mask
}
RANGES: Mapping[str, tuple[float, float]] = {s.name: _UNIT_RANGE[s.unit] for s in _SIGNALS}


def impossible(name: str, values: Any) -> npt.NDArray[np.bool_]:
    """Where the values of signal `name` lie outside its physical range (RANGES); inf is outside, NaN (a
    missing value) is not."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = RANGES[name]
    return ~np.isnan(v) & ~((v >= lo) & (v <= hi))

PHASES: tuple[str, ...] = ("training", "inference", "other", "idle")
Phase = Literal["training", "inference", "other", "idle", "unknown"]
# Idle that is *held*: a device holding at least this much memory (a loaded model, a CUDA context kept
# open) while idle is paid for and doing nothing. A bare GPU shows a few hundred MiB at most (driver,
# display: 453-728 MiB on the idle RTX 3090s in ../shared/data). The live view (live_state), `classify`
# and `fleet` (classify/held.py) judge by this one bar.
HELD_MEM_BYTES = 1024.0**3

# Conversions from the units the common logs use into base units.
MIB = 1024.0 * 1024.0
KB_PER_S = 1000.0  # NVML reports PCIe throughput in KB/s (1 KB = 1000 bytes per nvml.h)
MHZ = 1e6
PERCENT = 0.01


@dataclass(frozen=True)
class DeviceInfo:
    """Identity of one device. `uuid` is the key: NVML ignores CUDA_VISIBLE_DEVICES, so indices are not."""

    uuid: str
    name: str = ""  # model, e.g. "NVIDIA H100 80GB HBM3"
    index: int | None = None
    host: str = ""
    parent_uuid: str | None = None  # set for a MIG instance
    extra: Mapping[str, str] = field(default_factory=dict)

    def label(self) -> str:
        idx = "" if self.index is None else f"#{self.index} "
        return f"{idx}{self.name or 'device'} {self.uuid}".strip()


def _as_float_array(values: Any, n: int, name: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"signal {name!r} has shape {arr.shape}, expected ({n},) to match the time column")
    return arr


class Trace:
    """A columnar batch of samples for one device: a time column plus one float64 column per signal.

    `time` is seconds (Unix epoch where the source gives wall time, else the source's own clock).
    Signals not present in `columns` read as all-NaN; `missing_signals()` names them.
    """

    __slots__ = ("columns", "device", "meta", "time")

    def __init__(
        self,
        device: DeviceInfo,
        time: Any,
        columns: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.device = device
        self.time: FloatArray = np.asarray(time, dtype=np.float64)
        if self.time.ndim != 1:
            raise ValueError("time must be one-dimensional")
        n = self.time.shape[0]
        self.columns: dict[str, FloatArray] = {}
        for name, values in (columns or {}).items():
            if name not in SIGNALS:
                raise ValueError(f"unknown signal {name!r}; known signals: {', '.join(SIGNAL_NAMES)}")
            self.columns[name] = _as_float_array(values, n, name)
        self.meta: dict[str, Any] = dict(meta or {})

    def __len__(self) -> int:
        return int(self.time.shape[0])

    def __getitem__(self, name: str) -> FloatArray:
        if name not in SIGNALS:
            raise KeyError(f"unknown signal {name!r}")
        col = self.columns.get(name)
        if col is None:
            return np.full(len(self), np.nan)
        return col

    def __repr__(self) -> str:
        return f"Trace({self.device.label()!r}, n={len(self)}, signals={sorted(self.present_signals())})"

    def has(self, name: str) -> bool:
        col = self.columns.get(name)
        return col is not None and bool(np.isfinite(col).any())

    def rows_with_data(self) -> npt.NDArray[np.bool_]:
        """Rows where some signal has a value: a row of NaN only (a lost GPU's, a failing source's) is a tick
        without data, not a sample."""
        rows = np.zeros(len(self), dtype=bool)
        for col in self.columns.values():
            rows |= np.isfinite(col)
        return rows

    def present_signals(self) -> list[str]:
        return [s for s in SIGNAL_NAMES if self.has(s)]

    def missing_signals(self, among: Iterable[str] = PAPER_SIGNALS) -> list[str]:
        """Signals with no finite sample at all (default: among the paper's 9)."""
        return [s for s in among if not self.has(s)]

    def missing_fraction(self) -> dict[str, float]:
        """Fraction of samples that are NaN, per signal (1.0 for an absent signal)."""
        n = len(self)
        out: dict[str, float] = {}
        for s in SIGNAL_NAMES:
            col = self.columns.get(s)
            out[s] = 1.0 if col is None or n == 0 else float(np.isnan(col).mean())
        return out

    def duration(self) -> float:
        return float(self.time[-1] - self.time[0]) if len(self) > 1 else 0.0

    def rate_hz(self) -> float:
        """Median sampling rate; NaN when it cannot be told."""
        if len(self) < 2:
            return float("nan")
        dt = np.diff(self.time)
        dt = dt[dt > 0]
        return float(1.0 / np.median(dt)) if dt.size else float("nan")

    def slice_time(self, start: float | None = None, end: float | None = None) -> Trace:
        """Samples with start <= time <= end."""
        mask = np.ones(len(self), dtype=bool)
        if start is not None:
            mask &= self.time >= start
        if end is not None:
            mask &= self.time <= end
        return self.take(mask)

    def take(self, index: Any) -> Trace:
        return Trace(self.device, self.time[index], {k: v[index] for k, v in self.columns.items()}, self.meta)

    def with_columns(self, **columns: Any) -> Trace:
        merged = dict(self.columns)
        merged.update(columns)
        return Trace(self.device, self.time, merged, self.meta)

    def without(self, *names: str) -> Trace:
        """A copy with the named signals removed (as if the source never had them)."""
        kept = {k: v for k, v in self.columns.items() if k not in names}
        return Trace(self.device, self.time, kept, self.meta)

    @staticmethod
    def concat(traces: list[Trace]) -> Trace:
        if not traces:
            raise ValueError("concat needs at least one trace")
        names = sorted({k for t in traces for k in t.columns})
        time = np.concatenate([t.time for t in traces])
        cols = {k: np.concatenate([t[k] for t in traces]) for k in names}
        order = np.argsort(time, kind="stable")
        return Trace(traces[0].device, time[order], {k: v[order] for k, v in cols.items()}, traces[0].meta)


@dataclass
class ProcessSample:
    """One process seen on one device at one time (NVML process list, enriched by psutil)."""

    time: float
    pid: int
    device_uuid: str | None
    name: str = ""
    gpu_mem_used: float = float("nan")  # bytes
    sm_util: float = float("nan")  # ratio, where the driver offers per-process utilisation
    cpu_util: float = float("nan")  # ratio of one core
    rss: float = float("nan")  # bytes
    threads: float = float("nan")
    read_bytes: float = float("nan")
    write_bytes: float = float("nan")
    uses_torch: bool = False
    # Who and what (host source, read once per process): live views only, never written to recordings or
    # the store. A command line can carry secrets (tokens, paths), and the same text repeated every tick
    # would outweigh the numbers; the pid and name stay enough to join a recording to anything else.
    user: str = ""  # "" where unknown (vanished, or not visible from this PID namespace)
    start_time: float = float("nan")  # Unix seconds the process started (psutil create_time)
    cmdline: str = ""  # argv joined by spaces, cut (sources/host.py CMDLINE_CHARS)


@dataclass
class Verdict:
    """The classifier's answer for one device over one span of time: `classify/verdict.py` builds it (the one
    place), and `classify`, the report, the fleet judge and `verify` each format it their own way."""

    device: DeviceInfo
    start: float  # the span judged: first and last sample time (NaN for an empty trace)
    end: float
    label: str  # a PHASES name holding the most time (decide.overall_label), or "unknown"
    confidence: float  # time-weighted mean probability of `label` over its segments; NaN when unknown
    probabilities: dict[str, float]  # mean window probability per phase over the windows the model called
    segments: list[Segment]
    # Why windows were unknown: reason -> windows that gave it, the most common first; a span with no window
    # at all carries its reason with 0.
    unknown_reasons: dict[str, int]
    held: Held  # the device's idle: held or not (False for a working label; None where it cannot be told)
    segment_held: list[Held | None]  # per segment; None for a non-idle one
    windows: WindowPredictions | None  # the per-window predictions; None where no model judged the trace
    model_version: str
    missing_signals: list[str] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=dict)  # the config's thresholds set, as applied

    @property
    def held_idle(self) -> bool:
        """Labelled idle, and that idle is held."""
        return self.label == "idle" and self.held.held is True


# Column of each signal in TickBatch.values.
SIGNAL_COLUMN: dict[str, int] = {name: i for i, name in enumerate(SIGNAL_NAMES)}


@dataclass(frozen=True)
class GpuHealth:
    """Error counters of one physical GPU (what dcgm-exporter users alert on), as NVML last answered them.

    Each reading is None, or absent from its dict, where the GPU or driver does not offer it (a consumer
    GPU has no ECC): exported as no series, never as 0. Replaced whole on each read, never mutated, so a
    reader in another thread (a scrape) sees one consistent snapshot.
    """

    time: float  # wall clock of the last read, Unix seconds
    # error type ("corrected" | "uncorrected") -> scope ("volatile": since the driver loaded |
    # "aggregate": the GPU's lifetime) -> count
    ecc: dict[str, dict[str, int]] = field(default_factory=dict)
    remapped_rows: dict[str, int] = field(default_factory=dict)  # "correctable" | "uncorrectable" -> rows
    remap_pending: bool | None = None  # a remap waits for a GPU reset
    remap_failure: bool | None = None  # a remap failed: no spare row was left
    pcie_replays: int | None = None  # PCIe replays (link retries) since the driver loaded
    mem_temperature_c: float | None = None  # memory (HBM) temperature
    xid_errors: int | None = None  # XID events (any code) seen since the source opened; None: not watched
    last_xid: int | None = None  # the code of the newest one; 0 while none seen (as dcgm-exporter's field)
    last_xid_time: float | None = None  # wall clock it was seen
    # The same for the XIDs after which the GPU itself needs a reset or replacing (sources/nvml.py
    # CRITICAL_XIDS), apart: an application XID right after one (48, then 45) must not hide it.
    critical_xid_errors: int | None = None
    last_critical_xid: int | None = None  # 0 while none seen


@dataclass
class TickBatch:
    """All devices of one source at one tick, columnar: one row per device, one column per signal."""

    time: float  # wall clock, Unix seconds, when the tick was read
    devices: list[DeviceInfo]
    values: FloatArray  # shape (len(devices), len(SIGNAL_NAMES)); NaN = missing
    processes: list[ProcessSample] = field(default_factory=list)
    # Human-readable events raised during this tick (a device lost, a library missing); said once.
    events: list[str] = field(default_factory=list)
    # Per physical GPU uuid, its health counters as last read (NVML only; read every few seconds, not per
    # tick, and kept out of `values` so recordings, the store and features do not change). Absent: unknown.
    health: dict[str, GpuHealth] = field(default_factory=dict)
    # NVML's own sub-second samples since the last tick (nvmlDeviceGetSamples), each at its own time: physical
    # GPU uuid -> signal ("gpu_util", "power", "mem_util") -> (times, Unix s; values, base units), in time
    # order, none repeated across ticks. Empty for every other source. Kept out of `values` (one row per
    # device and tick) so recordings, the store and the classifier's 1 Hz features do not change; the live
    # telemetry KPIs read them (live/fine.py).
    fine: dict[str, dict[str, tuple[FloatArray, FloatArray]]] = field(default_factory=dict)

    @staticmethod
    def empty(time: float, devices: list[DeviceInfo]) -> TickBatch:
        return TickBatch(time, devices, np.full((len(devices), len(SIGNAL_NAMES)), np.nan))

    def value(self, device_uuid: str, signal: str) -> float:
        row = next(i for i, d in enumerate(self.devices) if d.uuid == device_uuid)
        return float(self.values[row, SIGNAL_COLUMN[signal]])
