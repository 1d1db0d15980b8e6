"""A scripted fake NVML for tests and benchmarks: replays real recorded traces through the real pynvml API.

It replaces the functions of the real `pynvml` module (nvidia-ml-py), so `phasescope.sources.nvml` runs its
own code path unchanged. Each fake GPU replays one `Trace` (read from ../shared/data by the replay readers)
tick by tick, in NVML's native units and real pynvml structs: percent, bytes, mW, MHz, KB/s, mJ, KiB
counters. What it can script:

- NVMLError on chosen calls (per call, per device, from tick N, until tick M): `fail()`;
- a GPU that falls off the bus from tick N (GpuIsLost, or Unknown on every call), for good or until tick M
  (an outage it recovers from): `lose()`;
- a missing library / unloaded driver: `FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)`;
- MIG: a parent with N MIG children, each replaying its own trace: `FakeNvml(mig={0: [trace, trace]})`;
- NotSupported for any signal the trace lacks (the device "does not have" it), NoData for one NaN sample;
- GPU health: ECC counters, remapped rows, PCIe replays, memory temperature (`set_health()`; NotSupported
  until set, as on a consumer GPU), and XID events queued to the event sets registered on a GPU (`xid()`);
- the driver's sample buffers (`nvmlDeviceGetSamples`: total power, GPU and memory utilisation): one sample
  per tick for the last `sample_buffer` ticks, stamped on the trace's clock or on `sample_clock`.

A struct call (utilisation, memory info) is served only when all its fields are known; a static fact the
traces do not record (memory total, power limit, max clocks) comes from the caller or reads NotSupported.
A call this fake does not implement raises RuntimeError, so a test can never silently reach a real driver.

Use with pytest: the `fake_nvml` fixture returns a factory `fake_nvml(traces, **options) -> FakeNvml`,
installed for the test. Without pytest: `with FakeNvml(traces).installed(): ...`.
"""

from __future__ import annotations

import contextlib
import ctypes
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pynvml

try:  # the benchmarks import this module without pytest
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

from phasescope.schema import MHZ, Trace

_NAMESPACE = uuidlib.UUID("6f1c2b1e-3d0a-4c8e-9f57-70686173650a")
N_NVLINKS = 18  # per-link share served for a scopeId other than UINT_MAX (H100/H200 have 18 links)
_UINT_MAX = 0xFFFFFFFF

# Every pynvml function this fake serves; anything else raises RuntimeError.
PATCHED = (
    "nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetIndex", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetFieldValues", "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieReplayCounter",
    "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlEventSetFree",
    "nvmlDeviceGetSamples", "nvmlDeviceGetPciInfo",
)
_ERROR_TYPES = {pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected"}
_ECC_SCOPES = {pynvml.NVML_VOLATILE_ECC: "volatile", pynvml.NVML_AGGREGATE_ECC: "aggregate"}
# nvmlDeviceGetSamples: sampling type -> (signal, factor from base units to NVML's: W -> mW, ratio -> %)
_SAMPLE_SIGNAL = {
    pynvml.NVML_TOTAL_POWER_SAMPLES: ("power", 1000.0),
    pynvml.NVML_GPU_UTILIZATION_SAMPLES: ("gpu_util", 100.0),
    pynvml.NVML_MEMORY_UTILIZATION_SAMPLES: ("mem_util", 100.0),
}
_GPM_SIGNAL = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active",
}


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeProcess:
    """A process on a fake GPU: PID, GPU memory in bytes, SM utilisation in percent (None: not sampled)."""

    pid: int
    used_bytes: int | None
    sm_util_pct: int | None = None
    from_tick: int = 0
    until_tick: int | None = None


@dataclass
class FakeHealth:
    """A GPU's health counters as NVML reports them; None: the GPU does not offer it (NotSupported)."""

    ecc: dict[tuple[str, str], int] | None = None  # ("corrected"|"uncorrected", "volatile"|"aggregate") -> n
    remapped_rows: tuple[int, int, int, int] | None = None  # correctable, uncorrectable, pending, failure
    pcie_replays: int | None = None
    mem_temp_c: int | None = None  # NVML_FI_DEV_MEMORY_TEMP


