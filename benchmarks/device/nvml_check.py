"""NVML on this driver, call by call: what phasescope's NVML code really gets from a GPU, in under a minute.

    python benchmarks/device/nvml_check.py [--out DIR]          # on a GPU; DIR defaults to $OUT
    python benchmarks/device/nvml_check.py --dry-run --out DIR  # on the CPU, against the fake NVML

Safe to run first on a fresh GPU machine (battery.py runs it first unless --skip-nvml-check). For every NVML
call phasescope makes (sources/nvml.py: setup, the per-tick reads, MIG, processes, GPM, NVLink, GPU health,
XID events) it records supported / NotSupported / error with the exact exception text and NVML code, what
the call returned (type and shape: the ECC answer, the remapped-rows tuple, the memory-temperature field
value, what nvmlEventSetWait_v2(set, 0) does with nothing queued) and its latency (median of a few calls).
Then the pieces as phasescope uses them: NvmlSource.read() over ~20 ticks with health every 10 s and every
tick (their difference is the cost of a health read), unsupported_calls(), error_counts(), static_info();
how often the total-energy counter and the power reading change when polled every 10 ms; and
phasescope.measure windows around a 3 s sleep and a 3 s torch matmul load (when torch has CUDA), each
compared with the counter and the power polled every 10 ms over the same window.

Every check is wrapped: a failure is recorded with its exception text and the next check runs. The report is
rewritten after every section, and a watchdog ends the run after --timeout-s (exit 3), so a driver call that
hangs keeps what was done. Exit 0 when every section ran (a NotSupported call is a finding, not a failure),
1 when a section failed.

Output: DIR/nvml_check.json (sections: meta, calls, health, xid, gpm, energy_counter, source, monitor,
processes, summary) and a short summary on stdout, also in DIR/nvml_check.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import itertools
import json
import math
import os
import platform
import socket
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "src") not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, str(REPO / "src"))
if str(Path(__file__).resolve().parent) not in sys.path:  # battery's helpers, also when imported by tests
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import pynvml  # noqa: E402
from battery import _dry_run_trace, _finite_json  # noqa: E402

from phasescope.sources import nvml as ps_nvml  # noqa: E402

SECTIONS = ("meta", "calls", "health", "xid", "gpm", "energy_counter", "source", "monitor", "processes")
REPEAT = 5  # calls per probe: the latency is their median
WAIT_EMPTY = "nvmlEventSetWait_v2(set, 0), nothing queued"
_UINT_MAX = 0xFFFFFFFF


class Skip(Exception):
    """A check that does not apply here (no torch with CUDA, no MIG): recorded as skipped, not failed."""


# =============================================================================================
# One call: outcome, value shape, latency.
# =============================================================================================


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def policy(call: str, exc: BaseException) -> str:
    """What phasescope's NvmlSource does with this outcome (sources/nvml.py's error policy)."""
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return "tried once, then skipped on this device"
    if not isinstance(exc, pynvml.NVMLError):
        return "not an NVML error: it would propagate out of NvmlSource"
    code = int(getattr(exc, "value", ps_nvml._UNKNOWN))
    if call.startswith("nvmlEventSetWait") and code == ps_nvml._TIMEOUT:
        return "nothing queued: normal"
    if call.startswith("nvmlDeviceGetProcessUtilization") and code == ps_nvml._NOT_FOUND:
        return "no newer sample: normal"
    if code in ps_nvml._STATIC_FAILURES:
        return "tried once, then skipped on this device"
    if code in ps_nvml._LOST_FAILURES:
        return "marks the GPU lost"
    if code == ps_nvml._UNKNOWN:
        return "counted; Unknown from every call of a tick is an outage: retried, lost after 120 s"
    return "counted, NaN this tick, retried next tick"


def status_of(call: str, exc: BaseException | None) -> str:
    """ok; empty (a supported call with nothing to report, e.g. no XID queued); not_supported; error."""
    if exc is None:
        return "ok"
    if isinstance(exc, pynvml.NVMLError) and exc.value == ps_nvml._NOT_SUPPORTED:
        return "not_supported"
    return "empty" if policy(call, exc).endswith(": normal") else "error"


def describe(value: Any, depth: int = 0) -> Any:
    """Type and shape of what a pynvml call returned, JSON-ready (ctypes structs field by field)."""
    if value is None or isinstance(value, bool | int | float | str):
        return {"type": type(value).__name__, "value": value}
    if isinstance(value, bytes):
        return {"type": "bytes", "value": value.decode(errors="replace")}
    if depth > 3:
        return {"type": type(value).__name__, "repr": repr(value)[:120]}
    if isinstance(value, pynvml.c_nvmlFieldValue_t):
        return field_value(value)
    if isinstance(value, list | tuple | ctypes.Array):
        items = list(value)
        return {"type": type(value).__name__, "len": len(items),
                "items": [describe(v, depth + 1) for v in items[:4]]}
    if isinstance(value, ctypes.Structure | ctypes.Union):
        fields: dict[str, Any] = {}
        for spec in value._fields_:
            name = spec[0]
            v = getattr(value, name)
            if isinstance(v, ctypes._Pointer | ctypes.c_void_p) or type(v).__name__.startswith("LP_"):
                fields[name] = {"type": "pointer"}
            elif isinstance(v, ctypes.Array) and len(v) > 8:
                fields[name] = {"type": type(v).__name__, "len": len(v)}
            else:
                fields[name] = describe(v, depth + 1)
        return {"type": type(value).__name__, "fields": fields}
    if isinstance(value, pynvml.nvmlFriendlyObject):
        return {"type": "nvmlFriendlyObject",
                "fields": {k: describe(v, depth + 1) for k, v in vars(value).items()}}
    return {"type": type(value).__name__, "repr": repr(value)[:120]}


def field_value(fv: Any) -> dict[str, Any]:
    """One c_nvmlFieldValue_t: its return code, value type and the value read from the member that type names
    (as phasescope's _mem_temperature reads it)."""
    ret, vt = int(fv.nvmlReturn), int(fv.valueType)
    member = ps_nvml._FIELD_VALUE.get(vt)
    try:
        ret_text = "Success" if ret == 0 else str(pynvml.NVMLError(ret))
    except Exception as exc:  # nvmlErrorString itself failing must not cost the record
        ret_text = error_text(exc)
    return {"type": "c_nvmlFieldValue_t", "fieldId": int(fv.fieldId), "scopeId": int(fv.scopeId),
            "timestamp_us": int(fv.timestamp), "latencyUsec": int(fv.latencyUsec), "valueType": vt,
            "value_member": member, "nvmlReturn": ret, "nvmlReturn_text": ret_text,
            "value": getattr(fv.value, member) if member and ret == 0 else None}


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None, float]:
    t0 = time.perf_counter()
    try:
        value = fn(*args)
    except Exception as exc:
        return None, exc, (time.perf_counter() - t0) * 1e3
    return value, None, (time.perf_counter() - t0) * 1e3


