"""Live source over NVML (nvidia-ml-py): every schema signal of every GPU and MIG instance, each tick.

Error policy (see docs/design/nvml-sampling.md):
- a failing call gives NaN and is counted by call name; it never raises out of `read()`;
- NotSupported / FunctionNotFound / NoPermission / InvalidArgument are remembered per device and call,
  so an unsupported call costs one try, not one per tick;
- GpuIsLost marks the device lost: one event, its row reads NaN from then on (kept, not dropped, so rows
  and UUIDs stay stable for recorders and views), and NVML is not called on it again; the other devices
  keep going;
- Unknown on every call of a tick is an outage, not a loss: one event, NaN while it lasts, retried with
  backoff (OUTAGE_BACKOFF_S doubling to OUTAGE_BACKOFF_MAX_S), one event when it answers again; only after
  OUTAGE_GIVE_UP_S of nothing but Unknown is the GPU given up as lost, and the event says so;
- a value outside its signal's physical range (schema.RANGES) is NaN, counted as `impossible <signal>` in
  `error_counts()` and said once per device and signal;
- a missing library or driver is a `SourceError` with one actionable line (`nvml_available()` says it
  without raising, for `--source auto`).

GPU health (what dcgm-exporter users alert on: ECC errors, remapped rows, PCIe replays, memory temperature,
XID errors) is per physical GPU state, not a signal: it is read every `health_interval_s` (HEALTH_INTERVAL_S)
and handed on in `TickBatch.health`, so recordings, the store and the features do not change. XID events are
drained every tick without blocking (NVML queues them); each is counted, and each code is said as an event
line (as "GPU lost" is) at most once a tick with its count, and once a minute while it repeats.

NVML's sample buffers (`nvmlDeviceGetSamples`: GPU and memory utilisation, total power) are read each tick on
each physical GPU, one call per kind, for the samples newer than the last one seen, and handed on at their own
times in `TickBatch.fine` (docs/design/nvml-samples.md). NotFound there means nothing new, not a failure.

Devices are keyed by UUID: NVML ignores CUDA_VISIBLE_DEVICES, so its indices are not the CUDA ones.
pynvml functions are looked up on the module at call time, so the test fake can patch them.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from phasescope.errors import SourceError
from phasescope.identity import host_name
from phasescope.schema import (
    KB_PER_S,
    MHZ,
    PERCENT,
    RANGES,
    SIGNAL_COLUMN,
    SIGNAL_NAMES,
    SIGNALS,
    DeviceInfo,
    GpuHealth,
    ProcessSample,
    TickBatch,
    impossible,
)

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a core dependency, but say so clearly if it is gone
    pynvml = None

_N = len(SIGNAL_NAMES)
_NAN = math.nan
_C = SIGNAL_COLUMN
_UINT_MAX = 0xFFFFFFFF  # scopeId that asks NVML for the sum over all NVLinks

# NVML return codes (values from nvml.h, mirrored by pynvml; literal so this module imports without it).
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND, _INVALID_ARGUMENT, _TIMEOUT = 3, 4, 6, 2, 10
_DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _FUNCTION_NOT_FOUND = 9, 12, 13
_GPU_IS_LOST, _RESET_REQUIRED, _LIB_RM_MISMATCH, _GPU_NOT_FOUND, _UNKNOWN = 15, 16, 18, 28, 999
# Failures that will not go away while we run: try once, then skip the call on that device.
_STATIC_FAILURES = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NO_PERMISSION, _INVALID_ARGUMENT})
# Failures that mean the device itself is gone.
_LOST_FAILURES = frozenset({_GPU_IS_LOST, _RESET_REQUIRED, _GPU_NOT_FOUND})

_NVML_TEMPERATURE_GPU, _NVML_CLOCK_SM, _NVML_CLOCK_MEM = 0, 1, 2
_NVML_PCIE_TX, _NVML_PCIE_RX = 0, 1
_NVML_DEVICE_MIG_ENABLE = 1
_FI_NVLINK_DATA_TX, _FI_NVLINK_DATA_RX = 138, 139  # cumulative KiB counters
_FI_DEV_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP: memory (HBM) temperature, C
_MEMORY_ERROR_TYPES = (("corrected", 0), ("uncorrected", 1))  # NVML_MEMORY_ERROR_TYPE_*
_ECC_COUNTERS = (("volatile", 0), ("aggregate", 1))  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
_EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
_NO_GPU_INSTANCE = 0xFFFFFFFF  # an event's gpuInstanceId when it is not about one MIG instance
# Error counters change rarely and their alerts look over minutes: their 7 calls per GPU run every 10 s,
# not every tick, where they would add about half again to a tick's 10-17 calls per GPU. XIDs are
# drained every tick (one call per GPU), so the event line comes at once.
HEALTH_INTERVAL_S = 10.0
# A GPU answering Unknown Error to every call is in an outage, not lost: a transient driver state (a GSP
# RPC timeout, a neighbour's reset, persistenced restarting) clears within seconds to a minute, and giving
# up at once would lose the GPU for the rest of the run. It is retried after OUTAGE_BACKOFF_S, then twice
# as long each time up to OUTAGE_BACKOFF_MAX_S (a failing GPU's calls can take a while each: not every
# tick), and given up as lost only after OUTAGE_GIVE_UP_S of nothing else: by then an operator is needed.
OUTAGE_BACKOFF_S = 1.0
OUTAGE_BACKOFF_MAX_S = 30.0
OUTAGE_GIVE_UP_S = 120.0
# Events drained per GPU and tick at most: a storm beyond it (1000/s at 1 Hz) waits in NVML's queue, where
# a critical XID behind it would wait too, so the bound is well above what an application storm makes.
_MAX_XIDS_PER_TICK = 1024
# An XID code repeating (an application that faults in a loop: XID 13 hundreds of times a second) is said
# once per tick at most, with its count, and again only after this long; the counters count every one.
XID_REPEAT_S = 60.0
# What the common XID codes mean, in short (NVIDIA's "XID Errors" documentation and XID catalog).
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception: usually the application (an out-of-range access), rarely the GPU",
    31: "GPU memory page fault: usually an illegal address in the application",
    43: "GPU stopped processing: the application's channel was stopped after a fault in it",
    45: "channel torn down early: a process was killed or ended after an earlier error",
    48: "double-bit ECC error: uncorrectable memory error",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halted",
    63: "ECC page retirement or row remap recorded: applied at the next GPU reset",
    64: "ECC page retirement or row remap failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained uncorrectable ECC error: only the application using that memory is hit",
    95: "uncontained uncorrectable ECC error: every application on the GPU is hit, reset it",
    119: "GSP firmware RPC timeout",
}
# XIDs after which the GPU itself (not the application) needs a reset, a reboot or replacing.
# deploy/prometheus/rules.yml alerts on exactly these as critical (tests/sources/test_nvml_health.py).
CRITICAL_XIDS: frozenset[int] = frozenset({48, 62, 64, 74, 79, 95, 119})
# nvmlValueType_t -> the member of c_nvmlValue_t that holds the value
_FIELD_VALUE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# nvmlDeviceGetSamples: (nvmlSamplingType_t from nvml.h, schema signal, factor from NVML's unit to base units)
_SAMPLE_KINDS: tuple[tuple[int, str, float], ...] = (
    (1, "gpu_util", PERCENT),  # NVML_GPU_UTILIZATION_SAMPLES, percent
    (0, "power", 1e-3),  # NVML_TOTAL_POWER_SAMPLES, mW
    (2, "mem_util", PERCENT),  # NVML_MEMORY_UTILIZATION_SAMPLES, percent
)
# Real drivers stamp the samples in Unix microseconds; a stamp further than this from our clock is on some
# other clock and is anchored to the tick's time instead (`_sample_offset`).
_UNIX_CLOCK_SLACK_S = 86400.0
# GPM metric ids -> schema signal (all percent 0-100).
_GPM_METRICS: tuple[tuple[int, str], ...] = ((2, "sm_active"), (5, "tensor_active"), (10, "dram_active"))

INSTALL_HINT = "or run with --source host to watch the host only"


class _GpuLost(Exception):
    """Raised inside one device's read to abandon the rest of its calls."""


