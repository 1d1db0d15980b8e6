"""What every live source (NVML, host, replay) hands the sampler each tick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from phasescope.schema import SIGNAL_NAMES, DeviceInfo, FloatArray, ProcessSample

# Column of each signal in TickBatch.values.
SIGNAL_COLUMN: dict[str, int] = {name: i for i, name in enumerate(SIGNAL_NAMES)}


@dataclass
class TickBatch:
    """All devices of one source at one tick, columnar: one row per device, one column per signal."""

    time: float  # wall clock, Unix seconds, when the tick was read
    devices: list[DeviceInfo]
    values: FloatArray  # shape (len(devices), len(SIGNAL_NAMES)); NaN = missing
    processes: list[ProcessSample] = field(default_factory=list)
    # Human-readable events raised during this tick (a device lost, a library missing); said once.
    events: list[str] = field(default_factory=list)

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