def outcome(call: str, value: Any, exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        out: dict[str, Any] = {"status": "ok", "value": describe(value)}
        # nvmlDeviceGetFieldValues succeeds as a call and fails per field: judge it by its fields, as
        # phasescope does (a field's NotSupported makes that read unsupported).
        if isinstance(value, ctypes.Array) and len(value) and isinstance(value[0], pynvml.c_nvmlFieldValue_t):
            codes = [int(fv.nvmlReturn) for fv in value if int(fv.nvmlReturn) != 0]
            if codes:
                out["status"] = ("not_supported" if set(codes) == {ps_nvml._NOT_SUPPORTED} else "error")
                out["error"] = f"field nvmlReturn {codes}"
        return out
    code = getattr(exc, "value", None) if isinstance(exc, pynvml.NVMLError) else None
    return {"status": status_of(call, exc), "error": error_text(exc), "code": code,
            "phasescope": policy(call, exc)}


def latency(ms: list[float]) -> dict[str, Any]:
    return {"median_ms": round(statistics.median(ms), 4), "min_ms": round(min(ms), 4),
            "max_ms": round(max(ms), 4), "n": len(ms)} if ms else {}


def probe(call: str, *args: Any, label: str = "", repeat: int = REPEAT) -> dict[str, Any]:
    """Call pynvml.<call>(*args) `repeat` times: the first outcome, the others where they differ, latency."""
    fn = getattr(pynvml, call)
    times: list[float] = []
    first: dict[str, Any] | None = None
    seen: list[str] = []
    for _ in range(repeat):
        value, exc, ms = timed(fn, *args)
        times.append(ms)
        result = outcome(call, value, exc)
        if first is None:
            first = result
        seen.append(result.get("error", "ok"))
    assert first is not None
    out = {"call": label or call, **first, "latency": latency(times)}
    if len(set(seen)) > 1:
        out["outcomes"] = seen  # not the same answer every time: worth knowing
    return out


# =============================================================================================
# The GPUs, as phasescope enumerates them.
# =============================================================================================


@dataclass
class Gpu:
    index: int
    handle: Any
    uuid: str
    mig: list[Mig] = field(default_factory=list)


@dataclass
class Mig:
    slot: int
    handle: Any
    uuid: str
    gpu_instance_id: int | None


class Poller:
    """The energy counter (mJ) and power (mW) of each GPU every `period_s`, inline or in a thread."""

    def __init__(self, gpus: list[Gpu], period_s: float) -> None:
        self.gpus = gpus
        self.period_s = period_s
        self.samples: dict[str, list[tuple[float, float, float]]] = {g.uuid: [] for g in gpus}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        for g in self.gpus:
            t = time.time()
            e = self._read("nvmlDeviceGetTotalEnergyConsumption", g)
            p = self._read("nvmlDeviceGetPowerUsage", g)
            self.samples[g.uuid].append((t, e, p))

    def _read(self, call: str, g: Gpu) -> float:
        try:
            return float(getattr(pynvml, call)(g.handle))
        except Exception as exc:
            self.errors.setdefault(f"{g.uuid}:{call}", error_text(exc))
            return math.nan

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self._stop.is_set():
            self.poll_once()
            time.sleep(self.period_s)

    def __enter__(self) -> Poller:
        self._thread = threading.Thread(target=self.run_for, args=(1e9,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


def counter_steps(samples: list[tuple[float, float, float]]) -> dict[str, Any]:
    """How often the energy counter and the power reading changed between polls, and what they say."""
    t = [s[0] for s in samples]
    if len(t) < 2:
        return {"polls": len(t)}
    period = statistics.median(b - a for a, b in itertools.pairwise(t))
    out: dict[str, Any] = {"polls": len(t), "span_s": t[-1] - t[0], "poll_period_ms": period * 1e3}
    for name, col in (("energy", 1), ("power", 2)):
        pts = [(s[0], s[col]) for s in samples if math.isfinite(s[col])]
        changes = [(b[0], b[1] - a[1]) for a, b in itertools.pairwise(pts) if b[1] != a[1]]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(changes)]
        d: dict[str, Any] = {"finite": len(pts), "changes": len(changes)}
        if gaps:
            d["change_interval_ms"] = {"median": statistics.median(gaps) * 1e3, "min": min(gaps) * 1e3,
                                       "max": max(gaps) * 1e3}
        if name == "energy" and changes:
            d["step_mj_median"] = statistics.median(abs(c[1]) for c in changes)
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            if name == "energy":
                d["mean_power_w"] = (pts[-1][1] - pts[0][1]) / 1e3 / (pts[-1][0] - pts[0][0])
            else:
                d["mean_power_w"] = _trapz(pts) / 1e3 / (pts[-1][0] - pts[0][0])
        out[name] = d
    return out


def _trapz(pts: list[tuple[float, float]]) -> float:
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2.0 for a, b in itertools.pairwise(pts))


def _interp(pts: list[tuple[float, float]], t: float) -> float:
    if t <= pts[0][0]:
        return pts[0][1]
    for a, b in itertools.pairwise(pts):
        if a[0] <= t <= b[0]:
            return a[1] + (b[1] - a[1]) * (t - a[0]) / (b[0] - a[0]) if b[0] > a[0] else b[1]
    return pts[-1][1]


def over_window(samples: list[tuple[float, float, float]], t0: float, t1: float) -> dict[str, Any]:
    """Joules over [t0, t1] from the polled counter and from the polled power (trapezoids, edges
    interpolated), for comparison with what measure() reported."""
    out: dict[str, Any] = {}
    for name, col in (("counter_j", 1), ("power_integral_j", 2)):
        pts = [(s[0], s[col]) for s in samples if math.isfinite(s[col])]
        if len(pts) < 2 or pts[0][0] > t0 + 0.05 or pts[-1][0] < t1 - 0.05:
            out[name] = None  # the polls do not cover the window
            continue
        if name == "counter_j":
            out[name] = (_interp(pts, t1) - _interp(pts, t0)) / 1e3
        else:
            inside = [(t0, _interp(pts, t0)), *[p for p in pts if t0 < p[0] < t1], (t1, _interp(pts, t1))]
            out[name] = _trapz(inside) / 1e3
    out["steps_in_window"] = counter_steps([s for s in samples if t0 <= s[0] <= t1])
    return out


# =============================================================================================
# The run: sections, each wrapped; the report rewritten after each.
# =============================================================================================


@dataclass
class Check:
    out: Path
    dry_run: bool
    window_s: float
    ticks: int
    tick_s: float
    poll_s: float
    use_torch: bool
    report: dict[str, Any] = field(default_factory=dict)
    current: str = ""
    started: float = field(default_factory=time.monotonic)
    fake: Any = None  # the FakeNvml of a dry run, to queue an XID
    gpus: list[Gpu] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    torch_cuda: bool = False  # this process holds a CUDA context (the processes check looks for its PID)

    def section(self, name: str, fn: Callable[[Check], dict[str, Any]]) -> None:
        self.current = name
        t0 = time.perf_counter()
        try:
            entry: dict[str, Any] = {"status": "ok", **fn(self)}
        except Skip as exc:
            entry = {"status": "skipped", "why": str(exc)}
        except Exception as exc:  # one check's failure must not cost the others
            entry = {"status": "failed", "error": error_text(exc),
                     "traceback": traceback.format_exc(limit=-4).splitlines()[-8:]}
        entry["elapsed_s"] = round(time.perf_counter() - t0, 3)
        with self.lock:
            self.report[name] = entry
        self.write()
        why = f": {entry.get('error') or entry.get('why')}" if entry["status"] != "ok" else ""
        print(f"[nvml_check] {name}: {entry['status']} ({entry['elapsed_s']:.1f} s){why}", flush=True)

    def write(self) -> None:
        with self.lock:
            text = json.dumps(_finite_json(self.report), indent=1, default=str)
        tmp = self.out / "nvml_check.json.tmp"
        tmp.write_text(text)
        tmp.replace(self.out / "nvml_check.json")

    def watchdog(self, timeout_s: float) -> None:
        """After timeout_s, record where the run hung, write what was done and end the process."""

        def fire() -> None:
            with self.lock:
                self.report["timed_out"] = {"section": self.current, "after_s": timeout_s}
            self.write()
            print(f"[nvml_check] TIMED OUT after {timeout_s:g} s in section {self.current!r}", flush=True)
            os._exit(3)

        timer = threading.Timer(timeout_s, fire)
        timer.daemon = True
        timer.start()


def check_meta(c: Check) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def pkg(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    meta: dict[str, Any] = {
        "host": socket.gethostname(), "dry_run": c.dry_run, "python": platform.python_version(),
        "nvidia_ml_py": pkg("nvidia-ml-py"), "torch": pkg("torch"), "euid": os.geteuid(), "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "started_utc": time.time(),
        "kernel": platform.release(),
    }
    ok, line = ps_nvml.nvml_available()
    meta["nvml_available"] = {"ok": ok, "line": line}
    value, exc, ms = timed(pynvml.nvmlInit)  # held until the end: every later section reuses it
    meta["nvmlInit"] = {**outcome("nvmlInit", value, exc), "latency_ms": ms}
    if exc is not None:
        raise RuntimeError(f"nvmlInit failed: {error_text(exc)}")
    for call in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion"):
        value, exc, _ = timed(getattr(pynvml, call))  # the last two are context: phasescope does not call
        meta[call] = value if exc is None else error_text(exc)
    return meta


def _enumerate(c: Check) -> dict[str, Any]:
    """The GPUs and their MIG instances, as NvmlSource._enumerate finds them, with each call probed."""
    calls: dict[str, Any] = {}
    count, exc, ms = timed(pynvml.nvmlDeviceGetCount)
    calls["nvmlDeviceGetCount"] = {**outcome("nvmlDeviceGetCount", count, exc), "latency": latency([ms])}
    if exc is not None:
        return calls
    for i in range(int(count)):
        calls[f"nvmlDeviceGetHandleByIndex({i})"] = probe("nvmlDeviceGetHandleByIndex", i)
        handle, exc, _ = timed(pynvml.nvmlDeviceGetHandleByIndex, i)
        uuid, exc2, _ = (None, exc, 0.0) if exc else timed(pynvml.nvmlDeviceGetUUID, handle)
        if exc2 is not None:
            continue
        gpu = Gpu(i, handle, str(uuid))
        c.gpus.append(gpu)
        mode, exc, _ = timed(pynvml.nvmlDeviceGetMigMode, handle)
        if exc is None and int(mode[0]) == ps_nvml._NVML_DEVICE_MIG_ENABLE:
            slots, exc, _ = timed(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
            for slot in range(int(slots or 0)):
                mh, exc, _ = timed(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
                if exc is not None:
                    continue  # an empty slot answers NotFound: normal
                muuid, _, _ = timed(pynvml.nvmlDeviceGetUUID, mh)
                gi, exc, _ = timed(pynvml.nvmlDeviceGetGpuInstanceId, mh)
                gpu.mig.append(Mig(slot, mh, str(muuid), None if exc else int(gi)))
    return calls


def _tick_calls(h: Any) -> dict[str, dict[str, Any]]:
    """NvmlSource._read_signals's calls on one device (NVLink field values included)."""
    probes = [
        probe("nvmlDeviceGetUtilizationRates", h),
        probe("nvmlDeviceGetMemoryInfo", h),
        probe("nvmlDeviceGetPowerUsage", h),
        probe("nvmlDeviceGetTemperature", h, ps_nvml._NVML_TEMPERATURE_GPU),
        probe("nvmlDeviceGetClockInfo", h, ps_nvml._NVML_CLOCK_SM, label="nvmlDeviceGetClockInfo(SM)"),
        probe("nvmlDeviceGetClockInfo", h, ps_nvml._NVML_CLOCK_MEM, label="nvmlDeviceGetClockInfo(MEM)"),
        probe("nvmlDeviceGetPcieThroughput", h, ps_nvml._NVML_PCIE_TX,
              label="nvmlDeviceGetPcieThroughput(TX)"),
        probe("nvmlDeviceGetPcieThroughput", h, ps_nvml._NVML_PCIE_RX,
              label="nvmlDeviceGetPcieThroughput(RX)"),
        probe("nvmlDeviceGetTotalEnergyConsumption", h),
        probe("nvmlDeviceGetEnforcedPowerLimit", h),
        probe("nvmlDeviceGetCurrentClocksEventReasons", h),
        probe("nvmlDeviceGetCurrentClocksThrottleReasons", h),
        probe("nvmlDeviceGetFieldValues", h, [(ps_nvml._FI_NVLINK_DATA_TX, _UINT_MAX),
                                              (ps_nvml._FI_NVLINK_DATA_RX, _UINT_MAX)],
              label="nvmlDeviceGetFieldValues(nvlink)"),
        probe("nvmlDeviceGetComputeRunningProcesses", h),
        probe("nvmlDeviceGetGraphicsRunningProcesses", h),
        probe("nvmlDeviceGetProcessUtilization", h, 0),
    ]
    return {p["call"]: p for p in probes}


def _setup_calls(h: Any) -> dict[str, dict[str, Any]]:
    """NvmlSource._make_device's calls (static facts), once per device."""
    probes = [
        probe("nvmlDeviceGetUUID", h), probe("nvmlDeviceGetName", h), probe("nvmlDeviceGetMigMode", h),
        probe("nvmlDeviceGetMaxClockInfo", h, ps_nvml._NVML_CLOCK_SM,
              label="nvmlDeviceGetMaxClockInfo(SM)"),
        probe("nvmlDeviceGetMaxClockInfo", h, ps_nvml._NVML_CLOCK_MEM,
              label="nvmlDeviceGetMaxClockInfo(MEM)"),
    ]
    return {p["call"]: p for p in probes}


def check_calls(c: Check) -> dict[str, Any]:
    out: dict[str, Any] = {"enumerate": _enumerate(c), "devices": {}}
    if not c.gpus:
        raise RuntimeError("NVML lists no GPU")
    for g in c.gpus:
        out["devices"][f"GPU {g.index}"] = {"uuid": g.uuid, "kind": "gpu", "mig_instances": len(g.mig),
                                            "calls": {**_setup_calls(g.handle), **_tick_calls(g.handle)}}
        if g.mig:
            out["devices"][f"GPU {g.index}"]["calls"]["nvmlDeviceGetMaxMigDeviceCount"] = probe(
                "nvmlDeviceGetMaxMigDeviceCount", g.handle)
        for m in g.mig:
            calls = {**_setup_calls(m.handle), **_tick_calls(m.handle),
                     "nvmlDeviceGetGpuInstanceId": probe("nvmlDeviceGetGpuInstanceId", m.handle)}
            out["devices"][f"GPU {g.index} MIG {m.slot}"] = {
                "uuid": m.uuid, "kind": "mig", "gpu_instance_id": m.gpu_instance_id, "calls": calls}
    return out


def check_health(c: Check) -> dict[str, Any]:
    """NvmlSource._read_health's 7 calls per physical GPU, and what phasescope makes of each answer."""
    out: dict[str, Any] = {}
    for g in _need_gpus(c):
        h = g.handle
        calls: dict[str, Any] = {}
        for kind, kind_id in ps_nvml._MEMORY_ERROR_TYPES:
            for scope, scope_id in ps_nvml._ECC_COUNTERS:
                label = f"nvmlDeviceGetTotalEccErrors({kind},{scope})"
                calls[label] = probe("nvmlDeviceGetTotalEccErrors", h, kind_id, scope_id, label=label)
        calls["nvmlDeviceGetRemappedRows"] = probe("nvmlDeviceGetRemappedRows", h)
        calls["nvmlDeviceGetPcieReplayCounter"] = probe("nvmlDeviceGetPcieReplayCounter", h)
        mt = probe("nvmlDeviceGetFieldValues", h, [ps_nvml._FI_DEV_MEMORY_TEMP],
                   label="nvmlDeviceGetFieldValues(memtemp)")
        calls[mt["call"]] = mt
        # phasescope's reading of the field: 0 (no sensor, GDDR) is unknown, not 0 C.
        item = (mt.get("value") or {}).get("items", [{}])[0] if mt["status"] == "ok" else {}
        v = item.get("value")
        mt["phasescope_reads_c"] = float(v) if isinstance(v, int | float) and v > 0 else None
        per_read = sum(p["latency"].get("median_ms", 0.0) for p in calls.values())
        out[f"GPU {g.index}"] = {"uuid": g.uuid, "calls": calls, "health_read_ms": per_read}
    return out


def check_xid(c: Check) -> dict[str, Any]:
    """One event set per GPU as NvmlSource._setup_xid_events makes it, and the non-blocking drain it does
    every tick (nvmlEventSetWait_v2 with timeout 0) with nothing queued."""
    out: dict[str, Any] = {}
    for g in _need_gpus(c):
        d: dict[str, Any] = {"uuid": g.uuid}
        out[f"GPU {g.index}"] = d
        evset, exc, ms = timed(pynvml.nvmlEventSetCreate)
        d["nvmlEventSetCreate"] = {**outcome("nvmlEventSetCreate", evset, exc), "latency_ms": ms}
        if exc is not None:
            continue
        try:
            value, exc, ms = timed(pynvml.nvmlDeviceRegisterEvents, g.handle, ps_nvml._EVENT_XID, evset)
            d["nvmlDeviceRegisterEvents(xid)"] = {**outcome("nvmlDeviceRegisterEvents", value, exc),
                                                  "latency_ms": ms}
            if exc is not None:
                continue
            d[WAIT_EMPTY] = probe("nvmlEventSetWait_v2", evset, 0, repeat=10)
            if c.fake is not None:  # dry run: what a queued XID reads back as
                c.fake.xid(g.index, 48)
                d["nvmlEventSetWait_v2(set, 0), one XID queued (fake)"] = probe(
                    "nvmlEventSetWait_v2", evset, 0, repeat=1)
        finally:
            value, exc, ms = timed(pynvml.nvmlEventSetFree, evset)
            d["nvmlEventSetFree"] = {**outcome("nvmlEventSetFree", value, exc), "latency_ms": ms}
    return out


def check_gpm(c: Check) -> dict[str, Any]:
    """GPM as NvmlSource reads it: support query, two samples ~0.1 s apart, the metrics between them."""
    out: dict[str, Any] = {}
    for g in _need_gpus(c):
        d: dict[str, Any] = {"uuid": g.uuid, "nvmlGpmQueryDeviceSupport": probe("nvmlGpmQueryDeviceSupport",
                                                                                g.handle, repeat=1)}
        out[f"GPU {g.index}"] = d
        support, exc, _ = timed(pynvml.nvmlGpmQueryDeviceSupport, g.handle)
        if exc is not None or not int(support.isSupportedDevice):
            d["supported"] = False
            continue
        d["supported"] = True
        targets = [("GPU", None)] + [(f"MIG {m.slot}", m.gpu_instance_id) for m in g.mig]
        for name, gi in targets:
            d[name] = _gpm_pair(g.handle, gi)
    return out


def _gpm_pair(handle: Any, gi: int | None) -> dict[str, Any]:
    samples = []
    d: dict[str, Any] = {}
    try:
        for _ in range(2):
            s, exc, ms = timed(pynvml.nvmlGpmSampleAlloc)
            d.setdefault("nvmlGpmSampleAlloc", {**outcome("nvmlGpmSampleAlloc", s, exc), "latency_ms": ms})
            if exc is not None:
                return d
            samples.append(s)
        get_ms: list[float] = []
        metrics_ms: list[float] = []
        call = "nvmlGpmSampleGet" if gi is None else "nvmlGpmMigSampleGet"
        for rnd in range(3):  # three rounds: sample, wait a tick, sample, metrics (as three source ticks)
            prev, cur = samples[rnd % 2], samples[(rnd + 1) % 2]
            for s in (prev, cur) if rnd == 0 else (cur,):
                args = (handle, s) if gi is None else (handle, gi, s)
                _, exc, ms = timed(getattr(pynvml, call), *args)
                get_ms.append(ms)
                if exc is not None:
                    d[call] = outcome(call, None, exc)
                    return d
                if rnd == 0 and s is prev:
                    time.sleep(0.12)  # a 10 Hz tick apart
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(ps_nvml._GPM_METRICS)
            req.sample1, req.sample2 = prev, cur
            for i, (metric_id, _) in enumerate(ps_nvml._GPM_METRICS):
                req.metrics[i].metricId = metric_id
            _, exc, ms = timed(pynvml.nvmlGpmMetricsGet, req)
            metrics_ms.append(ms)
            if exc is not None:
                d["nvmlGpmMetricsGet"] = outcome("nvmlGpmMetricsGet", None, exc)
                return d
            d["metrics"] = [{"metricId": mid, "signal": sig, "nvmlReturn": int(req.metrics[i].nvmlReturn),
                             "value": float(req.metrics[i].value)}
                            for i, (mid, sig) in enumerate(ps_nvml._GPM_METRICS)]
            time.sleep(0.12)
        d[call] = {"status": "ok", "latency": latency(get_ms)}
        d["nvmlGpmMetricsGet"] = {"status": "ok", "latency": latency(metrics_ms)}
        # Two samples back to back (two source ticks closer than NVML's sampling): phasescope takes an
        # InvalidArgument from nvmlGpmMetricsGet as permanent and stops reading GPM on that device.
        for s in samples:
            timed(getattr(pynvml, call), *((handle, s) if gi is None else (handle, gi, s)))
        req.sample1, req.sample2 = samples[0], samples[1]
        _, exc, _ = timed(pynvml.nvmlGpmMetricsGet, req)
        d["metrics_back_to_back"] = {**outcome("nvmlGpmMetricsGet", None, exc),
                                     "nvmlReturn": [int(req.metrics[i].nvmlReturn)
                                                    for i in range(len(ps_nvml._GPM_METRICS))]}
        return d
    finally:
        for s in samples:
            with contextlib.suppress(Exception):
                pynvml.nvmlGpmSampleFree(s)


def check_energy_counter(c: Check) -> dict[str, Any]:
    """The total-energy counter and the power reading polled every 10 ms for a while, GPU idle."""
    poller = Poller(_need_gpus(c), 0.01)
    poller.run_for(c.poll_s)
    return {"poll_s": c.poll_s, "errors": poller.errors,
            "gpus": {g.uuid: counter_steps(poller.samples[g.uuid]) for g in c.gpus}}


def _read_ticks(c: Check, source: Any, inject_xid_at: int | None) -> dict[str, Any]:
    times: list[float] = []
    events: list[str] = []
    procs = 0
    batch = None
    for i in range(c.ticks):
        if c.fake is not None and i == inject_xid_at:
            c.fake.xid(0, 13)  # dry run: the drain turns it into one event line
        t0 = time.perf_counter()
        batch = source.read()
        times.append((time.perf_counter() - t0) * 1e3)
        events.extend(batch.events)
        procs += len(batch.processes)
        time.sleep(c.tick_s)
    rest = sorted(times[1:]) or times
    read_ms = {"median": statistics.median(rest), "p90": rest[int(0.9 * (len(rest) - 1))], "max": max(rest)}
    out: dict[str, Any] = {"ticks": len(times), "first_read_ms": times[0] if times else None,
                           "read_ms": read_ms if rest else {}, "events": events, "process_rows": procs}
    if batch is not None:
        from phasescope.schema import SIGNAL_NAMES

        out["last_tick"] = {dev.uuid: {s: float(batch.values[r, j]) for j, s in enumerate(SIGNAL_NAMES)}
                            for r, dev in enumerate(batch.devices)}
        out["missing_signals"] = {dev.uuid: [s for j, s in enumerate(SIGNAL_NAMES)
                                             if not math.isfinite(batch.values[r, j])]
                                  for r, dev in enumerate(batch.devices)}
        out["health"] = {u: (asdict(h) if h is not None else None) for u, h in batch.health.items()}
    return out


def check_source(c: Check) -> dict[str, Any]:
    """NvmlSource as the agent runs it: read() over ~20 ticks, health every 10 s (so the first tick alone),
    then a second source reading health every tick: the difference of the medians is a health read's cost."""
    from phasescope.sources.nvml import NvmlSource

    out: dict[str, Any] = {}
    for name, interval in (("health_every_10s", ps_nvml.HEALTH_INTERVAL_S), ("health_every_tick", 0.0)):
        t0 = time.perf_counter()
        source = NvmlSource(health_interval_s=interval)
        try:
            d: dict[str, Any] = {"open_ms": (time.perf_counter() - t0) * 1e3}
            d.update(_read_ticks(c, source, inject_xid_at=5 if name == "health_every_10s" else None))
            d["unsupported_calls"] = source.unsupported_calls()
            d["error_counts"] = source.error_counts()
            d["devices"] = [dev.label() for dev in source.devices()]
            if name == "health_every_10s":
                d["static_info"] = source.static_info()
            else:
                d.pop("last_tick", None)
        finally:
            source.close()
        out[name] = d
    a, b = out["health_every_10s"]["read_ms"], out["health_every_tick"]["read_ms"]
    if a and b:
        out["health_cost_ms_per_tick"] = b["median"] - a["median"]
    return out


def _torch_load(c: Check) -> tuple[Callable[[], dict[str, Any]], str]:
    """A matmul loop for the load window (set up and warmed outside it): bf16 8192^3 on CUDA; a small
    float32 one on the CPU in a dry run. Skip when torch or its CUDA is missing on a real run."""
    if not c.use_torch:
        raise Skip("--no-torch")
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch not importable: {exc}") from None
    if c.dry_run:
        dev, n, dtype = torch.device("cpu"), 256, torch.float32
    else:
        if not torch.cuda.is_available():
            raise Skip("torch has no CUDA device")
        dev, n, dtype = torch.device("cuda"), 8192, torch.bfloat16
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    (a @ b)[0, 0].item()  # the CUDA context, cuBLAS and its workspace before the window opens
    c.torch_cuda = dev.type == "cuda"
    seconds = c.window_s

    def body() -> dict[str, Any]:
        products = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(8):
                out = a @ b
            products += 8
            out[0, 0].item()  # keeps the host within 8 products of the GPU, so the window ends on time
        return {"products": products, "flop": 2.0 * products * n**3}

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return body, f"torch {torch.__version__} on {name}"


def _window(c: Check, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One phasescope.measure window around body(), with the counter and power polled every 10 ms beside."""
    import phasescope

    with Poller(c.gpus, 0.01) as poller:
        time.sleep(0.05)
        t_a = time.perf_counter()
        with phasescope.measure(f"nvml_check_{name}") as w:
            t_b = time.perf_counter()
            info = body()
            t_c = time.perf_counter()
        t_d = time.perf_counter()
        time.sleep(0.05)
    res = w.result
    assert res is not None
    d: dict[str, Any] = {"begin_ms": (t_b - t_a) * 1e3, "end_ms": (t_d - t_c) * 1e3, "body": info,
                         "result": res.to_dict(), "poll_errors": poller.errors, "compare": {}}
    for dev in res.devices:
        if dev.uuid not in poller.samples:
            continue
        cmp = over_window(poller.samples[dev.uuid], res.start, res.end)
        cmp["measure_j"] = dev.energy_j
        cmp["method"] = dev.method
        cmp["coverage"] = dev.coverage
        for ref in ("counter_j", "power_integral_j"):
            if dev.energy_j is not None and cmp.get(ref):
                cmp[f"measure_over_{ref}"] = dev.energy_j / cmp[ref]
        d["compare"][dev.uuid] = cmp
    return d


def check_monitor(c: Check) -> dict[str, Any]:
    """phasescope.measure (the shared Monitor, as a user gets it) around a sleep and a torch load, and an
    own Monitor's window spanning both (two monitors, nested windows, at once)."""
    from phasescope.monitor import Monitor, shared_monitor

    _need_gpus(c)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    mon = shared_monitor()
    out["shared_monitor"] = {"open_ms": (time.perf_counter() - t0) * 1e3, "source": mon.source.name,
                             "interval_s": mon.interval_s, "devices": [d.label() for d in mon.devices],
                             "notes": list(mon.notes)}
    outer = Monitor(source="nvml")
    outer.begin_window("both")
    try:
        def sleep() -> dict[str, Any]:
            time.sleep(c.window_s)
            return {"slept_s": c.window_s}

        out["sleep"] = _window(c, "sleep", sleep)
        try:
            body, what = _torch_load(c)
        except Skip as exc:
            out["torch"] = {"status": "skipped", "why": str(exc)}
        else:
            out["torch"] = {"status": "ok", "what": what, **_window(c, "torch", body)}
        both = outer.end_window("both")
        out["both_own_monitor"] = {"interval_s": outer.interval_s, "result": both.to_dict()}
    finally:
        outer.close()
    return out


def check_processes(c: Check) -> dict[str, Any]:
    """With this process holding a CUDA context: does NVML list its PID (a container's PID namespace may
    hide it), and does NvmlSource's process row carry its memory and SM share?"""
    from phasescope.sources.nvml import NvmlSource

    if not (c.torch_cuda or c.fake is not None):
        raise Skip("no CUDA context in this process (the torch window was skipped)")
    gpus = _need_gpus(c)
    out: dict[str, Any] = {"pid": os.getpid(), "listed": {}}
    for g in gpus:
        procs, exc, _ = timed(pynvml.nvmlDeviceGetComputeRunningProcesses, g.handle)
        out["listed"][g.uuid] = ([int(p.pid) for p in procs] if exc is None else error_text(exc))
    source = NvmlSource()
    try:
        rows = []
        for _ in range(3):  # process utilisation needs a sample newer than the last one seen
            rows = source.read().processes
            time.sleep(0.3)
        out["source_rows"] = [{"pid": p.pid, "device": p.device_uuid, "gpu_mem_used": p.gpu_mem_used,
                               "sm_util": p.sm_util} for p in rows]
        out["own_pid_seen"] = any(p.pid == os.getpid() for p in rows)
        out["error_counts"] = source.error_counts()
    finally:
        source.close()
    return out


def _need_gpus(c: Check) -> list[Gpu]:
    if not c.gpus:
        raise Skip("no GPU was enumerated (see calls)")
    return c.gpus


# =============================================================================================
# Summary
# =============================================================================================


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    meta = report.get("meta", {})
    lines.append(f"nvml_check on {meta.get('host')} (dry run: {meta.get('dry_run')}), driver "
                 f"{meta.get('nvmlSystemGetDriverVersion')}, nvidia-ml-py {meta.get('nvidia_ml_py')}")
    lines.append("sections: " + ", ".join(f"{s}={report[s]['status']}" for s in SECTIONS if s in report))
    for key in ("calls", "health"):
        sec = report.get(key, {})
        devices = sec.get("devices", sec) if key == "calls" else sec
        for dev, d in devices.items():
            if not isinstance(d, dict) or "calls" not in d:
                continue
            calls = d["calls"]
            by = {s: [n for n, p in calls.items() if p.get("status") == s]
                  for s in ("ok", "empty", "not_supported", "error")}
            worst = max(((p["latency"].get("median_ms", 0.0), n) for n, p in calls.items()),
                        default=(0.0, ""))
            lines.append(f"{key} {dev}: {len(by['ok'])} ok, not supported: {by['not_supported'] or 'none'}, "
                         f"errors: {[n + ': ' + str(calls[n]['error']) for n in by['error']] or 'none'}; "
                         f"slowest {worst[1]} {worst[0]:.3f} ms")
            if key == "health":
                mt = calls.get("nvmlDeviceGetFieldValues(memtemp)", {})
                lines.append(f"  health read {d.get('health_read_ms', 0):.3f} ms/GPU; memtemp -> "
                             f"{_short(mt)}; phasescope reads {mt.get('phasescope_reads_c')} C")
                for n in ("nvmlDeviceGetTotalEccErrors(uncorrected,volatile)", "nvmlDeviceGetRemappedRows"):
                    lines.append(f"  {n} -> {_short(calls.get(n, {}))}")
    for dev, d in report.get("xid", {}).items():
        if isinstance(d, dict) and "uuid" in d:
            w = d.get(WAIT_EMPTY, {})
            reg = d.get("nvmlDeviceRegisterEvents(xid)", {})
            lines.append(f"xid {dev}: register {reg.get('status', reg.get('error'))}; wait(set, 0) empty -> "
                         f"{_short(w)} ({w.get('phasescope')}), {w.get('latency', {}).get('median_ms')} ms")
    for dev, d in report.get("gpm", {}).items():
        if isinstance(d, dict) and "uuid" in d:
            metrics = [(m["signal"], round(m["value"], 1)) for m in d.get("GPU", {}).get("metrics", [])]
            lines.append(f"gpm {dev}: supported {d.get('supported')}"
                         + (f", metrics {metrics}" if d.get("supported") else ""))
    for uuid, s in report.get("energy_counter", {}).get("gpus", {}).items():
        e, p = s.get("energy", {}), s.get("power", {})
        every_e = e.get("change_interval_ms", {}).get("median")
        every_p = p.get("change_interval_ms", {}).get("median")
        lines.append(f"counter {uuid[:16]}: {e.get('changes')} changes in {s.get('polls')} polls at "
                     f"{s.get('poll_period_ms', 0):.1f} ms, every {_r(every_e)} ms "
                     f"(power changes every {_r(every_p)} ms); "
                     f"counter {_r(e.get('mean_power_w'))} W vs power {_r(p.get('mean_power_w'))} W")
    src = report.get("source", {})
    for name in ("health_every_10s", "health_every_tick"):
        d = src.get(name)
        if d:
            r = d["read_ms"]
            lines.append(f"source {name}: open {d['open_ms']:.1f} ms, first {d['first_read_ms']:.2f} ms, "
                         f"median {r.get('median', 0):.3f} ms, p90 {r.get('p90', 0):.3f} ms; "
                         f"errors {d['error_counts']}; unsupported {d['unsupported_calls']}; "
                         f"events {len(d['events'])}")
    if "health_cost_ms_per_tick" in src:
        lines.append(f"  health read costs {src['health_cost_ms_per_tick']:.3f} ms on a tick")
    mon = report.get("monitor", {})
    for name in ("sleep", "torch"):
        w = mon.get(name)
        if not w or w.get("status") == "skipped":
            lines.append(f"measure {name}: skipped ({(w or {}).get('why')})")
            continue
        r = w["result"]
        lines.append(f"measure {name}: {r['time_s']:.2f} s, {_r(r['total_energy_j'])} J, "
                     f"begin {w['begin_ms']:.2f} ms, end {w['end_ms']:.2f} ms")
        for dev in r["devices"]:
            cmp = w["compare"].get(dev["uuid"], {})
            steps = cmp.get("steps_in_window", {}).get("energy", {})
            every = steps.get("change_interval_ms", {}).get("median")
            lines.append(f"  {dev['name']} {dev['method']}: {_r(dev['energy_j'])} J, "
                         f"coverage {_r(dev['coverage'])}, "
                         f"polled counter {_r(cmp.get('counter_j'))} J, "
                         f"power integral {_r(cmp.get('power_integral_j'))} J, counter changed every "
                         f"{_r(every)} ms, notes {dev['notes']}")
    procs = report.get("processes", {})
    if procs.get("status") == "ok":
        lines.append(f"processes: own pid {procs['pid']} seen by NvmlSource: {procs['own_pid_seen']}; "
                     f"NVML lists {procs['listed']}")
    if "timed_out" in report:
        lines.append(f"TIMED OUT in {report['timed_out']['section']}")
    return lines


def _short(p: dict[str, Any]) -> str:
    """One probe's answer in a few words: the error, a field value's essentials, or the value's shape."""
    if p.get("status") not in ("ok", "empty") or "value" not in p:
        return str(p.get("error"))
    v = p["value"]
    items = v.get("items") or []
    if items and items[0].get("type") == "c_nvmlFieldValue_t":
        f = items[0]
        return (f"{v['type']}: valueType {f['valueType']} ({f['value_member']}), "
                f"nvmlReturn {f['nvmlReturn']} "
                f"({f['nvmlReturn_text']}), value {f['value']}")
    if items:
        return f"{v['type']} of {v['len']}: " + ", ".join(str(i.get("value", i.get("type"))) for i in items)
    return f"{v['type']} {v.get('value', '')}".strip()


def _r(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


# =============================================================================================
# Dry run and main
# =============================================================================================


@contextlib.contextmanager
def installed_fake(fails: list[str], crashes: list[str], hangs: list[str]) -> Iterator[Any]:
    """Dry run: the fake NVML replays a real trace (one sample per 0.1 s), with every health counter set and
    this process listed on the GPU. --fake-fail CALL[:CODE] makes a call raise NVMLError(CODE, default
    Unknown); --fake-crash CALL makes it raise RuntimeError (a Python error, not NVML's); --fake-hang CALL
    makes it never return (for the watchdog)."""
    sys.path.insert(0, str(REPO))
    from tests.fakes.fake_nvml import FakeNvml, FakeProcess

    from phasescope.sources.replay import read

    fake = FakeNvml([_dry_run_gpu(read(_dry_run_trace())[0])], mem_total_bytes=141 << 30, power_limit_w=700.0,
                    max_clocks_mhz=(1980, 3201), throttle_reasons=0, energy_from_power=True,
                    processes={0: [FakeProcess(os.getpid(), 2 << 30, 60)]})
    fake.set_health(0, ecc={("corrected", "volatile"): 2, ("corrected", "aggregate"): 5,
                            ("uncorrected", "volatile"): 0, ("uncorrected", "aggregate"): 0},
                    remapped_rows=(0, 0, 0, 0), pcie_replays=0, mem_temp_c=41)
    for spec in fails:
        call, _, code = spec.partition(":")
        fake.fail(call, int(code) if code else pynvml.NVML_ERROR_UNKNOWN)
    stop = threading.Event()
    saved = {name: getattr(pynvml, name) for name in crashes + hangs}

    def crash(name: str) -> Callable[..., Any]:
        def boom(*args: Any) -> Any:
            raise RuntimeError(f"scripted crash in {name}")
        return boom

    def hang(*args: Any) -> Any:
        time.sleep(3600)

    def tick() -> None:
        while not stop.wait(0.1):
            fake.advance()

    with fake.installed():
        for name in crashes:
            setattr(pynvml, name, crash(name))
        for name in hangs:
            setattr(pynvml, name, hang)
        threading.Thread(target=tick, daemon=True).start()
        try:
            yield fake
        finally:
            stop.set()
            for name, fn in saved.items():
                setattr(pynvml, name, fn)


def _dry_run_gpu(trace: Any) -> Any:
    """The replayed trace as an H200-like GPU: its clock squeezed to the fake's 0.1 s per tick (so the energy
    counter integrated from power agrees with power), plus GPM and NVLink signals derived from utilisation,
    so the dry run walks those code paths too (the recorded GPU, an RTX 3090, has neither)."""
    from phasescope.schema import Trace

    t = trace.time
    cols = {name: trace[name] for name in trace.present_signals()}
    util = cols["gpu_util"]
    cols.update(sm_active=util * 0.9, tensor_active=util * 0.5, dram_active=cols["mem_util"],
                nvlink_tx=util * 1e9, nvlink_rx=util * 1e9)
    return Trace(trace.device, t[0] + (t - t[0]) / 10.0, cols, trace.meta)


def run(c: Check) -> int:
    checks: dict[str, Callable[[Check], dict[str, Any]]] = {
        "meta": check_meta, "calls": check_calls, "health": check_health, "xid": check_xid, "gpm": check_gpm,
        "energy_counter": check_energy_counter, "source": check_source, "monitor": check_monitor,
        "processes": check_processes,
    }
    for name in SECTIONS:
        c.section(name, checks[name])
    with contextlib.suppress(Exception):
        pynvml.nvmlShutdown()  # the meta section's nvmlInit
    lines = summary_lines(c.report)
    with c.lock:
        c.report["summary"] = lines
        c.report["elapsed_s"] = round(time.monotonic() - c.started, 2)
    c.write()
    (c.out / "nvml_check.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 1 if any(c.report[s]["status"] == "failed" for s in SECTIONS) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output folder [default: $OUT]")
    ap.add_argument("--dry-run", action="store_true", help="CPU, fake NVML, short windows")
    ap.add_argument("--window-s", type=float, default=None, help="seconds per measure() window [3; dry 0.5]")
    ap.add_argument("--ticks", type=int, default=20, help="NvmlSource.read() ticks per source [20]")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch load window")
    ap.add_argument("--timeout-s", type=float, default=90.0, help="end the run after this long [90]")
    ap.add_argument("--fake-fail", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--fake-crash", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--fake-hang", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        ap.error("give --out DIR or set $OUT")
    if (args.fake_fail or args.fake_crash or args.fake_hang) and not args.dry_run:
        ap.error("--fake-fail, --fake-crash and --fake-hang need --dry-run")
    window = args.window_s if args.window_s is not None else (0.5 if args.dry_run else 3.0)
    if not (window > 0 and args.ticks >= 2 and args.timeout_s > 0):
        ap.error("expected --window-s > 0, --ticks >= 2 and --timeout-s > 0")
    out.mkdir(parents=True, exist_ok=True)
    faulthandler.enable()  # a crash in the driver's library still says where
    c = Check(out=out, dry_run=args.dry_run, window_s=window, ticks=args.ticks,
              tick_s=0.1, poll_s=0.5 if args.dry_run else 1.0,
              use_torch=not args.no_torch)
    c.watchdog(args.timeout_s)
    if not args.dry_run:
        return run(c)
    with installed_fake(args.fake_fail, args.fake_crash, args.fake_hang) as fake:
        c.fake = fake
        return run(c)


if __name__ == "__main__":
    sys.exit(main())
