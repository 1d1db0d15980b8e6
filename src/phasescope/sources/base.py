"""The protocol every live source (NVML, host, replay) implements; what it hands over each tick is
`schema.TickBatch`."""

from __future__ import annotations

from typing import Protocol

from phasescope.schema import DeviceInfo, TickBatch


class LiveSource(Protocol):
    """A source of ticks. `read()` never raises for a failing call: it returns NaN and counts it."""

    name: str

    def devices(self) -> list[DeviceInfo]: ...

    def read(self) -> TickBatch: ...

    def error_counts(self) -> dict[str, int]:
        """Failures so far, by call name (e.g. 'nvmlDeviceGetPcieThroughput')."""
        ...

    def close(self) -> None: ...