@dataclass
class _Gpm:
    """Two GPM sample buffers per device: a metric needs the previous sample and the current one."""

    prev: Any
    cur: Any
    request: Any  # reused c_nvmlGpmMetricsGet_t
    have_prev: bool = False


@dataclass
class _Device:
    handle: Any
    info: DeviceInfo
    parent: _Device | None = None
    mig_enabled: bool = False  # a physical GPU split into MIG instances; they report its work
    gpu_instance_id: int | None = None
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    gpm: _Gpm | None = None
    nvlink_prev: tuple[float, float, float] | None = None  # (timestamp us, tx KiB, rx KiB)
    proc_util_ts: int = 0  # last-seen timestamp for nvmlDeviceGetProcessUtilization (us)
    proc_util: dict[int, tuple[float, float]] = field(default_factory=dict)  # pid -> (sm ratio, seen at)
    static: dict[str, Any] = field(default_factory=dict)
    health: GpuHealth | None = None  # physical GPUs only: the last health read (sources/base.py)
    health_due: float = 0.0  # time.monotonic() of the next health read
    xid_set: Any = None  # nvmlEventSet_t registered for this GPU's XID events; None: not watched
    xid_count: int = 0
    last_xid: int = 0
    last_xid_time: float | None = None
    # The critical ones (CRITICAL_XIDS) apart: an application XID right after (48, then 45 as its channel is
    # torn down) must not hide that the GPU had one.
    critical_xid_count: int = 0
    last_critical_xid: int = 0
    # (xid, GPU instance) -> (time.monotonic() it was last said, how many came since without a line)
    xid_said: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    # per-tick bookkeeping for the outage rule
    attempts: int = 0
    unknown: int = 0
    # an outage (Unknown on every call): since when (the source's clock), the next retry, the wait after
    # it, and the calls that failed meanwhile; down_since None: answering
    down_since: float | None = None
    retry_at: float = 0.0
    backoff_s: float = OUTAGE_BACKOFF_S
    down_calls: int = 0
    impossible_said: set[str] = field(default_factory=set)  # signals already said out of range
    # nvmlDeviceGetSamples: sampling type -> the newest timestamp seen (driver clock, us); and the seconds
    # added to a driver stamp to make it Unix time (0 on real drivers; None until the first sample)
    samples_seen: dict[int, int] = field(default_factory=dict)
    sample_offset: float | None = None


def _error_code(exc: BaseException) -> int:
    return int(getattr(exc, "value", _UNKNOWN))


