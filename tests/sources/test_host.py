"""HostSource and CombinedSource on real processes: a torch child, a plain child, and vanishing PIDs."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import psutil
import pytest

from phasescope.schema import SIGNAL_COLUMN, SIGNAL_NAMES
from phasescope.sources import host as host_module
from phasescope.sources.host import CombinedSource, HostSource, is_host_device, signal_process
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from tests.fakes.fake_nvml import FakeProcess

SPAR_BERT = "spar-a100/bert_sst2_amp_NVIDIA_A100_SXM4_40GB_90abf7ca_20260309_182528.parquet"
_WAIT = "import sys, time; print('ready', flush=True); time.sleep(120)"


def _spawn(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", "child did not start"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def torch_child() -> Iterator[subprocess.Popen[str]]:
    proc = _spawn("import torch\n" + _WAIT)
    yield proc
    _stop(proc)


@pytest.fixture
def plain_child() -> Iterator[subprocess.Popen[str]]:
    proc = _spawn(_WAIT)
    yield proc
    _stop(proc)


def test_host_row_is_cpu_and_ram():
    src = HostSource(find_torch=False)
    (dev,) = src.devices()
    assert dev.uuid == f"host:{socket.gethostname()}"
    assert is_host_device(dev)  # what keeps /metrics from naming its CPU figures phasescope_gpu_*
    batch = src.read()
    row = batch.values[0]
    assert 0.0 <= row[SIGNAL_COLUMN["gpu_util"]] <= 1.0
    assert row[SIGNAL_COLUMN["mem_total"]] == psutil.virtual_memory().total
    assert 0 < row[SIGNAL_COLUMN["mem_used"]] <= row[SIGNAL_COLUMN["mem_total"]]
    others = [SIGNAL_COLUMN[s] for s in SIGNAL_NAMES if s not in ("gpu_util", "mem_used", "mem_total")]
    assert np.isnan(row[others]).all()


def test_finds_the_torch_process_and_survives_it_vanishing(torch_child, plain_child):
    src = HostSource(scan_s=0.0)
    src.read()
    assert torch_child.pid in src.torch_pids()
    assert plain_child.pid not in src.torch_pids()  # python, but no torch
    batch = src.read()
    by_pid = {p.pid: p for p in batch.processes}
    assert plain_child.pid not in by_pid
    p = by_pid[torch_child.pid]
    assert p.uses_torch and p.device_uuid == src.devices()[0].uuid
    assert p.rss > 50e6  # torch's libraries are mapped and touched
    assert p.threads >= 1 and math.isfinite(p.cpu_util) and p.cpu_util >= 0
    assert math.isfinite(p.read_bytes) and math.isfinite(p.write_bytes)

    # A watched process that vanishes between ticks is skipped, never raised, and not a failed read.
    short = _spawn(_WAIT)
    src.watch([short.pid])
    assert short.pid in {p.pid for p in src.read().processes}
    _stop(short)
    batch = src.read()
    assert short.pid not in {p.pid for p in batch.processes}
    assert "psutil.NoSuchProcess" not in src.error_counts()
    assert torch_child.pid in {p.pid for p in batch.processes}


@pytest.mark.parametrize("linux_fast_path", [True, False])
def test_first_cpu_sample_is_nan_not_zero(plain_child, monkeypatch, linux_fast_path):
    monkeypatch.setattr(host_module, "_LINUX", linux_fast_path)  # False: the portable psutil path
    src = HostSource(find_torch=False)
    src.watch([plain_child.pid])
    (first,) = src.read().processes
    (second,) = src.read().processes
    assert math.isnan(first.cpu_util) and math.isfinite(second.cpu_util)
    assert first.name == psutil.Process(plain_child.pid).name() and first.threads >= 1
    assert first.rss == pytest.approx(psutil.Process(plain_child.pid).memory_info().rss, abs=2**20)
    _stop(plain_child)
    assert src.read().processes == []
    assert src.error_counts() == {}  # an exited process is churn, not a failed read


def test_combined_source_enriches_gpu_processes(fake_nvml, shared_data, torch_child, plain_child):
    traces = read(shared_data / SPAR_BERT)
    fake_nvml(traces, processes={0: [FakeProcess(plain_child.pid, 5 * 2**30, sm_util_pct=40)]})
    src = CombinedSource(NvmlSource(), HostSource(scan_s=0.0), host_row=True)
    src.read()
    batch = src.read()
    assert [d.uuid for d in batch.devices] == [traces[0].device.uuid, f"host:{socket.gethostname()}"]
    assert batch.values.shape == (2, len(SIGNAL_NAMES))
    assert [is_host_device(d) for d in batch.devices] == [False, True]  # the GPU is exported as a GPU
    by_pid = {p.pid: p for p in batch.processes}
    gpu_proc = by_pid[plain_child.pid]
    assert gpu_proc.device_uuid == traces[0].device.uuid
    assert gpu_proc.gpu_mem_used == 5 * 2**30 and gpu_proc.sm_util == pytest.approx(0.4)
    assert gpu_proc.rss > 0 and math.isfinite(gpu_proc.cpu_util) and not gpu_proc.uses_torch
    torch_proc = by_pid[torch_child.pid]  # on no GPU, but worth watching
    assert torch_proc.uses_torch and torch_proc.device_uuid == f"host:{socket.gethostname()}"
    src.close()


def test_cpu_percent_becomes_a_ratio(plain_child, monkeypatch):
    """psutil reports percent; the schema's gpu_util / cpu_util are ratios (50 % of a core -> 0.5)."""
    monkeypatch.setattr(host_module.psutil, "cpu_percent", lambda interval=None: 50.0)
    monkeypatch.setattr(host_module.psutil.Process, "cpu_percent", lambda self, interval=None: 50.0)
    monkeypatch.setattr(host_module, "_LINUX", False)  # the psutil path, which reports percent
    src = HostSource(find_torch=False)
    src.watch([plain_child.pid])
    src.read()
    batch = src.read()
    assert batch.values[0, SIGNAL_COLUMN["gpu_util"]] == 0.5
    (p,) = batch.processes
    assert p.cpu_util == 0.5


