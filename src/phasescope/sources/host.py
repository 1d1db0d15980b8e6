"""Host source through psutil: the host as a pseudo-device, and the processes worth watching.

The pseudo-device `host:<hostname>` carries CPU utilisation in `gpu_util` (the "is it busy" column of
every view) and host RAM in `mem_used` / `mem_total`; its other signals are NaN.

Processes worth watching: every PID the NVML source saw on a GPU (`watch()`), and every Python process
that has imported torch. Torch is detected from `libtorch` in the process's memory maps; a PID found
with torch stays flagged (a library is not unloaded), one found without is re-checked only every
`torch_recheck_s`, and new PIDs are looked for only every `scan_s`, so the cost per tick stays small.
A process that vanishes or refuses access is skipped and counted, never raised. Its user, start time and
command line are read once, at first sight of the PID (and again only when the PID is reused): they do
not change, and re-reading /proc/PID/cmdline every tick for hundreds of processes would be waste.
`signal_process` sends a signal to a sampled process, never to another that took its PID since.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import psutil

from phasescope.identity import host_name
from phasescope.schema import SIGNAL_COLUMN, SIGNAL_NAMES, DeviceInfo, ProcessSample, TickBatch
from phasescope.sources.base import LiveSource
from phasescope.text import ellipsize, printable

_NAN = math.nan
# DeviceInfo.extra["kind"] of the host pseudo-device. Views show it beside the GPUs; /metrics exports it as
# phasescope_host_*, never under a GPU name, so nothing that counts GPUs counts a CPU.
HOST_KIND = "host"
_N = len(SIGNAL_NAMES)
_T = TypeVar("_T")
_TORCH_MARK = b"libtorch"
CMDLINE_CHARS = 512  # of a process's command line kept: enough for any view, bounded for hundreds of PIDs


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def _maps_mention_torch(proc: psutil.Process) -> bool:
    """Whether libtorch is mapped into the process. Reads /proc/PID/maps directly: far cheaper than
    psutil's memory_maps(), which parses smaps."""
    try:
        with open(f"/proc/{proc.pid}/maps", "rb") as fh:
            return _TORCH_MARK in fh.read()
    except FileNotFoundError:
        if not os.path.isdir("/proc"):  # not Linux: ask psutil
            return any(_TORCH_MARK.decode() in m.path for m in proc.memory_maps(grouped=True))
        raise psutil.NoSuchProcess(proc.pid) from None
    except PermissionError:
        raise psutil.AccessDenied(proc.pid) from None


def _looks_like_python(proc: psutil.Process) -> bool:
    # PyTorch renames its main thread "pt_main_thread", which then is the process name; check argv too.
    name = proc.name()
    if "python" in name or name == "pt_main_thread":
        return True
    argv = proc.cmdline()
    return bool(argv) and "python" in os.path.basename(argv[0])


_PROC = Path("/proc")
_LINUX = _PROC.is_dir()
_CLK_TCK = os.sysconf("SC_CLK_TCK") if _LINUX else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if _LINUX else 4096


@dataclass
class _Watched:
    proc: psutil.Process
    name: str
    start: int  # start time in clock ticks since boot: tells a reused PID from the process we knew
    cpu_s: float = _NAN  # CPU seconds at the previous sample
    mono: float = _NAN  # when that sample was taken
    # Read once at first sight: a process's owner, start and argv do not change (a reused PID is a new
    # _Watched), so /proc/PID/cmdline is not re-read every tick for every process.
    user: str = ""
    start_time: float = _NAN  # Unix seconds
    cmdline: str = ""


def _or_empty(read: Callable[[], _T], empty: _T) -> _T:
    try:
        return read()
    except (psutil.Error, OSError):
        return empty


def _identity(proc: psutil.Process, start_ticks: int | None = None) -> tuple[str, float, str]:
    """(user, start Unix seconds, command line) of a process; each "" / NaN where it cannot be read
    (hidepid, a zombie's empty argv, one that just exited): never an error. `start_ticks` (Linux: read from
    /proc/PID/stat already) gives the start exactly as `signal_process` will check it."""
    argv: list[str] = _or_empty(proc.cmdline, [])
    start = _start_time(start_ticks) if start_ticks is not None else float(_or_empty(proc.create_time, _NAN))
    # printable: argv is anyone's to choose (`exec -a`), and an ESC in it must not reach the terminal raw.
    user = printable(_or_empty(proc.username, ""))
    return user, start, ellipsize(printable(" ".join(argv)), CMDLINE_CHARS)


