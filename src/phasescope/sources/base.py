"""What every live source (NVML, host, replay) hands the sampler each tick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from phasescope.schema import SIGNAL_NAMES, DeviceInfo, FloatArray, ProcessSample

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

    @staticmethod
    def empty(time: float, devices: list[DeviceInfo]) -> TickBatch:
        return TickBatch(time, devices, np.full((len(devices), len(SIGNAL_NAMES)), np.nan))

    def value(self, device_uuid: str, signal: str) -> float:
        row = next(i for i, d in enumerate(self.devices) if d.uuid == device_uuid)
        return float(self.values[row, SIGNAL_COLUMN[signal]])


class LiveSource(Protocol):
    """A source of ticks. `read()` never raises for a failing call: it returns NaN and counts it."""

    name: str

    def devices(self) -> list[DeviceInfo]: ...

    def read(self) -> TickBatch: ...

    def error_counts(self) -> dict[str, int]:
        """Failures so far, by call name (e.g. 'nvmlDeviceGetPcieThroughput')."""
        ...

    def close(self) -> None: ...
