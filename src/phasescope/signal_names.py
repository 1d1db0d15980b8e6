"""The names people give GPU signals in their own logs, and the units they write, mapped onto `schema`.

One table for every CSV-like reader: a column header (`power.draw [W]`, `power_W`, `utilization_gpu_percent`,
`GPU Temp (C)`) is split into a name and a unit, the name is looked up here (`NVIDIA_SMI` first: the
`nvidia-smi --query-gpu` field names, then `SYNONYMS`), and the unit gives the factor into the signal's base
unit (schema.py). A name comes with the unit its tool writes when a header gives none.

Memory sizes written with decimal prefixes (`MB`, `GB`) are read as binary (MiB, GiB): nvidia-smi, NVML-based
scripts (`used / 1024**2`) and `nvidia-smi dmon` all print MiB under the name MB. Throughput keeps decimal
prefixes (NVML's PCIe KB/s is 1000 bytes per second; schema.KB_PER_S).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from phasescope.schema import KB_PER_S, MHZ, MIB, PERCENT, SIGNALS, Unit

# Columns that are not signals but tell when and which device a row is.
Role = str  # a schema signal name, or one of ROLES
ROLES: tuple[str, ...] = ("time", "index", "uuid", "pci", "name", "driver")

# A unit as written (lower-cased) -> (the schema unit it measures, factor into that base unit). Lower case
# because people write `power_w` and `mem_used_mb`; a lower-case `m` prefix reads as milli for watts and
# joules (NVML reports mW and mJ) and as mega for bytes (nobody logs millibytes).
UNITS: dict[str, tuple[Unit, float]] = {
    "%": ("ratio", PERCENT),
    "percent": ("ratio", PERCENT),
    "pct": ("ratio", PERCENT),
    "ratio": ("ratio", 1.0),
    "w": ("watts", 1.0),
    "watts": ("watts", 1.0),
    "mw": ("watts", 1e-3),
    "kw": ("watts", 1e3),
    "c": ("celsius", 1.0),
    "degc": ("celsius", 1.0),
    "°c": ("celsius", 1.0),
    "celsius": ("celsius", 1.0),
    "hz": ("hertz", 1.0),
    "khz": ("hertz", 1e3),
    "mhz": ("hertz", MHZ),
    "ghz": ("hertz", 1e9),
    "b": ("bytes", 1.0),
    "bytes": ("bytes", 1.0),
    "kib": ("bytes", 1024.0),
    "kb": ("bytes", 1024.0),
    "mib": ("bytes", MIB),
    "mb": ("bytes", MIB),
    "gib": ("bytes", MIB * 1024.0),
    "gb": ("bytes", MIB * 1024.0),
    "b/s": ("bytes_per_second", 1.0),
    "kb/s": ("bytes_per_second", KB_PER_S),
    "mb/s": ("bytes_per_second", 1e6),
    "gb/s": ("bytes_per_second", 1e9),
    "j": ("joules", 1.0),
    "mj": ("joules", 1e-3),
    "uj": ("joules", 1e-6),
    "µj": ("joules", 1e-6),
    "kj": ("joules", 1e3),
}
# Units of a time column -> seconds. Without one, epoch stamps are told apart by magnitude.
TIME_UNITS: dict[str, float] = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Name:
    """What a column name means: a schema signal or a ROLES entry, and the unit assumed when none is
    written."""

    role: Role
    unit: str | None = None


# `nvidia-smi --query-gpu` field names. For one signal the earlier field wins (`power.draw.average` over
# `.instant`). Other fields nvidia-smi prints (memory.free, fan.speed, pstate, ...) are read and ignored.
NVIDIA_SMI: dict[str, Name] = {
    "timestamp": Name("time"),
    "index": Name("index"),
    "uuid": Name("uuid"),
    "pci.bus_id": Name("pci"),
    "name": Name("name"),
    "driver_version": Name("driver"),
    "gpu_uuid": Name("uuid"),
    "gpu_name": Name("name"),
    "gpu_bus_id": Name("pci"),
    "utilization.gpu": Name("gpu_util", "%"),
    "utilization.memory": Name("mem_util", "%"),
    "memory.used": Name("mem_used", "mib"),
    "memory.total": Name("mem_total", "mib"),
    "power.draw": Name("power", "w"),
    "power.draw.average": Name("power", "w"),
    "power.draw.instant": Name("power", "w"),
    "enforced.power.limit": Name("power_limit", "w"),
    "power.limit": Name("power_limit", "w"),
    "temperature.gpu": Name("temperature", "c"),
    "clocks.sm": Name("sm_clock", "mhz"),
    "clocks.current.sm": Name("sm_clock", "mhz"),
    "clocks.gr": Name("sm_clock", "mhz"),  # graphics clock: NVIDIA runs SMs on it
    "clocks.current.graphics": Name("sm_clock", "mhz"),
    "clocks.mem": Name("mem_clock", "mhz"),
    "clocks.current.memory": Name("mem_clock", "mhz"),
    "clocks_throttle_reasons.active": Name("throttle_reasons"),
    "clocks_event_reasons.active": Name("throttle_reasons"),
}

# Names from people's own scripts (pynvml loops, gpustat, Weights & Biases exports, hand-rolled loggers),
# written here normalised (see `normalise`: lower case, words joined by '_'), without a unit suffix. An
# nvidia-smi field's own spelling normalised (`memory_used`, `power_draw`) is found through NVIDIA_SMI.
SYNONYMS: dict[str, Name] = {
    # when
    "time": Name("time"),
    "ts": Name("time"),
    "date": Name("time"),
    "datetime": Name("time"),
    "date_time": Name("time"),
    "time_stamp": Name("time"),
    "epoch": Name("time"),
    "unix_time": Name("time"),
    "unixtime": Name("time"),
    "elapsed": Name("time"),
    "elapsed_time": Name("time"),
    "wall_time": Name("time"),
    # which device
    "gpu": Name("index"),
    "gpu_index": Name("index"),
    "gpu_idx": Name("index"),
    "gpu_id": Name("index"),
    "gpu_num": Name("index"),
    "device": Name("index"),
    "device_index": Name("index"),
    "device_id": Name("index"),
    "device_uuid": Name("uuid"),
    "bus_id": Name("pci"),
    "device_name": Name("name"),
    "model": Name("name"),
    # signals
    "gpu_util": Name("gpu_util", "%"),
    "util_gpu": Name("gpu_util", "%"),
    "gpu_utilization": Name("gpu_util", "%"),
    "gpu_usage": Name("gpu_util", "%"),
    "gpu_load": Name("gpu_util", "%"),
    "util": Name("gpu_util", "%"),
    "utilization": Name("gpu_util", "%"),
    "mem_util": Name("mem_util", "%"),
    "util_mem": Name("mem_util", "%"),
    "memory_util": Name("mem_util", "%"),
    "mem_utilization": Name("mem_util", "%"),
    "memory_utilization": Name("mem_util", "%"),
    "mem_used": Name("mem_used", "mib"),
    "used_memory": Name("mem_used", "mib"),
    "gpu_mem_used": Name("mem_used", "mib"),
    "gpu_memory_used": Name("mem_used", "mib"),
    "fb_used": Name("mem_used", "mib"),
    "vram_used": Name("mem_used", "mib"),
    "mem_total": Name("mem_total", "mib"),
    "total_memory": Name("mem_total", "mib"),
    "gpu_mem_total": Name("mem_total", "mib"),
    "gpu_memory_total": Name("mem_total", "mib"),
    "power": Name("power", "w"),
    "power_usage": Name("power", "w"),
    "gpu_power": Name("power", "w"),
    "power_cap": Name("power_limit", "w"),
    "temperature": Name("temperature", "c"),
    "temp": Name("temperature", "c"),
    "gpu_temp": Name("temperature", "c"),
    "gpu_temperature": Name("temperature", "c"),
    "temp_gpu": Name("temperature", "c"),
    "sm_clock": Name("sm_clock", "mhz"),
    "clock_sm": Name("sm_clock", "mhz"),
    "sm_clk": Name("sm_clock", "mhz"),
    "graphics_clock": Name("sm_clock", "mhz"),
    "gpu_clock": Name("sm_clock", "mhz"),
    "mem_clock": Name("mem_clock", "mhz"),
    "clock_mem": Name("mem_clock", "mhz"),
    "mem_clk": Name("mem_clock", "mhz"),
    "memory_clock": Name("mem_clock", "mhz"),
    "pcie_tx": Name("pcie_tx", "kb/s"),
    "pcie_rx": Name("pcie_rx", "kb/s"),
    "energy": Name("energy", "j"),
    "gpu_energy": Name("energy", "j"),
    "total_energy": Name("energy", "j"),
    "throttle_reasons": Name("throttle_reasons"),
}

_SEP_RE = re.compile(r"[^0-9a-z%°]+")


def normalise(name: str) -> str:
    """`Power.Draw` / `power-draw` / `power draw` -> `power_draw`, `util%` -> `util_%`: the form SYNONYMS
    is written in, and a unit suffix its own last word."""
    return _SEP_RE.sub("_", name.strip().strip('"').lower().replace("%", "_%")).strip("_")


_LOOKUP: dict[str, Name] = {**{normalise(k): v for k, v in NVIDIA_SMI.items()}, **SYNONYMS}
_NVIDIA_SMI_NORMALISED = frozenset(normalise(k) for k in NVIDIA_SMI)


@dataclass(frozen=True)
class Column:
    """One header cell, understood: `name` as written (without its unit), and what it means."""

    header: str  # the cell as written
    name: str  # without the unit
    unit: str | None  # the unit written in the header (lower case), or None
    meaning: Name | None  # None: not a column phasescope reads
    nvidia_smi: bool  # spelled as an nvidia-smi --query-gpu field
    device: int | None = None  # the GPU a wide log's column is of (`gpu0_util`, `power_gpu1`), else None

    @property
    def role(self) -> Role | None:
        return self.meaning.role if self.meaning else None

    @property
    def is_signal(self) -> bool:
        return self.meaning is not None and self.meaning.role in SIGNALS


def split_unit(header: str) -> tuple[str, str | None]:
    """`power.draw [W]` -> ('power.draw', 'w'); `Power (mW)` -> ('Power', 'mw'); else (header, None)."""
    cell = header.strip().strip('"').strip()
    if cell[-1:] in ("]", ")"):  # string search, not a regex: a header line may be anything, and long
        start = cell.rfind("[" if cell.endswith("]") else "(")
        unit = cell[start + 1 : -1].strip() if start > 0 else ""
        if unit and not any(b in unit for b in "[]()"):
            return cell[:start].strip(), unit.lower()
    return cell, None


# A wide log's per-GPU column: the GPU number before or after the name (`gpu0_util`, `GPU 1 Power (W)`,
# `power_w_gpu1`, `cuda:0 temp`).
_DEVICE_FIRST = re.compile(r"^(?:gpu|cuda|device|dev)_?(\d{1,3})_(.+)$")
_DEVICE_LAST = re.compile(r"^(.+)_(?:gpu|cuda|device|dev)_?(\d{1,3})$")


def recognise(header: str) -> Column:
    """What one header cell names: by its exact (normalised) name first, then by a name and a unit suffix
    (`power_W`, `mem_used_mb`, `utilization_gpu_percent`, `time_ms`), then as one GPU's signal in a wide
    log (`gpu0_util`, `power_W_gpu1`)."""
    cell = _recognise(header)
    if cell.meaning is not None:
        return cell
    name, unit = split_unit(header)
    key = normalise(name)
    first, last = _DEVICE_FIRST.match(key), _DEVICE_LAST.match(key)
    device, rest = (int(first.group(1)), first.group(2)) if first else (
        (int(last.group(2)), last.group(1)) if last else (None, ""))
    inner = _recognise(f"{rest} [{unit}]" if unit else rest) if rest else None
    if device is None or inner is None or not inner.is_signal:
        return cell
    return Column(cell.header, name, inner.unit, inner.meaning, False, device)


def _recognise(header: str) -> Column:
    name, unit = split_unit(header)
    key = normalise(name)
    meaning = _LOOKUP.get(key)
    if meaning is None and unit is None and "_" in key:
        stem, _, suffix = key.rpartition("_")
        found = _LOOKUP.get(stem)
        units = TIME_UNITS if found is not None and found.role == "time" else UNITS
        if found is not None and suffix in units:
            name, unit, key, meaning = name[: len(name) - len(suffix)].rstrip(" _.-"), suffix, stem, found
    return Column(header.strip().strip('"').strip(), name, unit, meaning, key in _NVIDIA_SMI_NORMALISED)


def unit_factor(column: Column, unit: str | None = None) -> float | None:
    """The factor from the column's unit (`unit`, else the header's, else its name's default) into its
    signal's base unit; None when that unit measures something else (`power [MiB]`) or is unknown."""
    assert column.meaning is not None and column.is_signal
    signal = SIGNALS[column.meaning.role]
    written = unit or column.unit or column.meaning.unit
    if written is None:  # a bitmask: a plain number
        return 1.0 if signal.unit == "bitmask" else None
    known = UNITS.get(written.lower())
    if known is None or known[0] != signal.unit:
        return None
    return known[1]


def units_for(signal: str) -> list[str]:
    """The unit spellings that fit `signal` (for messages)."""
    return [u for u, (dim, _) in UNITS.items() if dim == SIGNALS[signal].unit]