def init_error_line(exc: BaseException) -> str:
    """One actionable line for a failed nvmlInit."""
    code = _error_code(exc)
    if code == _LIBRARY_NOT_FOUND:
        return ("NVML library not found (libnvidia-ml.so.1): install the NVIDIA driver, which ships it, "
                f"{INSTALL_HINT}")
    if code == _DRIVER_NOT_LOADED:
        return ("NVIDIA driver not loaded: check `nvidia-smi` and that the nvidia kernel module is loaded, "
                f"{INSTALL_HINT}")
    if code == _NO_PERMISSION:
        return f"no permission to open NVML: check access to /dev/nvidia*, {INSTALL_HINT}"
    if code == _LIB_RM_MISMATCH:
        return ("NVML library and kernel driver versions differ (driver updated without a reboot?): "
                f"reboot or reload the nvidia module, {INSTALL_HINT}")
    return f"NVML failed to initialise ({exc}): check `nvidia-smi`, {INSTALL_HINT}"


def _init() -> None:
    """nvmlInit, or SourceError with one line."""
    if pynvml is None:
        raise SourceError(f"nvidia-ml-py is not installed: pip install nvidia-ml-py, {INSTALL_HINT}")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise SourceError(init_error_line(exc)) from None
    except OSError as exc:  # a broken libnvidia-ml.so can fail in the loader itself
        raise SourceError(f"NVML library could not be loaded ({exc}), {INSTALL_HINT}") from None


def nvml_available() -> tuple[bool, str]:
    """Whether NVML works and sees at least one GPU; else False and the one line to print."""
    try:
        _init()
    except SourceError as exc:
        return False, str(exc)
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        return False, f"NVML cannot count GPUs ({exc}): check `nvidia-smi`, {INSTALL_HINT}"
    finally:
        _shutdown_quietly()
    if count == 0:
        return False, "NVML found no NVIDIA GPU; watching the host only"
    return True, f"NVML sees {count} GPU(s)"


def _shutdown_quietly() -> None:
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