def _read_proc_stat(pid: int) -> tuple[float, float, float, int]:
    """(CPU seconds, threads, RSS bytes, start ticks) from one read of /proc/PID/stat.

    Three times cheaper than the psutil calls it replaces; this runs for every watched PID every tick."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    f = data[data.rfind(b")") + 2:].split()  # f[0] is field 3 (state) of proc(5)
    return (int(f[11]) + int(f[12])) / _CLK_TCK, float(f[17]), float(int(f[21]) * _PAGE), int(f[19])


def _read_proc_io(pid: int) -> tuple[float, float]:
    try:
        with open(f"/proc/{pid}/io", "rb") as fh:
            lines = fh.read().split(b"\n")
    except PermissionError:
        return _NAN, _NAN  # another user's process: its I/O is private
    fields = dict(line.split(b": ", 1) for line in lines if b": " in line)
    return float(fields.get(b"read_bytes", _NAN)), float(fields.get(b"write_bytes", _NAN))


SAME_START_S = 1.0  # off Linux: start times this close are one process (psutil's boot time can shift by 1 s)
_boot_time_s: float | None = None


def _start_time(ticks: int) -> float:
    """Unix seconds a process started, from its start ticks since boot (/proc/PID/stat field 22). The boot
    time is read once per phasescope process, so a sample's start and `signal_process`'s check agree to the
    tick even after the wall clock was stepped (/proc/stat's btime moves with it)."""
    global _boot_time_s
    if _boot_time_s is None:
        _boot_time_s = float(psutil.boot_time())
    return _boot_time_s + ticks / _CLK_TCK


def _send_if_same(pid: int, start_time: float, sig: int) -> bool:
    """Linux: send `sig` through a pidfd (it names one process, never a later one with the same PID) once
    the process behind it is shown to have started at `start_time`, to the tick. False: another process."""
    fd = os.pidfd_open(pid)  # ProcessLookupError: gone
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:  # after the pidfd: if it still matches, the pidfd is it
            data = fh.read()
        f = data[data.rfind(b")") + 2:].split()  # f[0] is field 3 (state) of proc(5)
        if abs(_start_time(int(f[19])) - start_time) > 0.5 / _CLK_TCK:
            return False
        if f[0] in (b"Z", b"X"):  # exited, not yet reaped: a signal would "succeed" and do nothing
            raise ProcessLookupError(pid)
        signal.pidfd_send_signal(fd, sig)  # ProcessLookupError: exited (a zombie included)
        return True
    finally:
        os.close(fd)


def signal_process(pid: int, start_time: float, sig: int) -> tuple[bool, str]:
    """Send `sig` to `pid` when it is still the process that started at `start_time` (a PID reused since
    the sample was taken is left alone). (sent, one line that says what happened or why not)."""
    what = signal.Signals(sig).name
    if not math.isfinite(start_time):
        return False, f"{what} not sent: process {pid} is not visible from here (other host or PID namespace)"
    if pid == os.getpid():
        return False, f"{what} not sent: {pid} is phasescope itself (q quits)"
    try:
        if _LINUX and hasattr(os, "pidfd_open"):
            if not _send_if_same(pid, start_time, sig):
                return False, f"{what} not sent: PID {pid} now belongs to another process"
        else:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - start_time) > SAME_START_S:
                return False, f"{what} not sent: PID {pid} now belongs to another process"
            proc.send_signal(sig)
    # ZombieProcess is a NoSuchProcess: it has exited, its parent has not reaped it.
    except (psutil.NoSuchProcess, ProcessLookupError, FileNotFoundError):
        return False, f"{what} not sent: process {pid} has exited"
    except (psutil.AccessDenied, PermissionError):
        return False, f"{what} not sent to {pid}: permission denied (another user's process?)"
    return True, f"sent {what} to {pid}"


_INIT_PID_NS_INO = 0xEFFFFFFC  # the kernel's PROC_PID_INIT_INO: the inode of the initial PID namespace


def in_init_pid_namespace() -> bool:
    """Whether this process sees the host's PIDs (not in a container's own PID namespace). NVML reports
    the host's PIDs; from another namespace the same number in /proc can be a different process. False
    where it cannot tell on Linux; True off Linux (no PID namespaces)."""
    if not _LINUX:
        return True
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
        return int(link.partition("[")[2].rstrip("]")) == _INIT_PID_NS_INO
    except (OSError, ValueError):
        return False


def is_host_device(info: DeviceInfo) -> bool:
    """Whether `info` is the host pseudo-device (CPU and RAM), not an accelerator."""
    return info.extra.get("kind") == HOST_KIND


