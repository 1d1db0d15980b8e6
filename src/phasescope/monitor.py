"""Energy, time and cost of a named window of code, measured from inside the program (as Zeus's ZeusMonitor).

    import phasescope

    with phasescope.measure("epoch") as w:
        train_one_epoch()
    print(w.result.time_s, w.result.total_energy_j, w.result.cost.total_usd)

    from phasescope.monitor import Monitor

    mon = Monitor()                        # opens NVML once; many windows, nested or overlapping
    mon.begin_window("epoch")
    for batch in loader:
        mon.begin_window("step")
        step(batch)
        steps.append(mon.end_window("step"))
    epoch = mon.end_window("epoch")

How each device's energy is measured is `kpi/energy.py`'s rule, through one `FleetEnergyMeter` per window fed
with every reading taken while the window is open:

- a GPU with NVML's total-energy counter (Volta and newer): the counter's difference between the readings at
  `begin_window` and `end_window`, exact whatever happens in between (a counter reset is bridged by power, as
  offline). No background sampling is needed, so by default none runs (Zeus does the same);
- a GPU with power but no counter: a background thread reads the devices every `interval_s` (0.1 s by
  default) while any window is open, and power is integrated under the gap rule (an interval longer than
  `gap_factor` x `interval_s` is left uncovered and reported in `coverage`, never guessed);
- the host: CPU packages + DRAM through RAPL (`sources/rapl.py`, Linux powercap) where it can be read (root
  only since Linux 5.10), a counter metered like NVML's, with the per-zone split in `parts` and Zeus's
  `cpu_energy` / `dram_energy`; the host is reported alone when there is no GPU, and beside the GPUs when RAPL
  is readable. Without RAPL its energy is not measured (None, never 0, and a note says why); time is, its CPU
  share over the window is, and the time component of the cost when a $/device-hour price is set.

Sources are opened by `sources/open.py`, the one place that chooses them, in its lean mode
(`open_source(spec, lean=True)`: NVML without process, GPM, NVLink or health calls, the host without the torch
scan, RAPL on the host row where readable), so NVML errors follow that source's policy:
a failing call reads NaN and is retried or remembered, a GPU that falls off the bus is marked lost (its
energy stops at its last reading and the window's `notes` say so, once), and no NVML at all is one line.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

from phasescope.config import PriceConfig
from phasescope.config import load as load_config
from phasescope.config import parse as parse_config
from phasescope.errors import InputError, SourceError
from phasescope.kpi.cost import ZERO, Cost, Prices, device_cost, mig_prices
from phasescope.kpi.energy import FleetEnergyMeter
from phasescope.schema import SIGNAL_COLUMN, DeviceInfo, TickBatch
from phasescope.sources.base import LiveSource
from phasescope.sources.host import is_host_device
from phasescope.sources.open import open_source
from phasescope.sources.rapl import WithRapl
from phasescope.sources.sampler import MIN_INTERVAL_S, Sampler

log = logging.getLogger("phasescope.monitor")

DEFAULT_INTERVAL_S = 0.1  # background sampling for power-only GPUs: NVML's power refreshes about this often
RAPL_INTERVAL_S = 5.0  # RAPL's counter wraps every >= ~15 min per package: read it well within that
Interval = float | None | Literal["auto"]

_POWER = SIGNAL_COLUMN["power"]
_ENERGY = SIGNAL_COLUMN["energy"]
_UTIL = SIGNAL_COLUMN["gpu_util"]


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class DeviceMeasurement:
    """One device over one window. `energy_j` is None when the device has no power or energy reading."""

    uuid: str
    name: str
    index: int | None
    method: str  # "counter", "integrated_power" or "none" (kpi/energy.py)
    energy_j: float | None
    span_s: float  # first to last reading inside the window (the source's clock)
    covered_s: float  # part of the span the energy figure covers
    util_mean: float | None  # time-weighted mean utilisation (GPU) or CPU share (host) over the readings
    cost: Cost
    is_host: bool = False
    notes: tuple[str, ...] = ()
    # The host's RAPL zones in the window (J): "package-0", "package-0/dram", "package-0/core", ...
    parts: Mapping[str, float] = field(default_factory=dict)

    @property
    def coverage(self) -> float | None:
        return self.covered_s / self.span_s if self.span_s > 0 and self.energy_j is not None else None

    @property
    def mean_power_w(self) -> float | None:
        if self.energy_j is None or self.covered_s <= 0:
            return None
        return self.energy_j / self.covered_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid, "name": self.name, "index": self.index, "method": self.method,
            "energy_j": self.energy_j, "span_s": self.span_s, "covered_s": self.covered_s,
            "coverage": self.coverage, "mean_power_w": self.mean_power_w, "util_mean": self.util_mean,
            "cost": self.cost.to_dict(), "is_host": self.is_host, "notes": list(self.notes),
            "parts": dict(self.parts),
        }


@dataclass(frozen=True)
class Measurement:
    """Time, energy and cost of one window. `time_s` is the monotonic wall time between begin and end."""

    name: str
    start: float  # Unix seconds at begin_window
    time_s: float
    devices: tuple[DeviceMeasurement, ...]
    samples: int  # readings that went into the window (begin and end included)
    notes: tuple[str, ...] = ()

    @property
    def end(self) -> float:
        return self.start + self.time_s

    @property
    def total_energy_j(self) -> float | None:
        """Energy summed over the devices that measure it; None when none does (never a made-up 0)."""
        known = [d.energy_j for d in self.devices if d.energy_j is not None]
        return float(sum(known)) if known else None

    @property
    def cost(self) -> Cost:
        total = ZERO
        for d in self.devices:
            total = total + d.cost
        return total

    def device(self, key: int | str) -> DeviceMeasurement:
        """The device with this NVML index or uuid (a unique uuid prefix will do)."""
        return self.devices[_pick(key, [(d.index, d.uuid) for d in self.devices], f"window {self.name!r}")]

    # Zeus's names, so a ZeusMonitor user's code reads the same figures.
    @property
    def time(self) -> float:
        return self.time_s

    @property
    def total_energy(self) -> float | None:
        """Zeus's `total_energy`: the GPUs' joules only, as Zeus sums its `gpu_energy` (the host's CPU and
        DRAM are apart, in `cpu_energy` / `dram_energy`); None when no GPU measured energy.
        `total_energy_j` is every device's, the host's included."""
        known = [d.energy_j for d in self.devices if not d.is_host and d.energy_j is not None]
        return float(sum(known)) if known else None

    @property
    def gpu_energy(self) -> dict[int, float]:
        """NVML index -> joules, for the GPUs that measured energy (NVML indices, not CUDA's)."""
        return {d.index: d.energy_j for d in self.devices
                if d.index is not None and d.energy_j is not None and not d.is_host}

    @property
    def cpu_energy(self) -> dict[int, float] | None:
        """CPU package index -> joules (RAPL `package-N`); None without RAPL, as Zeus."""
        return self._rapl("")

    @property
    def dram_energy(self) -> dict[int, float] | None:
        """CPU package index -> DRAM joules (RAPL `package-N/dram`); None where RAPL has no DRAM zone."""
        return self._rapl("/dram")

    def _rapl(self, suffix: str) -> dict[int, float] | None:
        out: dict[int, float] = {}
        for d in self.devices:
            for label, joules in d.parts.items():
                head, sep, rest = label.partition("/")
                package = head.removeprefix("package-")
                if package != head and package.isdigit() and sep + rest == suffix:
                    out[int(package)] = joules
        return out or None

    def __str__(self) -> str:
        """What `print(m)` shows: one line for the window, one per device, then the notes (repr() keeps the
        full dataclass form)."""
        lines = [f"window {self.name!r}: {_seconds(self.time_s)}, energy {_joules(self.total_energy_j)}, "
                 f"cost {_usd(self.cost.total_usd)}"]
        for d in self.devices:
            who = "host" if d.is_host else f"GPU {d.index}" if d.index is not None else "device"
            power = "" if d.mean_power_w is None else f", {d.mean_power_w:.4g} W mean"
            cover = "" if d.coverage is None or d.coverage >= 1 else f", covers {d.coverage:.0%}"
            util = "" if d.util_mean is None else f", util {d.util_mean:.0%}"
            lines.append(f"  {who} {d.name} ({d.uuid}): {_joules(d.energy_j)} [{d.method}]{power}{cover}"
                         f"{util}, cost {_usd(d.cost.total_usd)}")
            lines += [f"    note: {n}" for n in d.notes]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (None for what was not measured), e.g. for `wandb.log` or a results file."""
        return {
            "name": self.name, "start": self.start, "end": self.end, "time_s": self.time_s,
            "total_energy_j": self.total_energy_j, "cost": self.cost.to_dict(), "samples": self.samples,
            "devices": [d.to_dict() for d in self.devices], "notes": list(self.notes),
        }


# ---------------------------------------------------------------- the monitor


class _Key:
    """The key of a `measure()` window: unique by identity, so equal names never collide."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


@dataclass
class _Open:
    """A window while it is open: its own meter, fed every reading taken from begin to end."""

    name: str
    start_wall: float
    start_mono: float
    meter: FleetEnergyMeter
    samples: int = 0
    notes: list[str] = field(default_factory=list)
    # uuid -> [weighted util sum, weight seconds, previous reading time, power seen > 0]
    util: dict[str, list[float]] = field(default_factory=dict)
    dark_at_end: set[str] = field(default_factory=set)
    zones: tuple[dict[str, float], dict[str, float]] | None = None  # RAPL per zone: (first, last) reading

    def take(self, batch: TickBatch, zones: dict[str, float] | None = None) -> None:
        if zones:
            self.zones = (self.zones[0] if self.zones else zones, zones)
        self.meter.update(batch)
        self.samples += 1
        t = float(batch.time)
        for row, dev in enumerate(batch.devices):
            acc = self.util.setdefault(dev.uuid, [0.0, 0.0, t, 0.0])
            util, power = float(batch.values[row, _UTIL]), float(batch.values[row, _POWER])
            dt = t - acc[2]
            if math.isfinite(util) and dt > 0:
                # A reading's utilisation describes the time since the previous reading (NVML's sample
                # period, psutil's since-last-call CPU share), so weight it by that spacing.
                acc[0] += util * dt
                acc[1] += dt
            acc[2] = t
            if math.isfinite(power) and power > 0:
                acc[3] = 1.0
        self.dark_at_end = {dev.uuid for row, dev in enumerate(batch.devices)
                            if not np.isfinite(batch.values[row]).any()}


class Monitor:
    """Measures named windows of code on the watched devices. See the module doc.

    source: "auto" (NVIDIA GPUs through NVML, else the host), "nvml", "host", "replay:PATH", or a LiveSource.
    devices: NVML indices or uuids to report, or one alone (default: every device the source lists: the
        GPUs, plus the host when RAPL can be read, or the host alone without a GPU). NVML's indices ignore
        CUDA_VISIBLE_DEVICES, so a uuid is the safe way to name the GPU torch uses.
    interval_s: background sampling while a window is open. "auto": 0.1 s when a GPU has power but no
        energy counter, 5 s with RAPL (its counter wraps), else none; a number: always, at that period
        (>= 0.1 s); None: never (energy then comes from the readings at begin and end alone: exact with a
        counter, a two-point estimate without).
    prices: Prices for every device, a PriceConfig (per model), a mapping with the config file's [prices]
        keys ({"usd_per_gpu_hour": 2.5, "usd_per_kwh": 0.12, "gpu": {"H100": {"usd_per_gpu_hour": 4.0}}}),
        or None for the config file's [prices] (`config` names the file; default as every command:
        $PHASESCOPE_CONFIG, else the XDG path). Beside GPUs the host is priced by its energy only (the
        $/GPU-hour is the GPUs' rent, paid once).
    sync: before each reading at begin/end, wait for queued CUDA work (torch.cuda.synchronize() on the
        current device) when the program has already initialised CUDA through torch; never imports torch.
    say: where one-line notices go (no NVML, a GPU lost); default: this module's logger, as warnings.
    """

    def __init__(
        self,
        source: str | LiveSource = "auto",
        *,
        devices: Sequence[int | str] | int | str | None = None,
        interval_s: Interval = "auto",
        prices: Prices | PriceConfig | Mapping[str, Any] | None = None,
        config: str | Path | None = None,
        sync: bool = True,
        say: Callable[[str], None] | None = None,
    ) -> None:
        if interval_s not in (None, "auto") and not (
            isinstance(interval_s, int | float) and not isinstance(interval_s, bool)
            and math.isfinite(interval_s) and interval_s >= MIN_INTERVAL_S
        ):
            raise InputError("Monitor", "interval_s", f"'auto', None or a number >= {MIN_INTERVAL_S} s",
                             interval_s)
        if prices is not None and not isinstance(prices, Prices | PriceConfig):
            prices = _price_config(prices)  # checked before any device is opened
        self._say = say or log.warning
        self.sync = sync
        self.notes: list[str] = []  # about the monitor as a whole; every Measurement carries them
        self._said: set[str] = set()
        self._lock = threading.RLock()
        self._open: dict[str | _Key, _Open] = {}
        self._closed = False
        self._pid = os.getpid()  # NVML handles, the lock's state and the thread do not cross a fork
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Read even when prices= is given: its thresholds.energy_gap_factor applies to every energy figure
        # (docs/design/config.md); prices= used to skip the file, and with it a configured gap factor.
        cfg = load_config(config)
        self.gap_factor = cfg.thresholds.energy_gap_factor
        if prices is None:
            prices = cfg.prices
        self._prices = prices
        self.source = self._open_source(source)
        try:
            first = self._read_now()
            self._all_devices = list(first.devices)
            self._report = self._select(devices, self._all_devices)
            self.interval_s = self._pick_interval(interval_s, first)
        except BaseException:
            self.source.close()
            raise

    # ---- setup ----

    def _open_source(self, source: str | LiveSource) -> LiveSource:
        """`sources/open.py`'s choice for `source`, its lean readings (energy only, RAPL where readable)."""
        if not isinstance(source, str):
            return source
        try:
            return open_source(source.strip() or "auto", say=self._note, lean=True)
        except SourceError as exc:  # NVML asked for by name: the CLI's hint names --source; here, an argument
            from phasescope.sources.nvml import INSTALL_HINT

            raise SourceError(str(exc).replace(INSTALL_HINT, 'or use source="host" to measure the host only')
                              ) from None
        except InputError as exc:
            if exc.path != "--source":
                raise  # a replay file's own error names the file
            # The CLI's wording names its flag; here the spec is this argument.
            raise InputError("Monitor", "source", exc.expected, exc.got) from None

    def _pick_interval(self, wanted: Interval, first: TickBatch) -> float | None:
        if wanted != "auto":
            return None if wanted is None else float(wanted)
        reported = set(self._report)  # a power-only GPU left out by devices= needs no thread
        for row, dev in enumerate(first.devices):
            if is_host_device(dev) or dev.uuid not in reported:
                continue
            if math.isfinite(first.values[row, _POWER]) and not math.isfinite(first.values[row, _ENERGY]):
                return DEFAULT_INTERVAL_S  # power without a counter: it must be integrated, so sample
        if isinstance(self.source, WithRapl) and any(is_host_device(d) for d in self.devices):
            return RAPL_INTERVAL_S  # RAPL wraps every few minutes: a long window needs readings between
        return None

    @staticmethod
    def _select(wanted: Sequence[int | str] | int | str | None, devices: list[DeviceInfo]) -> list[str]:
        if wanted is None:  # the GPUs, and the host where it has a row (alone, or with RAPL energy)
            return [d.uuid for d in devices]
        if isinstance(wanted, int | str):
            # devices=0 or devices="GPU-…": one device (a str was iterated by character, an int raised
            # "'int' object is not iterable").
            wanted = [wanted]
        if not wanted:  # [] would measure nothing at all, silently
            raise InputError("Monitor", "devices", "NVML indices or uuids (None: every device)", "[]")
        keys = [(d.index, d.uuid) for d in devices]
        # A device named twice (devices=[0, "GPU-…"]) is reported once: a second row would count its
        # energy and cost twice in the totals.
        return list(dict.fromkeys(devices[_pick(k, keys, "the watched devices")].uuid for k in wanted))

    @property
    def devices(self) -> list[DeviceInfo]:
        """The devices this monitor reports, in the source's order."""
        chosen = set(self._report)
        return [d for d in self._all_devices if d.uuid in chosen]

    # ---- windows ----

    def begin_window(self, name: str, *, sync: bool | None = None) -> None:
        """Open window `name` (unique among the open ones): sync, then take the first reading."""
        self._begin(name, name, sync)

    def end_window(self, name: str, *, sync: bool | None = None) -> Measurement:
        """Close window `name` and return its time, per-device energy and cost."""
        return self._end(name, sync)

    def _begin(self, key: str | _Key, name: str, sync: bool | None) -> None:
        """Open a window under `key`: its name when opened by name, a private key for `measure()`'s."""
        self._check_process()
        with self._lock:
            self._check_usable()
            self._check_new(key)
        if self.sync if sync is None else sync:
            _sync_cuda()
        # The gap rule judges the readings' own clock: a replay's runs `speed` times the wall clock.
        speed = float(getattr(self.source, "speed", 1.0))
        period = None if self.interval_s is None else self.interval_s * speed
        meter = FleetEnergyMeter(interval_s=period, gap_factor=self.gap_factor)
        with self._lock:
            self._check_usable()
            self._check_new(key)  # again: another thread may have opened it while CUDA synced
            window = self._open[key] = _Open(name, time.time(), time.monotonic(), meter)
            self._read_or_note(window, "start")
            if self.interval_s is not None:
                self._start_sampling()

    def _end(self, key: str | _Key, sync: bool | None) -> Measurement:
        self._check_process()
        with self._lock:
            self._window(key)
        if self.sync if sync is None else sync:
            _sync_cuda()
        with self._lock:
            window = self._window(key)
            self._read_or_note(window, "end")
            end_mono = time.monotonic()
            self._drop(key)
            return self._result(window, end_mono)

    def cancel_window(self, name: str) -> None:
        """Drop window `name` without measuring it."""
        self._check_process()
        with self._lock:
            self._window(name)
            self._drop(name)

    def window(self, name: str, *, sync: bool | None = None) -> Window:
        """A context manager for one window: `with mon.window("eval") as w: ...`, then `w.result`."""
        return Window(self, name, sync=sync)

    def open_windows(self) -> list[str]:
        """The names of the open windows (`measure()`'s may repeat a name: each is its own window)."""
        self._check_process()
        with self._lock:
            return [w.name for w in self._open.values()]

    def sample(self) -> None:
        """Take one reading now into every open window (what the background thread does each interval)."""
        self._check_process()
        with self._lock:
            self._check_usable()
            if self._open:
                self._read_into_open()

    def close(self) -> None:
        """Stop sampling and release the source; open windows are dropped (and said, in one line)."""
        if os.getpid() != self._pid:
            # A forked child's copy (e.g. the shared monitor's atexit in a child that exits normally): its
            # lock may have been held by a thread the child does not have, and NVML is the parent's to shut.
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._open:  # a forgotten end_window (or exit inside a window): not measured, and said so
                names = ", ".join(repr(w.name) for w in self._open.values())
                self._say(f"monitor closed with window(s) still open, not measured: {names}")
            self._open.clear()
            thread = self._detach_sampler()
        if thread is not None:
            thread.join(timeout=5.0)  # no reading in flight when the source closes (NVML shut down)
        self.source.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----

    def _check_process(self) -> None:
        """Before the lock: a forked child's copy of a Monitor must not be used (its lock may be held by a
        thread the child does not have: a deadlock; its sampling thread is not there either)."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"this Monitor was opened in process {self._pid}, before a fork; create one in this process "
                "(phasescope.measure() without monitor= does)")

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this Monitor is closed; create a new one")

    def _window(self, key: str | _Key) -> _Open:
        self._check_usable()
        window = self._open.get(key)
        if window is None:
            name = key.name if isinstance(key, _Key) else key
            open_now = ", ".join(repr(w.name) for w in self._open.values()) or "none"
            raise ValueError(f"window {name!r} is not open (open windows: {open_now})")
        return window

    def _check_new(self, key: str | _Key) -> None:
        if key in self._open:
            name = key.name if isinstance(key, _Key) else key
            raise ValueError(f"window {name!r} is already open; end it first or use another name")

    def _drop(self, key: str | _Key) -> None:
        """Forget an open window; the last one out stops the background readings (the thread ends at its
        next wake-up, which the stop event makes immediate; not joined, so end_window does not wait)."""
        del self._open[key]
        if not self._open:
            self._detach_sampler()

    def _note(self, line: str) -> None:
        """A notice about the monitor itself: said once, and carried by every Measurement."""
        if line not in self._said:
            self._said.add(line)
            self.notes.append(line)
            self._say(line)

    def _read_now(self) -> TickBatch:
        batch = self.source.read()
        for event in batch.events:  # e.g. "GPU lost: ...": said once, kept by the windows open now
            if not self._open:  # between windows it concerns every later window
                self._note(event)
                continue
            if event not in self._said:
                self._said.add(event)
                self._say(event)
            for window in self._open.values():
                if event not in window.notes:
                    window.notes.append(event)
        return batch

    def _read_into_open(self) -> None:
        batch = self._read_now()
        for window in self._open.values():
            window.take(batch, self._zones())

    def _zones(self) -> dict[str, float] | None:
        """RAPL's per-zone joules at the reading just taken (the lock orders readings); None when its
        packages + DRAM total is not finite: the energy skips that reading, so the split does too (a zone
        failing at the end used to leave NaN in `parts` and `dram_energy` beside a finite energy)."""
        if not isinstance(self.source, WithRapl):
            return None
        zones = self.source.zones
        return zones if zones and math.isfinite(self.source.rapl.total_j(zones)) else None

    def _read_or_note(self, window: _Open, when: str) -> None:
        """A reading for every open window; a source that raises costs this reading, not the window."""
        try:
            batch = self._read_now()
        except Exception as exc:
            line = (f"reading the devices at the {when} of window {window.name!r} failed: "
                    f"{type(exc).__name__}: {exc}")
            window.notes.append(line)
            self._say(line)
            return
        for w in self._open.values():
            w.take(batch, self._zones())

    def _start_sampling(self) -> None:
        if self._thread is not None:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, args=(self._stop,),
                                        name="phasescope-monitor", daemon=True)
        self._thread.start()

    def _detach_sampler(self) -> threading.Thread | None:
        """Tell the background thread to end (caller holds the lock); returns it, for a join outside."""
        thread, self._thread = self._thread, None
        self._stop.set()
        return thread

    def _sample_loop(self, stop: threading.Event) -> None:
        assert self.interval_s is not None
        sampler = Sampler(_Reads(self, stop), self.interval_s)
        try:
            sampler.run(lambda _batch: None, stop=stop)
        except Exception as exc:  # a failing source stops the background readings, not the windows
            with self._lock:  # notes and _said are the windows' too
                self._note(f"background sampling stopped: {type(exc).__name__}: {exc}; energy between "
                           "begin and end now comes from those two readings")

    def _result(self, window: _Open, end_mono: float) -> Measurement:
        results = {r.device: r for r in window.meter.results()}
        infos = {d.uuid: d for d in self._all_devices}
        prices, _ = mig_prices({u: self._price(infos[u]) for u in infos}, self._all_devices)
        # Beside GPUs the host row is priced by its energy alone: the $/GPU-hour is the machine's GPU rent,
        # and charged again for the host it would bill a one-GPU machine twice for each hour.
        with_gpus = any(not is_host_device(d) for d in self._all_devices)
        out = []
        for uuid in self._report:
            info = infos[uuid]
            acc = window.util.get(uuid, [0.0, 0.0, 0.0, 0.0])
            util = acc[0] / acc[1] if acc[1] > 0 else None
            notes: list[str] = []
            r = results.get(uuid)
            if r is None:  # not one reading reached this window
                out.append(DeviceMeasurement(uuid, info.name, info.index, "none", None, 0.0, 0.0, util, ZERO,
                                             is_host_device(info), ("no reading in this window",)))
                continue
            measured = r.measured  # kpi/energy's rule: some second covered, else unknown energy, not 0 J
            if not measured:
                notes.append("no power or energy reading: energy not measured" + (
                    " (no readable RAPL counters on this host)" if is_host_device(info) else ""))
            elif r.method == "counter" and r.joules == 0.0 and (acc[3] or is_host_device(info)):
                # The host has no power reading to tell a still counter from an idle one: RAPL's counter
                # moves every ms or so on any running CPU, so a still one means a too-short window there too.
                notes.append(f"the energy counter did not advance in {r.span_s:.3g} s (NVML's updates every "
                             "few tens of ms, RAPL's about every ms): 0 J is a lower bound; measure a longer "
                             "window")
            if uuid in window.dark_at_end:
                # Without a second reading there is no energy at all: say so, not "stops at its last reading".
                notes.append("no reading at the end of the window (GPU lost or not answering): " + (
                    "energy stops at its last reading" if measured else "energy not measured"))
            elif measured and r.span_s > 0 and r.covered_s < r.span_s - 1e-9:
                notes.append(f"energy covers {r.covered_s / r.span_s:.0%} of the window (readings missing)")
            parts: dict[str, float] = {}
            if window.zones and is_host_device(info):
                first, last = window.zones
                parts = {k: last[k] - first[k] for k in last
                         if k in first and math.isfinite(last[k] - first[k])}  # a core/psys zone that failed
            price = prices[uuid]
            if with_gpus and is_host_device(info):
                price = replace(price, usd_per_gpu_hour=None)
            out.append(DeviceMeasurement(
                uuid, info.name, info.index, r.method, r.measured_joules, r.span_s, r.covered_s,
                util, device_cost(r, price), is_host_device(info), tuple(notes), parts))
        return Measurement(window.name, window.start_wall, end_mono - window.start_mono, tuple(out),
                           window.samples, tuple(self.notes + window.notes))

    def _price(self, info: DeviceInfo) -> Prices:
        p = self._prices
        return p if isinstance(p, Prices) else p.for_device(info.name)


class _Reads:
    """What the background Sampler reads through: one reading into every open window, under the lock, so
    readings reach each window's meter in time order whichever thread takes them."""

    name = "phasescope-monitor"

    def __init__(self, monitor: Monitor, stop: threading.Event) -> None:
        self.monitor = monitor
        self.stop = stop

    def read(self) -> TickBatch:
        m = self.monitor
        with m._lock:
            # A thread told to stop reads no more: waiting on the lock, it would otherwise put one more
            # reading into the windows opened since, beside the new thread's.
            if m._open and not m._closed and not self.stop.is_set():
                m._read_into_open()
        return TickBatch.empty(time.time(), [])

    def devices(self) -> list[DeviceInfo]:
        return self.monitor.devices

    def error_counts(self) -> dict[str, int]:
        return self.monitor.source.error_counts()

    def close(self) -> None:  # the Monitor owns the source
        pass


class Window:
    """`with monitor.window(name) as w:` ... then `w.result` (a Measurement), also when the body raised."""

    def __init__(self, monitor: Monitor, name: str, *, sync: bool | None = None, owned: bool = False,
                 private: bool = False) -> None:
        self.monitor = monitor
        self.name = name
        self.sync = sync
        self.result: Measurement | None = None
        self._owned = owned  # a monitor made for this window alone: closed with it
        # measure()'s windows are keyed by this object, not by name: two threads (or a recursion) that
        # measure "step" on the shared monitor each get their own window instead of "already open".
        self._private = private
        self._key: str | _Key = name

    def __enter__(self) -> Window:
        self._key = _Key(self.name) if self._private else self.name
        try:
            self.monitor._begin(self._key, self.name, self.sync)
        except BaseException:
            if self._owned:
                self.monitor.close()
            raise
        return self

    def __call__(self, func: object) -> None:
        """`@phasescope.measure("step")` on a function: not supported (where would each call's result go?);
        without this Python says only "'Window' object is not callable"."""
        if self._owned:
            self.monitor.close()
        raise TypeError(f"measure({self.name!r}) is a context manager, not a decorator: inside the function "
                        f"write `with phasescope.measure({self.name!r}) as w:` and read `w.result`")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.result = self.monitor._end(self._key, self.sync)
        finally:
            if self._owned:
                self.monitor.close()


# ---------------------------------------------------------------- phasescope.measure()

_shared: Monitor | None = None
_shared_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A fresh lock for the child: another thread of the parent may have held this one at the fork."""
    global _shared_lock
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def shared_monitor() -> Monitor:
    """The process-wide Monitor `measure(name)` uses without options: opened on first use (NVML once),
    closed at exit, so `with phasescope.measure("step"):` inside a loop costs two readings, not a setup."""
    global _shared
    with _shared_lock:
        # A forked child opens its own (the parent's copy is left alone: see Monitor._check_process).
        if _shared is None or _shared._closed or _shared._pid != os.getpid():
            _shared = Monitor()
            atexit.register(_shared.close)
        return _shared


def measure(name: str = "window", *, monitor: Monitor | None = None, sync: bool | None = None,
            **options: Any) -> Window:
    """`with phasescope.measure("epoch") as w: ...` then `w.result` (time, energy per device, cost).

    monitor: measure on this Monitor. options (source=, devices=, interval_s=, prices=, config=): a Monitor
    of its own for this one window, closed with it. Neither: the shared process-wide Monitor (one per
    process: a forked child opens its own). Each call is a window of its own, whatever its name: threads
    may measure "step" at the same time, and nested measure() calls need no distinct names.
    """
    if monitor is not None and options:
        raise TypeError(
            f"measure(): give either monitor= or Monitor options, not both ({', '.join(options)})")
    if monitor is not None:
        return Window(monitor, name, sync=sync, private=True)
    if options:
        return Window(Monitor(**options), name, sync=sync, owned=True, private=True)
    return Window(shared_monitor(), name, sync=sync, private=True)


# ---------------------------------------------------------------- helpers


def _joules(j: float | None) -> str:
    if j is None:
        return "not measured"
    return f"{j:,.0f} J" if abs(j) >= 1000 else f"{j:.4g} J"  # an epoch's 1,234,567 J, not 1.235e+06


def _seconds(s: float) -> str:
    return f"{s:,.0f} s" if s >= 1000 else f"{s:.4g} s"


def _usd(usd: float | None) -> str:
    return "no price set" if usd is None else f"${usd:.4g}"


def _price_config(prices: object) -> PriceConfig:
    """Monitor(prices=) given as the config file's [prices] table (a mapping), checked as the file is."""
    if not isinstance(prices, Mapping):
        raise InputError("Monitor", "prices", "a Prices, a PriceConfig, a mapping with the config file's "
                         "[prices] keys (usd_per_gpu_hour, usd_per_kwh, gpu) or None", prices)
    # parse() names the key: "Monitor: prices.usd_per_kwh: expected a number >= 0 (USD), got -1".
    return parse_config({"prices": dict(prices)}, "Monitor").prices


def _sync_cuda() -> None:
    """Wait for queued CUDA work when the program already uses CUDA through torch (never imports torch:
    a program that has not imported it has no CUDA work of torch's to wait for)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    with contextlib.suppress(Exception):  # a broken or CPU-only torch: nothing to wait for
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()


def _pick(key: int | str, devices: Sequence[tuple[int | None, str]], where: str) -> int:
    """The position of the device `key` names: an NVML index, a uuid, or a unique uuid prefix."""
    listed = ", ".join(f"{i}:{u}" if i is not None else u for i, u in devices) or "none"
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise InputError(where, "device", "an NVML index or a uuid", key)
    if isinstance(key, int):
        hits = [n for n, (i, u) in enumerate(devices) if i == key and not u.startswith("MIG-")]
    else:
        exact = [n for n, (_, u) in enumerate(devices) if u == key]
        hits = exact or [n for n, (_, u) in enumerate(devices) if u.startswith(key)]
    if len(hits) != 1:
        what = "no device" if not hits else f"{len(hits)} devices"
        raise InputError(where, f"device {key!r}", f"one of {listed}", what)
    return hits[0]


__all__ = ["DeviceMeasurement", "Measurement", "Monitor", "Window", "measure", "shared_monitor"]