class NvmlSource:
    """All NVIDIA GPUs (and MIG instances) on this host, read through NVML. See the module doc for errors."""

    name = "nvml"

    def __init__(
        self, processes: bool = True, gpm: bool = True, nvlink: bool = True,
        health_interval_s: float = HEALTH_INTERVAL_S, health: bool = True,
        clock: Callable[[], float] = time.monotonic, samples: bool = True,
    ) -> None:
        _init()
        self._clock = clock  # of the outage backoff; injectable so tests need not wait minutes
        self._open = True
        self._want_processes = processes
        self._want_gpm = gpm
        self._want_nvlink = nvlink
        self._want_samples = samples  # False: no nvmlDeviceGetSamples (the sampler benchmark's baseline)
        self._health_interval_s = float(health_interval_s)
        self._want_health = health  # False: no XID event sets, no health reads (`measure` needs neither)
        self._errors: dict[str, int] = {}
        self._pending_events: list[str] = []
        self._host = host_name()
        self._driver = self._driver_version()
        self._devs: list[_Device] = []
        try:
            self._enumerate()
            for dev in self._devs if health else ():
                self._setup_xid_events(dev)
        except BaseException:
            self.close()
            raise

    # ---- setup -------------------------------------------------------------------------------------

    def _driver_version(self) -> str:
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            self._count("nvmlSystemGetDriverVersion")
            return ""

    def _enumerate(self) -> None:
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise SourceError(f"NVML cannot count GPUs ({exc}): check `nvidia-smi`, {INSTALL_HINT}") from None
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = str(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError as exc:
                # One bad GPU must not hide the others: report it and go on.
                self._count("nvmlDeviceGetHandleByIndex")
                self._pending_events.append(f"GPU #{index} could not be opened through NVML ({exc}); skipped")
                continue
            dev = self._make_device(handle, uuid, index, None)
            self._devs.append(dev)
            mode = self._setup_call(dev, "nvmlDeviceGetMigMode", handle)
            if mode is not None and int(mode[0]) == _NVML_DEVICE_MIG_ENABLE:
                dev.mig_enabled = True
                self._devs.extend(self._enumerate_mig(dev))
        if self._want_gpm:
            for dev in self._devs:
                # A MIG instance samples GPM through its parent by GPU-instance id; without one, it cannot.
                if not dev.lost and (dev.parent is None or dev.gpu_instance_id is not None):
                    dev.gpm = self._setup_gpm(dev)

    def _enumerate_mig(self, parent: _Device) -> list[_Device]:
        slots = self._setup_call(parent, "nvmlDeviceGetMaxMigDeviceCount", parent.handle) or 0
        children: list[_Device] = []
        for slot in range(int(slots)):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
                uuid = str(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                continue  # an empty slot answers NotFound: normal
            child = self._make_device(handle, uuid, parent.info.index, parent, slot)
            gi = self._setup_call(child, "nvmlDeviceGetGpuInstanceId", handle)
            child.gpu_instance_id = None if gi is None else int(gi)
            children.append(child)
        return children

    def _make_device(
        self, handle: Any, uuid: str, index: int | None, parent: _Device | None, mig_slot: int | None = None
    ) -> _Device:
        dev = _Device(handle=handle, info=DeviceInfo(uuid=uuid), parent=parent)
        name = self._setup_call(dev, "nvmlDeviceGetName", handle)
        mem = self._setup_call(dev, "nvmlDeviceGetMemoryInfo", handle)
        limit = self._setup_call(dev, "nvmlDeviceGetEnforcedPowerLimit", handle)
        sm_max = self._setup_call(dev, "nvmlDeviceGetMaxClockInfo", handle, _NVML_CLOCK_SM, key="sm")
        mem_max = self._setup_call(dev, "nvmlDeviceGetMaxClockInfo", handle, _NVML_CLOCK_MEM, key="mem")
        # The board's PCI address (dcgm-exporter's `pci_bus_id`); a MIG instance is on its GPU's.
        if parent is None:
            pci = self._setup_call(dev, "nvmlDeviceGetPciInfo", handle)
            bus_id = None if pci is None else str(pci.busId)
        else:
            bus_id = parent.static.get("pci_bus_id")
        static: dict[str, Any] = {
            "uuid": uuid,
            "name": "" if name is None else str(name),
            "index": index,
            "parent_uuid": None if parent is None else parent.info.uuid,
            "mig_slot": mig_slot,
            "pci_bus_id": bus_id,
            "driver_version": self._driver,
            "mem_total_bytes": _NAN if mem is None else float(mem.total),
            "power_limit_w": _NAN if limit is None else limit / 1000.0,
            "max_sm_clock_hz": _NAN if sm_max is None else sm_max * MHZ,
            "max_mem_clock_hz": _NAN if mem_max is None else mem_max * MHZ,
        }
        dev.static = static
        extra = {k: str(v) for k, v in static.items() if k not in ("uuid", "name", "index", "parent_uuid")
                 and v is not None and v == v}  # v == v drops NaN: unknown is absent, not "nan"
        dev.info = DeviceInfo(uuid=uuid, name=static["name"], index=index, host=self._host,
                              parent_uuid=static["parent_uuid"], extra=extra)
        return dev

    def _setup_gpm(self, dev: _Device) -> _Gpm | None:
        # GPM (Hopper+) is queried on the physical GPU; MIG instances sample through their parent.
        phys = dev.parent or dev
        support = self._setup_call(dev, "nvmlGpmQueryDeviceSupport", phys.handle)
        if support is None or not int(support.isSupportedDevice):
            return None
        try:
            prev = pynvml.nvmlGpmSampleAlloc()
            cur = pynvml.nvmlGpmSampleAlloc()
        except pynvml.NVMLError:
            self._count("nvmlGpmSampleAlloc")
            return None
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        for i, (metric_id, _) in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = metric_id
        return _Gpm(prev=prev, cur=cur, request=request)

    def _setup_xid_events(self, dev: _Device) -> None:
        """An event set for the XID events of one physical GPU (a MIG instance's come through its parent)."""
        if dev.parent is not None or dev.lost:
            return
        evset = self._setup_call(dev, "nvmlEventSetCreate")
        if evset is None:
            return
        # nvmlDeviceRegisterEvents returns None on success too: a failure shows as one more count.
        failures = self._errors.get("nvmlDeviceRegisterEvents", 0)
        self._setup_call(dev, "nvmlDeviceRegisterEvents", dev.handle, _EVENT_XID, evset)
        if self._errors.get("nvmlDeviceRegisterEvents", 0) != failures:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(evset)
            return
        dev.xid_set = evset

    def _setup_call(self, dev: _Device, fn: str, *args: Any, key: str = "") -> Any:
        """A call made once at setup; failures are counted and remembered like any other."""
        try:
            return self._call(dev, fn, *args, key=key)
        except _GpuLost as exc:
            self._mark_lost(dev, str(exc))
            return None

    # ---- the hot path --------------------------------------------------------------------------------

    def _count(self, fn: str) -> None:
        self._errors[fn] = self._errors.get(fn, 0) + 1

    def _call(self, dev: _Device, fn: str, *args: Any, key: str = "") -> Any:
        """Call pynvml.<fn>(*args); None on failure (counted). Raises _GpuLost when the device is gone."""
        memo = f"{fn}:{key}" if key else fn
        if memo in dev.unsupported:
            return None
        dev.attempts += 1
        try:
            return getattr(pynvml, fn)(*args)
        except pynvml.NVMLError as exc:
            self._count(fn)
            code = _error_code(exc)
            if code in _STATIC_FAILURES:
                dev.unsupported.add(memo)
            elif code in _LOST_FAILURES:
                raise _GpuLost(f"{fn}: {exc}") from None
            elif code == _UNKNOWN:
                dev.unknown += 1
            return None
        except pynvml.NVMLLibraryMismatchError:  # an unversioned call the installed driver lacks
            self._count(fn)
            dev.unsupported.add(memo)
            return None

    def devices(self) -> list[DeviceInfo]:
        return [d.info for d in self._devs]

    def static_info(self) -> dict[str, dict[str, Any]]:
        """Per device UUID: name, driver, memory total, power limit, max clocks (manifests, scaling)."""
        return {d.info.uuid: dict(d.static) for d in self._devs}

    def unsupported_calls(self) -> dict[str, list[str]]:
        """Per device UUID: the calls found unsupported (tried once, then skipped)."""
        return {d.info.uuid: sorted(d.unsupported) for d in self._devs if d.unsupported}

    def error_counts(self) -> dict[str, int]:
        return dict(self._errors)

    def read(self) -> TickBatch:
        now = time.time()
        events, self._pending_events = self._pending_events, []
        rows: list[list[float]] = []
        processes: list[ProcessSample] = []
        fine: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        mono = self._clock()
        for dev in self._devs:
            row = [_NAN] * _N
            if not dev.lost and (dev.down_since is None or mono >= dev.retry_at):
                dev.attempts = dev.unknown = 0
                self._poll_xids(dev, now, events)
                try:
                    self._read_signals(dev, row)
                    if self._want_health and dev.parent is None and time.monotonic() >= dev.health_due:
                        self._read_health(dev, now)
                    if self._want_processes and not dev.mig_enabled:
                        self._read_processes(dev, now, processes)
                    if self._want_samples and dev.parent is None:
                        got = self._read_samples(dev, now)
                        if got:
                            fine[dev.info.uuid] = got
                except _GpuLost as exc:
                    row = [_NAN] * _N
                    self._poll_xids(dev, now, events)  # the XID that says why (79) may have come meanwhile
                    events.extend(self._mark_lost(dev, str(exc)))
                else:
                    # Unknown from every call (at least a few: one odd failure is not an outage).
                    if dev.attempts >= 3 and dev.unknown == dev.attempts:
                        row = [_NAN] * _N
                        events.extend(self._outage(dev, mono))
                    elif dev.down_since is not None:
                        events.append(f"GPU answering again: {dev.info.label()} after "
                                      f"{mono - dev.down_since:.0f} s of Unknown Error "
                                      f"({dev.down_calls} failed calls)")
                        dev.down_since = None
            rows.append(row)
        values = np.array(rows, dtype=np.float64) if rows else np.empty((0, _N))
        events.extend(self._drop_impossible(values))
        # A lost GPU keeps its last health: its last XID (79) is what an SRE needs to see.
        health = {d.info.uuid: d.health for d in self._devs if d.health is not None}
        return TickBatch(time=now, devices=self.devices(), values=values, processes=processes, events=events,
                         health=health, fine=fine)

    def _outage(self, dev: _Device, mono: float) -> list[str]:
        """A tick of nothing but Unknown: start or extend the device's outage; give up after
        OUTAGE_GIVE_UP_S. Returns the event to say, if any (its start, or the giving up)."""
        first = dev.down_since is None
        if dev.down_since is None:
            dev.down_since, dev.backoff_s, dev.down_calls = mono, OUTAGE_BACKOFF_S, 0
        dev.down_calls += dev.unknown
        down_for = mono - dev.down_since
        if down_for >= OUTAGE_GIVE_UP_S:
            return self._mark_lost(dev, f"NVML answered Unknown Error to every call for {down_for:.0f} s "
                                        f"({dev.down_calls} failed calls); given up after "
                                        f"{OUTAGE_GIVE_UP_S:.0f} s")
        dev.retry_at = mono + dev.backoff_s
        dev.backoff_s = min(2.0 * dev.backoff_s, OUTAGE_BACKOFF_MAX_S)
        if not first:
            return []
        return [f"GPU not answering: {dev.info.label()} (NVML Unknown Error on every call); its readings are "
                f"NaN meanwhile, retried with backoff up to every {OUTAGE_BACKOFF_MAX_S:.0f} s, given up as "
                f"lost after {OUTAGE_GIVE_UP_S:.0f} s"]

    def _drop_impossible(self, values: np.ndarray) -> list[str]:
        """Set every value outside its signal's physical range to NaN (in place), count it, and say it once
        per device and signal: a driver's garbage must not become joules or a verdict."""
        events: list[str] = []
        for name in SIGNAL_NAMES:
            j = _C[name]
            bad = impossible(name, values[:, j])
            if not bad.any():
                continue
            for i in np.flatnonzero(bad).tolist():
                dev = self._devs[i]
                self._count(f"impossible {name}")
                if name not in dev.impossible_said:
                    dev.impossible_said.add(name)
                    lo, hi = RANGES[name]
                    events.append(f"impossible reading: {dev.info.label()} {name} = {values[i, j]:g} "
                                  f"{SIGNALS[name].unit}, outside {lo:g}..{hi:g}: read as missing; counted "
                                  f"in error_counts as 'impossible {name}', said once")
            values[bad, j] = np.nan
        return events

    def _mark_lost(self, dev: _Device, why: str) -> list[str]:
        """Mark a device (and its MIG instances) lost; return the one event that says so."""
        if dev.lost:
            return []
        dev.lost = True
        children = [d for d in self._devs if d.parent is dev]
        for child in children:
            child.lost = True
        also = f" with its {len(children)} MIG instance(s)" if children else ""
        return [f"GPU lost: {dev.info.label()}{also} ({why}); its readings are NaN from now on, "
                "other devices keep going"]

    def _read_signals(self, dev: _Device, row: list[float]) -> None:
        h = dev.handle
        call = self._call
        util = call(dev, "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            row[_C["gpu_util"]] = util.gpu * PERCENT
            row[_C["mem_util"]] = util.memory * PERCENT
        mem = call(dev, "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            row[_C["mem_used"]] = float(mem.used)
            row[_C["mem_total"]] = float(mem.total)
        v = call(dev, "nvmlDeviceGetPowerUsage", h)
        if v is not None:
            row[_C["power"]] = v / 1000.0  # mW
        v = call(dev, "nvmlDeviceGetTemperature", h, _NVML_TEMPERATURE_GPU)
        if v is not None:
            row[_C["temperature"]] = float(v)
        v = call(dev, "nvmlDeviceGetClockInfo", h, _NVML_CLOCK_SM, key="sm")
        if v is not None:
            row[_C["sm_clock"]] = v * MHZ
        v = call(dev, "nvmlDeviceGetClockInfo", h, _NVML_CLOCK_MEM, key="mem")
        if v is not None:
            row[_C["mem_clock"]] = v * MHZ
        v = call(dev, "nvmlDeviceGetPcieThroughput", h, _NVML_PCIE_TX, key="tx")
        if v is not None:
            row[_C["pcie_tx"]] = v * KB_PER_S
        v = call(dev, "nvmlDeviceGetPcieThroughput", h, _NVML_PCIE_RX, key="rx")
        if v is not None:
            row[_C["pcie_rx"]] = v * KB_PER_S
        v = call(dev, "nvmlDeviceGetTotalEnergyConsumption", h)
        if v is not None:
            row[_C["energy"]] = v / 1000.0  # mJ
        v = call(dev, "nvmlDeviceGetEnforcedPowerLimit", h)
        if v is not None:
            row[_C["power_limit"]] = v / 1000.0  # mW
        v = self._clocks_event_reasons(dev)
        if v is not None:
            row[_C["throttle_reasons"]] = float(v)
        if self._want_nvlink and not dev.mig_enabled:
            self._read_nvlink(dev, row)
        if dev.gpm is not None:
            self._read_gpm(dev, dev.gpm, row)

    def _read_health(self, dev: _Device, now: float) -> None:
        """ECC, remapped rows, PCIe replays and memory temperature of a physical GPU; unsupported ones are
        tried once (as every call) and stay absent."""
        dev.health_due = time.monotonic() + self._health_interval_s
        h = dev.handle
        ecc: dict[str, dict[str, int]] = {}
        for kind, kind_id in _MEMORY_ERROR_TYPES:
            for scope, scope_id in _ECC_COUNTERS:
                v = self._call(dev, "nvmlDeviceGetTotalEccErrors", h, kind_id, scope_id,
                               key=f"{kind}:{scope}")
                if v is not None:
                    ecc.setdefault(kind, {})[scope] = int(v)
        rows: dict[str, int] = {}
        pending = failure = None
        remap = self._call(dev, "nvmlDeviceGetRemappedRows", h)
        if remap is not None:
            corrected, uncorrected, is_pending, failed = remap
            rows = {"correctable": int(corrected), "uncorrectable": int(uncorrected)}
            pending, failure = bool(is_pending), bool(failed)
        replays = self._call(dev, "nvmlDeviceGetPcieReplayCounter", h)
        dev.health = GpuHealth(
            time=now, ecc=ecc, remapped_rows=rows, remap_pending=pending, remap_failure=failure,
            pcie_replays=None if replays is None else int(replays),
            mem_temperature_c=self._mem_temperature(dev),
            **self._xid_fields(dev),
        )

    def _mem_temperature(self, dev: _Device) -> float | None:
        fields = self._call(dev, "nvmlDeviceGetFieldValues", dev.handle, [_FI_DEV_MEMORY_TEMP], key="memtemp")
        if fields is None or self._field_failed(dev, fields, "memtemp"):
            return None
        f = fields[0]
        v = float(getattr(f.value, _FIELD_VALUE.get(int(f.valueType), "uiVal")))
        # GPUs without a memory sensor (GDDR: L4, L40S, T4) answer 0, which dcgm-exporter publishes as 0 C
        # (shared data, formats/dcgm-exporter-prom): a working GPU's memory is never at 0 C, so: unknown.
        return v if v > 0 else None

    def _xid_fields(self, dev: _Device) -> dict[str, Any]:
        if dev.xid_set is None:
            return {"xid_errors": None, "last_xid": None, "last_xid_time": None, "critical_xid_errors": None,
                    "last_critical_xid": None}
        return {"xid_errors": dev.xid_count, "last_xid": dev.last_xid, "last_xid_time": dev.last_xid_time,
                "critical_xid_errors": dev.critical_xid_count, "last_critical_xid": dev.last_critical_xid}

    def _poll_xids(self, dev: _Device, now: float, events: list[str]) -> None:
        """Drain this GPU's queued XID events without waiting (timeout 0): each is counted; each code is said
        once per tick with its count, and a repeating one again only after XID_REPEAT_S (`_say_xids`)."""
        if dev.xid_set is None:
            return
        fn = "nvmlEventSetWait_v2"
        got = 0
        drained: dict[tuple[int, int], int] = {}  # (xid, GPU instance) -> events this tick, in order seen
        for _ in range(_MAX_XIDS_PER_TICK):  # calls, not XIDs: bounded whatever the set hands back
            try:
                data = pynvml.nvmlEventSetWait_v2(dev.xid_set, 0)
            except pynvml.NVMLError as exc:
                code = _error_code(exc)
                if code == _TIMEOUT:
                    break  # nothing queued: normal
                self._count(fn)
                if code in _STATIC_FAILURES:  # never works here: stop watching (the counters go absent)
                    dev.unsupported.add(fn)
                    with contextlib.suppress(pynvml.NVMLError):
                        pynvml.nvmlEventSetFree(dev.xid_set)
                    dev.xid_set = None
                break
            if not int(data.eventType) & _EVENT_XID:
                continue
            got += 1
            xid = int(data.eventData)
            dev.xid_count += 1
            dev.last_xid, dev.last_xid_time = xid, now
            if xid in CRITICAL_XIDS:
                dev.critical_xid_count += 1
                dev.last_critical_xid = xid
            key = (xid, int(data.gpuInstanceId))
            drained[key] = drained.get(key, 0) + 1
        events.extend(self._say_xids(dev, drained))
        if got or dev.xid_set is None:
            base = dev.health or GpuHealth(time=now)
            dev.health = replace(base, **self._xid_fields(dev))

    @staticmethod
    def _say_xids(dev: _Device, drained: dict[tuple[int, int], int]) -> list[str]:
        """One event line per XID code of this tick, unless the same code was said under XID_REPEAT_S ago:
        then it is only counted, and the next line says how many were not."""
        lines = []
        mono = time.monotonic()
        for key, n in drained.items():
            said_at, unsaid = dev.xid_said.get(key, (-math.inf, 0))
            if mono - said_at < XID_REPEAT_S:
                dev.xid_said[key] = (said_at, unsaid + n)
                continue
            dev.xid_said[key] = (mono, 0)
            line = xid_event_line(dev.info, key[0], key[1])
            if n > 1 or unsaid:
                line += f", {n} time(s) this tick" + (
                    f", {unsaid} more since the last line about it" if unsaid else "")
            lines.append(line)
        return lines

    def _clocks_event_reasons(self, dev: _Device) -> Any:
        # Renamed in driver 535 ("throttle" -> "clocks event"); older drivers only have the old name.
        if "nvmlDeviceGetCurrentClocksEventReasons" not in dev.unsupported:
            v = self._call(dev, "nvmlDeviceGetCurrentClocksEventReasons", dev.handle)
            if v is not None or "nvmlDeviceGetCurrentClocksEventReasons" not in dev.unsupported:
                return v
        return self._call(dev, "nvmlDeviceGetCurrentClocksThrottleReasons", dev.handle)

    def _field_failed(self, dev: _Device, fields: Any, key: str) -> bool:
        """Whether a field of a `nvmlDeviceGetFieldValues` answer failed (the call succeeds and each field
        carries its own return code): counted, and remembered as unsupported when it cannot change."""
        code = next((int(f.nvmlReturn) for f in fields if f.nvmlReturn != 0), 0)
        if not code:
            return False
        self._count("nvmlDeviceGetFieldValues")
        if code in _STATIC_FAILURES:
            dev.unsupported.add(f"nvmlDeviceGetFieldValues:{key}")
        return True

    def _read_nvlink(self, dev: _Device, row: list[float]) -> None:
        # Cumulative KiB counters summed over all links (scopeId UINT_MAX); rate = delta / delta-t.
        fields = self._call(dev, "nvmlDeviceGetFieldValues", dev.handle,
                            [(_FI_NVLINK_DATA_TX, _UINT_MAX), (_FI_NVLINK_DATA_RX, _UINT_MAX)], key="nvlink")
        if fields is None:
            return
        if self._field_failed(dev, fields, "nvlink"):
            dev.nvlink_prev = None
            return
        tx, rx = fields[0], fields[1]
        now = (float(tx.timestamp), float(tx.value.ullVal), float(rx.value.ullVal))
        prev = dev.nvlink_prev
        dev.nvlink_prev = now
        if prev is not None and now[0] > prev[0]:
            dt = (now[0] - prev[0]) * 1e-6
            row[_C["nvlink_tx"]] = (now[1] - prev[1]) * 1024.0 / dt
            row[_C["nvlink_rx"]] = (now[2] - prev[2]) * 1024.0 / dt

    def _read_gpm(self, dev: _Device, gpm: _Gpm, row: list[float]) -> None:
        if dev.parent is not None and dev.gpu_instance_id is not None:
            got = self._call(dev, "nvmlGpmMigSampleGet", dev.parent.handle, dev.gpu_instance_id, gpm.cur)
        else:
            got = self._call(dev, "nvmlGpmSampleGet", dev.handle, gpm.cur)
        if got is None:
            gpm.have_prev = False
            return
        if gpm.have_prev:
            req = gpm.request
            req.sample1 = gpm.prev
            req.sample2 = gpm.cur
            if self._call(dev, "nvmlGpmMetricsGet", req) is not None:
                for i, (_, signal) in enumerate(_GPM_METRICS):
                    metric = req.metrics[i]
                    if metric.nvmlReturn == 0:
                        row[_C[signal]] = metric.value * PERCENT
        gpm.prev, gpm.cur = gpm.cur, gpm.prev
        gpm.have_prev = True

    def _read_samples(self, dev: _Device, now: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The driver's samples of each kind newer than the last seen, at their own times (Unix s) in base
        units; each kind costs one call a tick, and none after it answered NotSupported (or the like)."""
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for kind, signal, scale in _SAMPLE_KINDS:
            memo = f"nvmlDeviceGetSamples:{signal}"
            if memo in dev.unsupported:
                continue
            last = dev.samples_seen.get(kind, 0)
            dev.attempts += 1
            try:
                value_type, samples = pynvml.nvmlDeviceGetSamples(dev.handle, kind, last)
            except pynvml.NVMLError as exc:
                code = _error_code(exc)
                if code == _NOT_FOUND:
                    continue  # nothing newer than `last`: normal between two ticks
                self._count("nvmlDeviceGetSamples")
                if code in _STATIC_FAILURES:
                    dev.unsupported.add(memo)
                elif code in _LOST_FAILURES:
                    raise _GpuLost(f"nvmlDeviceGetSamples: {exc}") from None
                elif code == _UNKNOWN:
                    dev.unknown += 1
                continue
            member = _FIELD_VALUE.get(int(value_type))
            if member is None:  # a value type this code does not know: it will not change, stop asking
                self._count("nvmlDeviceGetSamples")
                dev.unsupported.add(memo)
                continue
            # Plain Python over the few new samples of a tick: cheaper than numpy on arrays this small. The
            # buffer may hand back what was seen already, or out of order: each stamp once, newer than last.
            lo, hi = RANGES[signal]
            stamps: list[int] = []
            vals: list[float] = []
            bad = 0
            newest = last
            for ts, raw in sorted((int(x.timeStamp), float(getattr(x.sampleValue, member))) for x in samples):
                if ts <= newest:
                    continue
                newest = ts
                v = raw * scale
                if not lo <= v <= hi:  # a driver's garbage is dropped and counted; a NaN only dropped
                    if v == v:
                        bad += 1
                    continue
                stamps.append(ts)
                vals.append(v)
            if bad:  # counted apart from the row's (`_drop_impossible`)
                self._count(f"impossible {signal} sample")
            if newest == last:
                continue
            dev.samples_seen[kind] = newest
            if dev.sample_offset is None:
                dev.sample_offset = self._sample_offset(newest, now)
            if stamps:
                t = np.array(stamps, dtype=np.float64) * 1e-6 + dev.sample_offset
                out[signal] = (t, np.array(vals, dtype=np.float64))
        return out

    @staticmethod
    def _sample_offset(newest_us: int, now: float) -> float:
        """Seconds to add to the driver's sample stamps for Unix time: none when they are Unix microseconds
        (real drivers); else the newest sample of the first read is taken as read now, and the rest keep
        their spacing from it."""
        t = newest_us * 1e-6
        return 0.0 if abs(t - now) < _UNIX_CLOCK_SLACK_S else now - t

    def _read_processes(self, dev: _Device, now: float, out: list[ProcessSample]) -> None:
        used: dict[int, float] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for proc in self._call(dev, fn, dev.handle) or ():
                mem = proc.usedGpuMemory  # None where the driver cannot tell (WDDM)
                pid = int(proc.pid)
                if mem is not None and not used.get(pid, 0.0) > mem:
                    used[pid] = float(mem)
                else:
                    used.setdefault(pid, _NAN)
        if not used:
            dev.proc_util.clear()
            return
        self._read_process_util(dev, now)
        uuid = dev.info.uuid
        horizon = now - 5.0  # a per-process sample older than this no longer describes the process
        for pid, mem in used.items():
            sm, seen = dev.proc_util.get(pid, (_NAN, 0.0))
            out.append(ProcessSample(time=now, pid=pid, device_uuid=uuid, gpu_mem_used=mem,
                                     sm_util=sm if seen >= horizon else _NAN))
        for pid in [p for p in dev.proc_util if p not in used]:
            del dev.proc_util[pid]

    def _read_process_util(self, dev: _Device, now: float) -> None:
        memo = "nvmlDeviceGetProcessUtilization"
        if memo in dev.unsupported:
            return
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(dev.handle, dev.proc_util_ts)
        except pynvml.NVMLError as exc:
            code = _error_code(exc)
            if code == _NOT_FOUND:
                return  # no new sample since the last one: normal, not a failure
            self._count(memo)
            if code in _STATIC_FAILURES:
                dev.unsupported.add(memo)
            elif code in _LOST_FAILURES:
                raise _GpuLost(f"{memo}: {exc}") from None
            return
        # Newest sample per PID; NVML stamps them on its own clock, so staleness is judged on ours.
        newest: dict[int, tuple[int, float]] = {}
        for sample in samples:
            ts = int(sample.timeStamp)
            pid = int(sample.pid)
            if ts >= newest.get(pid, (-1, 0.0))[0]:
                newest[pid] = (ts, sample.smUtil * PERCENT)
            dev.proc_util_ts = max(dev.proc_util_ts, ts)
        for pid, (_, sm) in newest.items():
            dev.proc_util[pid] = (sm, now)

    def close(self) -> None:
        if not getattr(self, "_open", False):
            return
        self._open = False
        for dev in getattr(self, "_devs", []):
            if dev.xid_set is not None:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(dev.xid_set)
                dev.xid_set = None
            if dev.gpm is not None:
                for sample in (dev.gpm.prev, dev.gpm.cur):
                    with contextlib.suppress(pynvml.NVMLError):
                        pynvml.nvmlGpmSampleFree(sample)
                dev.gpm = None
        _shutdown_quietly()

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def xid_event_line(info: DeviceInfo, xid: int, gpu_instance_id: int = _NO_GPU_INSTANCE) -> str:
    """One event line for an XID: "GPU 3 (GPU-...): XID 79 (GPU has fallen off the bus)"."""
    meaning = XID_MEANINGS.get(xid, "see NVIDIA's XID catalog")
    where = "" if gpu_instance_id == _NO_GPU_INSTANCE else f", GPU instance {gpu_instance_id}"
    index = "" if info.index is None else f" {info.index}"
    return f"GPU{index} ({info.uuid}{where}): XID {xid} ({meaning})"


def open_nvml_or_none(say: Callable[[str], None]) -> NvmlSource | None:
    """For `--source auto`: an NvmlSource, or None after saying once why the host alone is watched."""
    ok, line = nvml_available()
    if not ok:
        say(_host_instead(line))
        return None
    try:
        return NvmlSource()
    except SourceError as exc:
        say(_host_instead(str(exc)))
        return None


def _host_instead(line: str) -> str:
    """`auto` already watches the host: say so, and do not tell a CPU-only machine to install a driver."""
    if line.startswith("NVML library not found"):
        return ("no NVIDIA driver here (libnvidia-ml.so.1 not found): "
                "watching the host's CPU, memory and processes")
    line = line.replace(f", {INSTALL_HINT}", "").replace("; watching the host only", "")
    return f"{line}; watching the host only"