class HostSource:
    """The host as a pseudo-device plus per-process samples for GPU and torch processes."""

    name = "host"
    local_processes = True  # its PIDs are this host's: a view may signal them (`signal_process`)

    def __init__(self, find_torch: bool = True, scan_s: float = 5.0, torch_recheck_s: float = 30.0) -> None:
        self._host = host_name()
        self._info = DeviceInfo(
            uuid=f"host:{self._host}", name=f"{_cpu_model()} ({psutil.cpu_count() or 0} logical cores)",
            host=self._host, extra={"kind": HOST_KIND},
        )
        self._find_torch = find_torch
        self._scan_s = scan_s
        self._recheck_s = torch_recheck_s
        self._errors: dict[str, int] = {}
        self._gpu_pids: set[int] = set()
        self._watched: dict[int, _Watched] = {}
        self._torch_pids: set[int] = set()
        self._not_torch: dict[int, float] = {}  # python PID without torch -> when checked (monotonic)
        self._not_python: set[int] = set()
        self._next_scan = -math.inf
        self._own_pid = os.getpid()
        psutil.cpu_percent(None)  # prime the system-wide counter

    def devices(self) -> list[DeviceInfo]:
        return [self._info]

    def error_counts(self) -> dict[str, int]:
        return dict(self._errors)

    def _count(self, what: str) -> None:
        self._errors[what] = self._errors.get(what, 0) + 1

    def watch(self, pids: Iterable[int]) -> None:
        """The PIDs to sample besides torch processes (the NVML source's GPU processes), from now on."""
        self._gpu_pids = set(pids)

    def torch_pids(self) -> set[int]:
        return set(self._torch_pids)

    def read(self) -> TickBatch:
        now = time.time()
        row = np.full((1, _N), np.nan)
        row[0, SIGNAL_COLUMN["gpu_util"]] = psutil.cpu_percent(None) / 100.0
        vm = psutil.virtual_memory()
        row[0, SIGNAL_COLUMN["mem_used"]] = float(vm.total - vm.available)
        row[0, SIGNAL_COLUMN["mem_total"]] = float(vm.total)
        if self._find_torch:
            self._scan_for_torch(time.monotonic())
        processes = self.sample_processes(now, self._gpu_pids | self._torch_pids, self._info.uuid)
        return TickBatch(time=now, devices=[self._info], values=row, processes=processes)

    def _scan_for_torch(self, mono: float) -> None:
        if mono < self._next_scan:
            return
        self._next_scan = mono + self._scan_s
        alive = set(psutil.pids())
        # Forget PIDs that are gone, so a reused PID is looked at afresh.
        self._torch_pids &= alive
        self._not_python &= alive
        self._not_torch = {p: t for p, t in self._not_torch.items() if p in alive}
        for pid in alive:
            if pid in self._torch_pids or pid in self._not_python or pid == self._own_pid:
                continue
            checked = self._not_torch.get(pid)
            if checked is not None and mono - checked < self._recheck_s:
                continue
            try:
                proc = psutil.Process(pid)
                if checked is None and not _looks_like_python(proc):
                    self._not_python.add(pid)
                    continue
                if _maps_mention_torch(proc):
                    self._torch_pids.add(pid)
                    self._not_torch.pop(pid, None)
                else:
                    self._not_torch[pid] = mono
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass  # it exited since it was listed: process churn, not a failed read
            except psutil.AccessDenied:
                self._not_python.add(pid)  # another user's process: we cannot look, so do not keep trying
                self._count("psutil.AccessDenied")

    def sample_processes(
        self, now: float, pids: Iterable[int], device_uuid: str | None
    ) -> list[ProcessSample]:
        """CPU ratio (of one core), RSS, threads and I/O bytes per live PID; vanished ones are skipped."""
        wanted = set(pids)
        for pid in [p for p in self._watched if p not in wanted]:
            del self._watched[pid]
        out: list[ProcessSample] = []
        for pid in sorted(wanted):
            sample = self._sample_one(pid, now, device_uuid)
            if sample is not None:
                out.append(sample)
        return out

    def _sample_one(self, pid: int, now: float, device_uuid: str | None) -> ProcessSample | None:
        try:
            return self._sample_linux(pid, now, device_uuid) if _LINUX else self._sample_psutil(
                pid, now, device_uuid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, FileNotFoundError, ProcessLookupError):
            # It exited since it was listed: normal churn, not a failed read (the status line's "failed
            # reads" and /metrics' source errors would otherwise grow on every busy host).
            self._watched.pop(pid, None)
        except (psutil.AccessDenied, PermissionError):
            self._watched.pop(pid, None)
            self._count("psutil.AccessDenied")
        return None

    def _first_sight(self, pid: int, start: int) -> _Watched:
        proc = psutil.Process(pid)
        user, start_time, cmdline = _identity(proc, start if _LINUX else None)
        watched = self._watched[pid] = _Watched(proc, printable(proc.name()), start, user=user,
                                                start_time=start_time, cmdline=cmdline)
        return watched

    def _sample_linux(self, pid: int, now: float, device_uuid: str | None) -> ProcessSample:
        cpu_s, threads, rss, start = _read_proc_stat(pid)
        mono = time.monotonic()
        watched = self._watched.get(pid)
        if watched is None or watched.start != start:  # new, or the PID now belongs to another process
            watched = self._first_sight(pid, start)
        dt = mono - watched.mono
        cpu = (cpu_s - watched.cpu_s) / dt if dt > 0 else _NAN  # NaN on first sight, not a fake 0
        watched.cpu_s, watched.mono = cpu_s, mono
        read_b, write_b = _read_proc_io(pid)
        return ProcessSample(
            time=now, pid=pid, device_uuid=device_uuid, name=watched.name, cpu_util=cpu, rss=rss,
            threads=threads, read_bytes=read_b, write_bytes=write_b, uses_torch=pid in self._torch_pids,
            user=watched.user, start_time=watched.start_time, cmdline=watched.cmdline,
        )

    def _sample_psutil(self, pid: int, now: float, device_uuid: str | None) -> ProcessSample:
        """Portable path (no /proc): the same figures through psutil."""
        watched = self._watched.get(pid)
        if watched is None:
            watched = self._first_sight(pid, 0)
        proc = watched.proc
        with proc.oneshot():
            cpu = proc.cpu_percent(None) / 100.0
            rss = float(proc.memory_info().rss)
            threads = float(proc.num_threads())
            try:
                io = proc.io_counters()
                read_b, write_b = float(io.read_bytes), float(io.write_bytes)
            except (psutil.AccessDenied, AttributeError, NotImplementedError):
                read_b = write_b = _NAN
        first = watched.mono != watched.mono
        watched.mono = 0.0
        return ProcessSample(
            time=now, pid=pid, device_uuid=device_uuid, name=watched.name, cpu_util=_NAN if first else cpu,
            rss=rss, threads=threads, read_bytes=read_b, write_bytes=write_b,
            uses_torch=pid in self._torch_pids, user=watched.user, start_time=watched.start_time,
            cmdline=watched.cmdline,
        )

    def close(self) -> None:
        self._watched.clear()