@dataclass(eq=False)
class _EventSet:
    """What nvmlEventSetCreate returns: the GPUs registered on it and the events queued for it."""

    gpus: set[Any] = field(default_factory=set)
    queue: list[tuple[int, int]] = field(default_factory=list)  # (xid, gpu instance id)
    freed: bool = False


@dataclass
class _Rule:
    call: str
    code: int
    device: int | str | None
    from_tick: int
    until_tick: int | None


@dataclass(eq=False)
class FakeGpu:
    """One fake device (a physical GPU or a MIG instance) replaying one trace."""

    trace: Trace
    uuid: str
    name: str
    index: int
    parent: FakeGpu | None = None
    gpu_instance_id: int = 0
    children: list[FakeGpu] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)
    mem_total: int | None = None
    power_limit_mw: int | None = None
    max_clocks_mhz: tuple[int, int] | None = None
    throttle_reasons: int | None = None
    lost_from: int | None = None
    lost_code: int = pynvml.NVML_ERROR_GPU_IS_LOST
    lost_until: int | None = None  # the first tick it answers again; None: never
    cols: dict[str, list[float]] = field(default_factory=dict)  # present signals, base units, as lists
    times: list[float] = field(default_factory=list)
    energy_mj: list[float] | None = None
    nvlink_kib: tuple[list[float], list[float]] | None = None  # cumulative TX, RX counters
    health: FakeHealth = field(default_factory=FakeHealth)

    def __hash__(self) -> int:
        return id(self)


class _Handle:
    """What nvmlDeviceGetHandleByIndex returns: opaque to the caller, like a real nvmlDevice_t."""

    __slots__ = ("gpu",)

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