# ---- who and what: user, start time, command line (nvitop's USER, TIME, COMMAND) ----


def test_user_start_and_command_line_read_once_per_process(plain_child, monkeypatch):
    """A process's owner, start and argv come with every sample, read at first sight only: the argv of
    hundreds of processes is not re-read from /proc every tick."""
    calls: list[int] = []
    real_cmdline = psutil.Process.cmdline

    def counting(self: psutil.Process) -> list[str]:
        calls.append(self.pid)
        return real_cmdline(self)

    monkeypatch.setattr(host_module.psutil.Process, "cmdline", counting)
    src = HostSource(find_torch=False)
    src.watch([plain_child.pid])
    samples = [src.read().processes[0] for _ in range(3)]
    assert calls.count(plain_child.pid) == 1
    truth = psutil.Process(plain_child.pid)
    for p in samples:
        assert p.user == truth.username()
        assert p.start_time == pytest.approx(truth.create_time(), abs=1.0)
        assert p.cmdline == " ".join(truth.cmdline()) and p.cmdline.startswith(sys.executable + " -c ")


@pytest.mark.parametrize("linux_fast_path", [True, False])
def test_long_command_line_is_cut_and_unreadable_identity_is_empty(monkeypatch, linux_fast_path):
    monkeypatch.setattr(host_module, "_LINUX", linux_fast_path)
    long_child = subprocess.Popen([sys.executable, "-c", _WAIT, "--token", "x" * 2000],
                                  stdout=subprocess.PIPE, text=True)
    try:
        assert long_child.stdout is not None and long_child.stdout.readline().strip() == "ready"
        src = HostSource(find_torch=False)
        src.watch([long_child.pid])
        (p,) = src.read().processes
        assert len(p.cmdline) == host_module.CMDLINE_CHARS and p.cmdline.endswith("…")

        # Another user's process behind hidepid: no owner, argv or start, but its numbers still come.
        def denied(self: psutil.Process) -> None:
            raise psutil.AccessDenied(self.pid)

        for what in ("cmdline", "username", "create_time"):
            monkeypatch.setattr(host_module.psutil.Process, what, denied)
        src = HostSource(find_torch=False)
        src.watch([long_child.pid])
        (p,) = src.read().processes
        assert (p.user, p.cmdline) == ("", "") and p.rss > 0
        # Linux reads the start from /proc/PID/stat with the numbers (what `signal_process` checks); the
        # portable path asks psutil, which was refused.
        assert math.isnan(p.start_time) != linux_fast_path
        assert src.error_counts() == {}
    finally:
        _stop(long_child)  # type: ignore[arg-type]


def test_combined_source_carries_who_and_what(fake_nvml, shared_data, plain_child):
    traces = read(shared_data / SPAR_BERT)
    fake_nvml(traces, processes={0: [FakeProcess(plain_child.pid, 2**30, sm_util_pct=10)]})
    src = CombinedSource(NvmlSource(), HostSource(find_torch=False))
    (p,) = [q for q in src.read().processes if q.pid == plain_child.pid]
    truth = psutil.Process(plain_child.pid)
    assert p.gpu_mem_used == 2**30 and p.user == truth.username()
    assert p.cmdline == " ".join(truth.cmdline())
    assert p.start_time == pytest.approx(truth.create_time(), abs=1)
    assert src.local_processes and HostSource.local_processes
    src.close()


def test_signal_goes_only_to_the_process_that_was_sampled(plain_child, monkeypatch):
    pid = plain_child.pid
    src = HostSource(find_torch=False)
    src.watch([pid])
    (sample,) = src.read().processes
    start = sample.start_time  # as `top` has it: what the view passes on
    assert start == pytest.approx(psutil.Process(pid).create_time(), abs=1.0)
    # A process that started a few ticks after the sampled one (the PID reused within the second) is another.
    sent, line = signal_process(pid, start - 0.05, signal.SIGTERM)
    assert not sent and "another process" in line
    sent, line = signal_process(pid, math.nan, signal.SIGTERM)
    assert not sent and "not visible from here" in line
    sent, line = signal_process(pid, start - 3600, signal.SIGTERM)  # the PID was reused since the sample
    assert not sent and "another process" in line
    sent, line = signal_process(os.getpid(), psutil.Process().create_time(), signal.SIGKILL)
    assert not sent and "phasescope itself" in line

    def denied(self: psutil.Process, sig: int) -> None:
        raise psutil.AccessDenied(self.pid)

    def denied_fd(fd: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    with monkeypatch.context() as m:
        m.setattr(host_module.psutil.Process, "send_signal", denied)
        m.setattr(host_module.signal, "pidfd_send_signal", denied_fd)
        sent, line = signal_process(pid, start, signal.SIGTERM)
    assert not sent and line == f"SIGTERM not sent to {pid}: permission denied (another user's process?)"
    assert plain_child.poll() is None  # nothing reached it so far

    assert signal_process(pid, start, signal.SIGTERM) == (True, f"sent SIGTERM to {pid}")
    assert plain_child.wait(timeout=30) == -signal.SIGTERM
    sent, line = signal_process(pid, start, signal.SIGTERM)
    assert not sent and "has exited" in line