class CombinedSource:
    """GPU telemetry from one source (NVML) with its processes enriched by the host source each tick.

    GPU processes get CPU, RSS, threads, I/O and the torch flag; torch processes that use no GPU are
    added with the host as their device. `host_row=True` also appends the host pseudo-device row.
    """

    local_processes = True  # enriched here: a process the host could not see has no start time, so it
    # cannot be signalled (`signal_process` refuses it)

    def __init__(self, gpu: LiveSource, host: HostSource, host_row: bool = False) -> None:
        self.gpu = gpu
        self.host = host
        self.host_row = host_row
        self.name = f"{gpu.name}+host"
        # NVML reports the host's PIDs (the driver knows no PID namespaces). In a container's own PID
        # namespace the same number in our /proc is another process, or none: its CPU, RSS, name, user and
        # command would be another's, and `k` would signal that one. There, GPU processes are not enriched.
        self._same_pids = in_init_pid_namespace()

    def devices(self) -> list[DeviceInfo]:
        return self.gpu.devices() + (self.host.devices() if self.host_row else [])

    def error_counts(self) -> dict[str, int]:
        out = self.gpu.error_counts()
        for key, n in self.host.error_counts().items():
            out[key] = out.get(key, 0) + n
        return out

    def read(self) -> TickBatch:
        batch = self.gpu.read()
        self.host.watch(p.pid for p in batch.processes if self._same_pids)
        host = self.host.read()
        by_pid = {p.pid: p for p in host.processes} if self._same_pids else {}
        merged: list[ProcessSample] = []
        for p in batch.processes:
            h = by_pid.get(p.pid)
            merged.append(p if h is None else replace(
                p, name=p.name or h.name, cpu_util=h.cpu_util, rss=h.rss, threads=h.threads,
                read_bytes=h.read_bytes, write_bytes=h.write_bytes, uses_torch=h.uses_torch,
                user=h.user, start_time=h.start_time, cmdline=h.cmdline))
        on_gpu = {p.pid for p in batch.processes} if self._same_pids else set()  # else: host PIDs, not ours
        merged.extend(h for h in host.processes if h.pid not in on_gpu)
        devices, values = batch.devices, batch.values
        if self.host_row:
            devices = devices + host.devices
            values = np.vstack([values, host.values])
        return TickBatch(time=batch.time, devices=devices, values=values, processes=merged,
                         events=batch.events + host.events, health=batch.health)

    def close(self) -> None:
        try:
            self.gpu.close()
        finally:
            self.host.close()