class FakeNvml:
    """Replays `traces` (one per physical GPU) as NVML devices. Advance time with `advance()` / `tick`."""

    def __init__(
        self,
        traces: Sequence[Trace],
        *,
        mig: Mapping[int, Sequence[Trace]] | None = None,
        processes: Mapping[int, Sequence[FakeProcess]] | None = None,
        mem_total_bytes: float | None = None,
        power_limit_w: float | None = None,
        max_clocks_mhz: tuple[int, int] | None = None,
        throttle_reasons: int | None = None,
        energy_from_power: bool = False,
        process_util: bool = True,
        init_error: int | None = None,
        driver_version: str = "fake-580.95.05",
        loop: bool = True,
        sample_clock: tuple[float, float] | None = None,
        sample_buffer: int = 120,
    ) -> None:
        self.tick = 0
        # nvmlDeviceGetSamples: tick k's sample is stamped epoch + k * period (Unix s) when `sample_clock` is
        # (epoch, period), else at the replayed trace's clock; the buffer keeps the last `sample_buffer`
        # ticks.
        self.sample_clock = sample_clock
        self.sample_buffer = sample_buffer
        self.loop = loop
        self.init_error = init_error
        self.driver_version = driver_version
        self.process_util = process_util
        self.initialized = 0
        self.calls: Counter[str] = Counter()
        self.rules: list[_Rule] = []
        self._gpm_samples: dict[int, tuple[FakeGpu | None, int, Any]] = {}
        self.event_sets: list[_EventSet] = []
        seen: set[str] = set()
        self.gpus: list[FakeGpu] = []
        for i, trace in enumerate(traces):
            gpu = self._make(trace, i, None, 0, seen, "GPU")
            gpu.mem_total = None if mem_total_bytes is None else int(mem_total_bytes)
            gpu.power_limit_mw = None if power_limit_w is None else round(power_limit_w * 1000)
            gpu.max_clocks_mhz = max_clocks_mhz
            gpu.throttle_reasons = throttle_reasons
            if energy_from_power and gpu.energy_mj is None and "power" in gpu.cols:
                gpu.energy_mj = _integrate(gpu.times, gpu.cols["power"], 1000.0)
            gpu.processes = list((processes or {}).get(i, ()))
            self.gpus.append(gpu)
        for parent_index, child_traces in (mig or {}).items():
            parent = self.gpus[parent_index]
            for slot, child_trace in enumerate(child_traces):
                child = self._make(child_trace, parent.index, parent, slot + 1, seen, "MIG")
                child.mem_total = parent.mem_total  # the caller's total applies where a trace lacks one
                parent.children.append(child)

    def _make(
        self, trace: Trace, index: int, parent: FakeGpu | None, gi: int, seen: set[str], kind: str
    ) -> FakeGpu:
        uid = trace.device.uuid if kind == "GPU" else ""
        if not uid or uid in seen or not uid.startswith("GPU-"):
            # Several fake GPUs may replay the same recording: give each its own, stable UUID.
            uid = f"{kind}-{uuidlib.uuid5(_NAMESPACE, f'{trace.device.uuid}/{index}/{gi}/{len(seen)}')}"
        seen.add(uid)
        gpu = FakeGpu(trace=trace, uuid=uid, name=trace.device.name or "NVIDIA fake replay", index=index,
                      parent=parent, gpu_instance_id=gi)
        gpu.times = trace.time.tolist()
        for name in trace.present_signals():
            gpu.cols[name] = trace[name].tolist()
        if "energy" in gpu.cols:
            gpu.energy_mj = [v * 1000.0 for v in gpu.cols["energy"]]
        if "nvlink_tx" in gpu.cols and "nvlink_rx" in gpu.cols:
            gpu.nvlink_kib = (_integrate(gpu.times, gpu.cols["nvlink_tx"], 1 / 1024),
                              _integrate(gpu.times, gpu.cols["nvlink_rx"], 1 / 1024))
        return gpu

    # ---- scripting ---------------------------------------------------------------------------------

    def advance(self, n: int = 1) -> None:
        self.tick += n

    def fail(self, call: str, code: int = pynvml.NVML_ERROR_UNKNOWN, device: int | str | None = None,
             from_tick: int = 0, until_tick: int | None = None) -> None:
        """Make `call` raise NVMLError(code) on `device` (index or UUID; None = all) for ticks in range."""
        self.rules.append(_Rule(call, code, device, from_tick, until_tick))

    def lose(self, device: int, from_tick: int = 0, code: int = pynvml.NVML_ERROR_GPU_IS_LOST,
             until_tick: int | None = None) -> None:
        """From `from_tick` (until `until_tick`, if given), every call on this GPU (and its MIG instances)
        raises `code`."""
        self.gpus[device].lost_from = from_tick
        self.gpus[device].lost_code = code
        self.gpus[device].lost_until = until_tick

    def _is_lost(self, gpu: FakeGpu) -> bool:
        return gpu.lost_from is not None and self.tick >= gpu.lost_from and (
            gpu.lost_until is None or self.tick < gpu.lost_until)

    def set_health(self, device: int, **counters: Any) -> None:
        """Set a GPU's health counters (FakeHealth fields; None = NotSupported) from now on."""
        gpu = self.gpus[device]
        for name, value in counters.items():
            if not hasattr(gpu.health, name):
                raise TypeError(f"fake NVML: no health counter {name!r}")
            setattr(gpu.health, name, dict(value) if isinstance(value, dict) else value)

    def xid(self, device: int, code: int, gpu_instance_id: int = 0xFFFFFFFF) -> None:
        """An XID error on GPU `device`: queued for every live event set it is registered on."""
        gpu = self.gpus[device]
        for evset in self.event_sets:
            if gpu in evset.gpus and not evset.freed:
                evset.queue.append((code, gpu_instance_id))

    def all_devices(self) -> list[FakeGpu]:
        return [d for g in self.gpus for d in (g, *g.children)]

    # ---- replay helpers ----------------------------------------------------------------------------

    def _row(self, gpu: FakeGpu) -> tuple[int, int]:
        n = len(gpu.times)
        if n == 0:
            raise nvml_error(pynvml.NVML_ERROR_NO_DATA)
        if self.loop:
            return self.tick % n, self.tick // n
        return min(self.tick, n - 1), 0

    def time_s(self, gpu: FakeGpu) -> float:
        """The replayed trace's clock at the current tick, continuing smoothly across loops."""
        row, wraps = self._row(gpu)
        t = gpu.times
        period = (t[-1] - t[0]) + (t[1] - t[0] if len(t) > 1 else 1.0)
        return t[row] + wraps * period

    def value(self, gpu: FakeGpu, signal: str) -> float:
        """Base-unit value of `signal` now; NotSupported if the trace lacks it, NoData if NaN at this tick."""
        col = gpu.cols.get(signal)
        if col is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        v = col[self._row(gpu)[0]]
        if v != v:
            raise nvml_error(pynvml.NVML_ERROR_NO_DATA)
        return v

    def _counter(self, gpu: FakeGpu, series: list[float]) -> float:
        row, wraps = self._row(gpu)
        return series[row] + wraps * series[-1]

    def _enter(self, call: str, handle: Any) -> FakeGpu:
        """Bookkeeping and fault injection shared by every per-device call."""
        self.calls[call] += 1
        if not self.initialized:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Handle):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = handle.gpu
        phys = gpu.parent or gpu
        if self._is_lost(phys):
            raise nvml_error(phys.lost_code)
        for rule in self.rules:
            if rule.call == call and self.tick >= rule.from_tick and (
                    rule.until_tick is None or self.tick < rule.until_tick) and (
                    rule.device is None or rule.device in (gpu.index, gpu.uuid)):
                raise nvml_error(rule.code)
        return gpu

    def _global(self, call: str) -> None:
        self.calls[call] += 1
        if not self.initialized:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        for rule in self.rules:  # a rule on a call that takes no device applies with device=None only
            if rule.call == call and rule.device is None and self.tick >= rule.from_tick and (
                    rule.until_tick is None or self.tick < rule.until_tick):
                raise nvml_error(rule.code)

    # ---- the NVML API ------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._global("nvmlShutdown")
        self.initialized -= 1

    def nvmlErrorString(self, code: int) -> str:
        return f"NVML error {code}"

    def nvmlSystemGetDriverVersion(self) -> str:
        self._global("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._global("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._global("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if self._is_lost(gpu):
            raise nvml_error(gpu.lost_code)
        return _Handle(gpu)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        """A made-up PCI address per board (bus 0x10 + index), as pynvml's struct gives it (str)."""
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=f"00000000:{0x10 + gpu.index:02X}:00.0")

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._enter("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._enter("nvmlDeviceGetMigMode", handle)
        if gpu.parent is not None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.children else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if gpu.children else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _Handle:
        gpu = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(gpu.children):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(gpu.children[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        gpu = self._enter("nvmlDeviceGetGpuInstanceId", handle)
        if gpu.parent is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.gpu_instance_id

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        if gpu.children or gpu.parent is not None:  # not available per GPU in MIG mode, as on real devices
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=round(self.value(gpu, "gpu_util") * 100),
                                          memory=round(self.value(gpu, "mem_util") * 100))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        used = round(self.value(gpu, "mem_used"))
        total = round(self.value(gpu, "mem_total")) if "mem_total" in gpu.cols else gpu.mem_total
        if total is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlMemory_t(total=total, free=max(total - used, 0), used=used)

    def _phys_only(self, call: str, handle: Any) -> FakeGpu:
        gpu = self._enter(call, handle)
        if gpu.parent is not None:  # board-level readings are not offered per MIG instance
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._phys_only("nvmlDeviceGetPowerUsage", handle)
        return round(self.value(gpu, "power") * 1000)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._phys_only("nvmlDeviceGetTemperature", handle)
        return round(self.value(gpu, "temperature"))

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._phys_only("nvmlDeviceGetClockInfo", handle)
        signal = {pynvml.NVML_CLOCK_SM: "sm_clock", pynvml.NVML_CLOCK_MEM: "mem_clock"}.get(clock)
        if signal is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(self.value(gpu, signal) / MHZ)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._phys_only("nvmlDeviceGetMaxClockInfo", handle)
        if gpu.max_clocks_mhz is None or clock not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_clocks_mhz[0 if clock == pynvml.NVML_CLOCK_SM else 1]

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu = self._phys_only("nvmlDeviceGetPcieThroughput", handle)
        signal = "pcie_tx" if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else "pcie_rx"
        return round(self.value(gpu, signal) / 1000.0)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._phys_only("nvmlDeviceGetTotalEnergyConsumption", handle)
        if gpu.energy_mj is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(self._counter(gpu, gpu.energy_mj))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        gpu = self._phys_only("nvmlDeviceGetEnforcedPowerLimit", handle)
        if "power_limit" in gpu.cols:
            return round(self.value(gpu, "power_limit") * 1000)
        if gpu.power_limit_mw is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.power_limit_mw

    def _reasons(self, call: str, handle: Any) -> int:
        gpu = self._phys_only(call, handle)
        if "throttle_reasons" in gpu.cols:
            return int(self.value(gpu, "throttle_reasons"))
        if gpu.throttle_reasons is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.throttle_reasons

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._reasons("nvmlDeviceGetCurrentClocksEventReasons", handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._reasons("nvmlDeviceGetCurrentClocksThrottleReasons", handle)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[Any]) -> Any:
        gpu = self._enter("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        t_us = round(self.time_s(gpu) * 1e6)
        for i, fid in enumerate(field_ids):
            field_id, scope = fid if isinstance(fid, tuple) else (fid, 0)
            v = values[i]
            v.fieldId, v.scopeId, v.timestamp = field_id, scope, t_us
            v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            series = None
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                if gpu.parent is None and gpu.health.mem_temp_c is not None:
                    v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                    v.value.uiVal = gpu.health.mem_temp_c
                    v.nvmlReturn = pynvml.NVML_SUCCESS
                else:
                    v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            if gpu.nvlink_kib is not None and gpu.parent is None:
                if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                    series = gpu.nvlink_kib[0]
                elif field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                    series = gpu.nvlink_kib[1]
            if series is None:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            total = self._counter(gpu, series)
            # UINT_MAX asks for the sum over all links; a link id gets that link's share only.
            v.value.ullVal = round(total if scope == _UINT_MAX else total / N_NVLINKS)
            v.nvmlReturn = pynvml.NVML_SUCCESS
        return values

    # GPM: each sample buffer is a real c_nvmlGpmSample_t pointer; the fake keys its state by address.
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._enter("nvmlGpmQueryDeviceSupport", handle)
        has = any(s in gpu.cols for s in _GPM_SIGNAL.values()) or any(
            s in c.cols for c in gpu.children for s in _GPM_SIGNAL.values())
        out = pynvml.c_nvmlGpmSupport_t()
        out.version = pynvml.NVML_GPM_SUPPORT_VERSION
        out.isSupportedDevice = int(has)
        return out

    def nvmlGpmSampleAlloc(self) -> Any:
        self._global("nvmlGpmSampleAlloc")
        buf = ctypes.create_string_buffer(16)
        ptr = ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)
        self._gpm_samples[ctypes.addressof(buf)] = (None, -1, buf)
        return ptr

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._global("nvmlGpmSampleFree")
        self._gpm_samples.pop(_address(sample), None)

    def _gpm_record(self, gpu: FakeGpu, sample: Any) -> Any:
        addr = _address(sample)
        if addr not in self._gpm_samples:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_samples[addr] = (gpu, self.tick, self._gpm_samples[addr][2])
        return sample

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._enter("nvmlGpmSampleGet", handle)
        if gpu.children:  # in MIG mode the whole-GPU sample is refused; use nvmlGpmMigSampleGet
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpm_record(gpu, sample)

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        parent = self._enter("nvmlGpmMigSampleGet", handle)
        child = next((c for c in parent.children if c.gpu_instance_id == gpu_instance_id), None)
        if child is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpm_record(child, sample)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._global("nvmlGpmMetricsGet")
        first = self._gpm_samples.get(_address(request.sample1))
        second = self._gpm_samples.get(_address(request.sample2))
        if first is None or second is None or first[0] is None or first[0] is not second[0]:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, t1, t2 = second[0], first[1], second[1]
        if t2 <= t1:  # sample1 must be the older one
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        saved = self.tick
        try:
            self.tick = t2  # the metric over (t1, t2] is what the trace recorded at t2
            for i in range(request.numMetrics):
                m = request.metrics[i]
                signal = _GPM_SIGNAL.get(m.metricId)
                try:
                    if signal is None:
                        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
                    m.value = self.value(gpu, signal) * 100.0
                    m.nvmlReturn = pynvml.NVML_SUCCESS
                except pynvml.NVMLError as exc:
                    m.nvmlReturn = exc.value
        finally:
            self.tick = saved
        return request

    def _live_processes(self, gpu: FakeGpu) -> list[FakeProcess]:
        return [p for p in gpu.processes
                if p.from_tick <= self.tick and (p.until_tick is None or self.tick < p.until_tick)]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        out = []
        for p in self._live_processes(gpu):
            out.append(pynvml.nvmlFriendlyObject({
                "pid": p.pid, "usedGpuMemory": p.used_bytes,
                "gpuInstanceId": gpu.gpu_instance_id if gpu.parent else 0xFFFFFFFF,
                "computeInstanceId": 0 if gpu.parent else 0xFFFFFFFF}))
        return out

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return []

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list[Any]:
        gpu = self._enter("nvmlDeviceGetProcessUtilization", handle)
        if not self.process_util or gpu.parent is not None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        t_us = round(self.time_s(gpu) * 1e6)
        samples = [pynvml.c_nvmlProcessUtilizationSample_t(pid=p.pid, timeStamp=t_us, smUtil=p.sm_util_pct,
                                                           memUtil=0, encUtil=0, decUtil=0)
                   for p in self._live_processes(gpu) if p.sm_util_pct is not None and t_us > last_seen_us]
        if not samples:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)  # what NVML says when nothing is newer
        return samples

    # Health: board-level, so NotSupported on a MIG instance, as the board readings above.
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._phys_only("nvmlDeviceGetTotalEccErrors", handle)
        if gpu.health.ecc is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if error_type not in _ERROR_TYPES or counter_type not in _ECC_SCOPES:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.health.ecc.get((_ERROR_TYPES[error_type], _ECC_SCOPES[counter_type]), 0)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        gpu = self._phys_only("nvmlDeviceGetRemappedRows", handle)
        if gpu.health.remapped_rows is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.health.remapped_rows

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        gpu = self._phys_only("nvmlDeviceGetPcieReplayCounter", handle)
        if gpu.health.pcie_replays is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.health.pcie_replays

    def nvmlEventSetCreate(self) -> _EventSet:
        self._global("nvmlEventSetCreate")
        evset = _EventSet()
        self.event_sets.append(evset)
        return evset

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, evset: Any) -> None:
        gpu = self._phys_only("nvmlDeviceRegisterEvents", handle)
        if not isinstance(evset, _EventSet) or evset.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if event_types & ~pynvml.nvmlEventTypeXidCriticalError:  # only XIDs are scripted
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        evset.gpus.add(gpu)

    def nvmlEventSetWait_v2(self, evset: Any, timeout_ms: int) -> Any:
        self._global("nvmlEventSetWait_v2")
        if not isinstance(evset, _EventSet) or evset.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if timeout_ms != 0:  # a test must never block: the source polls
            raise RuntimeError("fake NVML: nvmlEventSetWait_v2 with a timeout would block")
        if not evset.queue:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        xid, gi = evset.queue.pop(0)
        return pynvml.c_nvmlEventData_t(eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid,
                                        gpuInstanceId=gi, computeInstanceId=0xFFFFFFFF)

    def nvmlDeviceGetSamples(self, handle: Any, sampling_type: int,
                             last_seen_us: int) -> tuple[int, list[Any]]:
        """The driver's buffer: one sample per tick for the last `sample_buffer` ticks up to now, in NVML's
        units (mW, percent) as unsigned ints, only those stamped after `last_seen_us`; NotFound when none is.
        A signal the trace lacks is NotSupported; a NaN tick has no sample. Board-level, so not per MIG
        instance; utilisation not in MIG mode either (as nvmlDeviceGetUtilizationRates)."""
        gpu = self._phys_only("nvmlDeviceGetSamples", handle)
        spec = _SAMPLE_SIGNAL.get(sampling_type)
        if spec is None or spec[0] not in gpu.cols or (gpu.children and spec[0] != "power"):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        signal, scale = spec
        out: list[Any] = []
        now = self.tick
        try:
            # Newest first, stopping at the first one already seen (stamps grow with the tick), so a poll
            # costs the fake the new samples, not the whole buffer, as the driver's copy does.
            for k in range(now, max(0, now - self.sample_buffer + 1) - 1, -1):
                self.tick = k
                if self.sample_clock is not None:
                    t_us = round((self.sample_clock[0] + k * self.sample_clock[1]) * 1e6)
                else:
                    t_us = round(self.time_s(gpu) * 1e6)
                if t_us <= last_seen_us:
                    break
                try:
                    v = self.value(gpu, signal)
                except pynvml.NVMLError:
                    continue
                out.append(pynvml.c_nvmlSample_t(timeStamp=t_us,
                                                 sampleValue=pynvml.c_nvmlValue_t(uiVal=round(v * scale))))
        finally:
            self.tick = now
        out.reverse()
        if not out:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlEventSetFree(self, evset: Any) -> None:
        self._global("nvmlEventSetFree")
        if not isinstance(evset, _EventSet) or evset.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        evset.freed = True

    # ---- installation ------------------------------------------------------------------------------

    def _unpatched(self, name: str) -> Any:
        raise RuntimeError(f"fake NVML: {name} is not scripted (add it to tests/fakes/fake_nvml.py)")

    def replacements(self) -> dict[str, Callable[..., Any]]:
        out: dict[str, Callable[..., Any]] = {name: getattr(self, name) for name in PATCHED}
        out["_nvmlGetFunctionPointer"] = self._unpatched
        return out

    @contextlib.contextmanager
    def installed(self) -> Iterator[FakeNvml]:
        """Patch pynvml for the duration of the block (for use outside pytest, e.g. benchmarks)."""
        saved = {name: getattr(pynvml, name) for name in self.replacements()}
        try:
            for name, fn in self.replacements().items():
                setattr(pynvml, name, fn)
            yield self
        finally:
            for name, fn in saved.items():
                setattr(pynvml, name, fn)


def _address(sample: Any) -> int:
    return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)


def _integrate(times: list[float], rates: list[float], scale: float) -> list[float]:
    """Cumulative trapezoid integral of a rate over time (NaN treated as 0), times `scale`."""
    t = np.asarray(times, dtype=np.float64)
    r = np.nan_to_num(np.asarray(rates, dtype=np.float64))
    steps = np.diff(t) * (r[1:] + r[:-1]) / 2.0
    return (np.concatenate([[0.0], np.cumsum(steps)]) * scale).tolist()


if pytest is not None:

    @pytest.fixture
    def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
        """Factory: `fake_nvml(traces, **options)` builds a FakeNvml and patches pynvml for this test."""

        def install(traces: Sequence[Trace], **options: Any) -> FakeNvml:
            fake = FakeNvml(traces, **options)
            for name, fn in fake.replacements().items():
                monkeypatch.setattr(pynvml, name, fn)
            return fake

        return install
