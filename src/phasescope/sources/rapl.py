"""CPU package and DRAM energy from RAPL through Linux powercap (`/sys/class/powercap/intel-rapl:*`).

Each zone directory holds `name` ("package-0", "dram", "core", "uncore", "psys"), `energy_uj` (a counter
in microjoules that wraps at `max_energy_range_uj`) and children `intel-rapl:P:N`. AMD Zen CPUs use the same
driver and names. What is summed, so that nothing counts twice: every `package-N` zone (cores + uncore) and
every `dram` zone (the memory controller, outside the package's figure). `core`/`uncore` are parts of their
package and `psys` (the whole platform, laptops) overlaps everything, so they are read but not summed.

`energy_uj` is readable by root only since Linux 5.10 (the "Platypus" power side channel): `RaplReader`
then raises one `SourceError` line that says how to grant access. The counter wraps every few minutes at
full load (262,143 J at 300 W is under 15 min), so a reader must be read more often than that; `read()`
unwraps from one reading to the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from phasescope.errors import SourceError
from phasescope.schema import SIGNAL_COLUMN, DeviceInfo, TickBatch
from phasescope.sources.base import LiveSource
from phasescope.sources.host import is_host_device

POWERCAP = Path("/sys/class/powercap")
_PREFIX = "intel-rapl:"
UJ = 1e-6


@dataclass
class _Zone:
    label: str  # "package-0", "package-0/dram", "psys"
    path: Path
    max_uj: float  # the counter wraps here
    summed: bool  # counted in `total_j` (packages and DRAM)
    first_uj: float = math.nan  # the reading every later one is counted from
    last_uj: float = math.nan
    wraps: int = 0


def _read_number(path: Path) -> float:
    return float(path.read_text().strip())


class RaplReader:
    """Cumulative joules per RAPL zone since this reader started, unwrapped. `root`: the powercap
    directory (a test's fake tree; default /sys/class/powercap). Raises SourceError (one line) when there
    is no RAPL zone or its counters cannot be read."""

    def __init__(self, root: str | Path | None = None) -> None:
        base = Path(root) if root is not None else POWERCAP
        dirs = sorted(base.glob(f"{_PREFIX}*")) if base.is_dir() else []
        # Top-level zones are intel-rapl:N; their children intel-rapl:N:M (also linked under the parent).
        tops = [d for d in dirs if d.name.count(":") == 1]
        if not tops:
            raise SourceError(f"no RAPL energy counters at {base}/{_PREFIX}* (not an Intel or AMD CPU with "
                              "powercap, or a container without /sys/class/powercap)")
        self.zones: list[_Zone] = []
        for top in tops:
            top_name = self._name(top)
            self.zones.append(self._zone(top, top_name, top_name.startswith("package")))
            for child in sorted(d for d in dirs if d.name.startswith(f"{top.name}:")):
                name = self._name(child)
                self.zones.append(self._zone(child, f"{top_name}/{name}", name == "dram"))
        self.read()  # the first reading: permissions are checked here, and it is every zone's zero

    @staticmethod
    def _name(zone: Path) -> str:
        try:
            return (zone / "name").read_text().strip() or zone.name
        except OSError:
            return zone.name

    @staticmethod
    def _zone(path: Path, label: str, summed: bool) -> _Zone:
        try:
            max_uj = _read_number(path / "max_energy_range_uj")
        except (OSError, ValueError):
            max_uj = math.nan  # no wrap range: a decrease then cannot be unwrapped (read as a reset)
        return _Zone(label, path, max_uj, summed)

    def read(self) -> dict[str, float]:
        """Joules per zone label since the first reading; NaN for a zone whose read failed this time."""
        out: dict[str, float] = {}
        for z in self.zones:
            try:
                uj = _read_number(z.path / "energy_uj")
            except PermissionError:
                raise SourceError(
                    f"{z.path / 'energy_uj'}: RAPL energy is readable by root only (Linux >= 5.10); run as "
                    "root or grant read access, e.g. `chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj` "
                    "(again after each boot)") from None
            except (OSError, ValueError):
                out[z.label] = math.nan
                continue
            if not math.isfinite(z.first_uj):
                z.first_uj = uj
            elif uj < z.last_uj and math.isfinite(z.max_uj):
                z.wraps += 1  # one wrap since the last reading (read more often than the wrap period)
            z.last_uj = uj
            out[z.label] = (uj - z.first_uj + z.wraps * z.max_uj) * UJ
        return out

    def total_j(self, reading: dict[str, float]) -> float:
        """Packages + DRAM of one `read()`; NaN if one of those zones failed (a partial sum reads low)."""
        return math.fsum(reading.get(z.label, math.nan) for z in self.zones if z.summed)


def rapl_or_reason() -> RaplReader | str:
    """A RAPL reader, or the one line that says why there is none (no zones, no permission)."""
    try:
        return RaplReader()
    except SourceError as exc:
        return str(exc)


class WithRapl:
    """A source whose host row gets RAPL's CPU package + DRAM joules in its `energy` column (a counter, as
    NVML's: `kpi/energy.py` meters it the same way). `zones` holds the per-zone joules of the last read."""

    def __init__(self, inner: LiveSource, rapl: RaplReader) -> None:
        self.inner = inner
        self.rapl = rapl
        self.name = f"{inner.name}+rapl"
        self.zones: dict[str, float] = {}
        self._failed = ""

    def devices(self) -> list[DeviceInfo]:
        return self.inner.devices()

    def read(self) -> TickBatch:
        batch = self.inner.read()
        try:
            self.zones = self.rapl.read()
            joules = self.rapl.total_j(self.zones)
        except SourceError as exc:  # access taken away while running: NaN, and said once
            self.zones, joules = {}, math.nan
            if str(exc) != self._failed:
                self._failed = str(exc)
                batch.events.append(str(exc))
        for row, dev in enumerate(batch.devices):
            if is_host_device(dev):
                batch.values[row, SIGNAL_COLUMN["energy"]] = joules
        return batch

    def error_counts(self) -> dict[str, int]:
        return self.inner.error_counts()

    def close(self) -> None:
        self.inner.close()
