"""`top`'s process columns against hostile or misleading input: a process's argv (anyone's to choose,
`exec -a`) must not reach the terminal as escape sequences or break a row; in a container's own PID
namespace a GPU process's host PID must not be shown or signalled as the local process with the same
number; a PID reused within the second is not the sampled process; a filter that hides every row says so."""

from __future__ import annotations

import asyncio
import io
import math
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from rich.console import Console
from textual.widgets import DataTable

from phasescope.live.loop import feed
from phasescope.live.state import LiveState
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, ProcessSample, TickBatch
from phasescope.sources import host as host_module
from phasescope.sources.host import CombinedSource, HostSource, signal_process
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from phasescope.views.display import printable
from phasescope.views.tui import ConfirmScreen, TopApp, render_table
from tests.fakes.fake_nvml import FakeProcess

SPAR_BERT = "spar-a100/bert_sst2_amp_NVIDIA_A100_SXM4_40GB_90abf7ca_20260309_182528.parquet"
_WAIT = "import time; print('ready', flush=True); time.sleep(120)"


@contextmanager
def _two_watched_waiters() -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[str], TopApp]]:
    """Two real sleeping processes, watched by the host source, and a `top` app fed by it; both are killed
    after."""
    a = subprocess.Popen([sys.executable, "-c", _WAIT], stdout=subprocess.PIPE, text=True)
    b = subprocess.Popen([sys.executable, "-c", _WAIT], stdout=subprocess.PIPE, text=True)
    try:
        for proc in (a, b):
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        src = HostSource(find_torch=False)
        src.watch([a.pid, b.pid])
        state = LiveState(src.name)
        yield a, b, TopApp(state, lambda stop: feed(state, src, 0.1, stop), refresh_s=0.05)
    finally:
        for proc in (a, b):
            proc.kill()
            proc.wait(timeout=30)


async def _select(app: TopApp, pilot: Any, pid: int, both: set[int]) -> float:
    """Wait until the rows of all `both` show, then move the cursor onto `pid`'s row; the wait's deadline."""
    deadline = time.monotonic() + 10
    while both - {r.pid for r in app.shown_rows}:
        assert time.monotonic() < deadline
        await pilot.pause(0.05)
    while app.cursor_row() is None or app.cursor_row().pid != pid:  # type: ignore[union-attr]
        await pilot.press("down")
    return deadline
# An OSC title change, a screen clear, rich markup, a newline, a C1 CSI, DEL and a bidi override.
EVIL = "\x1b]0;pwned\x07\x1b[2J[bold]B[/bold]\nline2\x9b31m\x7f\u202eevil"
_RAW = ("\x1b", "\x07", "\x9b", "\x7f", "\u202e")


@pytest.fixture
def evil_child() -> Iterator[subprocess.Popen[str]]:
    # argv[0] chosen by the parent, as `exec -a` does: the hostile text comes first, where a cell shows it.
    proc = subprocess.Popen([EVIL, "-c", _WAIT], executable=sys.executable, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "child did not start"
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def _plain(state: LiveState, filter_text: str = "") -> str:
    out = io.StringIO()
    Console(file=out, width=340, color_system=None).print(render_table(state, "order", filter_text))
    return out.getvalue()


def test_printable_escapes_control_characters_and_keeps_text() -> None:
    assert printable(EVIL) == ("\\x1b]0;pwned\\x07\\x1b[2J[bold]B[/bold]\\nline2\\x9b31m\\x7f\\u202eevil")
    assert printable("python train.py --lr 3e-4 é 漢字") == "python train.py --lr 3e-4 é 漢字"


def test_a_hostile_argv_reaches_no_view_raw(evil_child: subprocess.Popen[str]) -> None:
    src = HostSource(find_torch=False)
    src.watch([evil_child.pid])
    state = LiveState(src.name)
    feed(state, src, 0.1, threading.Event(), duration=0.25)
    p = state.process_sample(src.devices()[0].uuid, evil_child.pid)
    assert p is not None and p.cmdline.startswith("\\x1b]0;pwned")
    assert not any(c in p.cmdline for c in (*_RAW, "\n"))
    out = _plain(state)
    assert not any(c in out for c in _RAW), "a control character reached the terminal"
    (line,) = [ln for ln in out.splitlines() if str(evil_child.pid) in ln]  # one line, not broken by "\n"
    assert "\\x1b]0;pwned" in line and "[bold]B[/bold]" in line  # shown as text, markup not read

    app = TopApp(state, None)

    async def check() -> None:
        async with app.run_test(size=(220, 24)) as pilot:
            await pilot.pause(0.1)
            while app.cursor_row() is not None and app.cursor_row().pid != evil_child.pid:  # type: ignore[union-attr]
                await pilot.press("down")
            detail = str(app.query_one("#detail").render())
            assert "\\x1b]0;pwned" in detail and not any(c in detail for c in _RAW)
            await pilot.press("k")
            assert isinstance(app.screen, ConfirmScreen)
            assert "\\x1b]0;pwned" in app.screen.question and not any(c in app.screen.question for c in _RAW)
            await pilot.press("n")

    asyncio.run(check())
    assert evil_child.poll() is None


def test_a_replayed_name_with_escapes_is_shown_escaped() -> None:
    gpu = DeviceInfo("GPU-1", "NVIDIA H100 80GB HBM3", 0)
    state = LiveState("replay")
    p = ProcessSample(time=100.0, pid=7, device_uuid=gpu.uuid, name="\x1b[2Jx")
    state.ingest(TickBatch(100.0, [gpu], np.full((1, len(SIGNAL_NAMES)), 0.5), processes=[p]))
    out = _plain(state)
    assert "\x1b" not in out and "\\x1b[2Jx" in out


@pytest.fixture
def plain_child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _WAIT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def test_in_another_pid_namespace_a_gpu_pid_is_not_taken_for_ours(
    fake_nvml, shared_data: Path, plain_child: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a container NVML names the host's PIDs (the driver knows no PID namespaces); the same number in our
    /proc may be another process (here: the child stands for it). Nothing of it is taken for the GPU
    process's: not its numbers, name, user, start or command; so `k` cannot signal it."""
    monkeypatch.setattr(host_module.os, "readlink", lambda path: "pid:[4026532999]")  # not the initial one
    assert not host_module.in_init_pid_namespace()
    traces = read(shared_data / SPAR_BERT)
    fake_nvml(traces, processes={0: [FakeProcess(plain_child.pid, 2**30, sm_util_pct=10)]})
    src = CombinedSource(NvmlSource(), HostSource(find_torch=False))
    (p,) = [q for q in src.read().processes if q.pid == plain_child.pid]
    assert p.gpu_mem_used == 2**30
    assert math.isnan(p.start_time) and p.user == "" and p.cmdline == ""
    assert p.name == "" and math.isnan(p.rss) and math.isnan(p.cpu_util)
    sent, line = signal_process(p.pid, p.start_time, signal.SIGTERM)
    assert not sent and "not visible from here" in line
    src.close()
    time.sleep(0.05)
    assert plain_child.poll() is None


def test_initial_pid_namespace_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_module.os, "readlink", lambda path: "pid:[4026531836]")
    assert host_module.in_init_pid_namespace()


def test_a_filter_that_hides_every_row_says_so() -> None:
    gpu = DeviceInfo("GPU-1", "NVIDIA H100 80GB HBM3", 0)
    state = LiveState("nvml")
    state.ingest(TickBatch(100.0, [gpu], np.full((1, len(SIGNAL_NAMES)), 0.5)))
    assert "no row matches 'nomatch'" in _plain(state, "nomatch")
    assert "no row matches" not in _plain(state, "h100")

    app = TopApp(state, None, filter_text="nomatch")

    async def check() -> None:
        async with app.run_test(size=(220, 24)) as pilot:
            await pilot.pause(0.1)
            assert not app.shown_rows
            assert str(app.query_one("#status").render()).startswith("no row matches 'nomatch'")

    asyncio.run(check())


def test_a_zombie_is_said_to_have_exited(plain_child: subprocess.Popen[str]) -> None:
    """Killed but not yet reaped by its parent: nothing to signal, and the status line says it exited rather
    than "sent"."""
    src = HostSource(find_torch=False)
    src.watch([plain_child.pid])
    (p,) = src.read().processes
    plain_child.kill()
    deadline = time.monotonic() + 10
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "child did not become a zombie"
        time.sleep(0.01)
    sent, line = signal_process(p.pid, p.start_time, signal.SIGTERM)
    assert not sent and line == f"SIGTERM not sent: process {p.pid} has exited"


def test_the_prompted_process_is_signalled_whatever_the_table_does_meanwhile() -> None:
    """While the y/n prompt is open, new ticks re-sort the rows and the cursor may land on another process:
    y still goes to the process the question named (a guard: the answer must not re-read the cursor)."""
    with _two_watched_waiters() as (a, b, app):

        async def go() -> None:
            async with app.run_test(size=(220, 24)) as pilot:
                await _select(app, pilot, a.pid, {a.pid, b.pid})
                await pilot.press("k")
                assert isinstance(app.screen, ConfirmScreen) and f"SIGTERM to {a.pid} " in app.screen.question
                app.sort = "name"
                app.redraw(force=True)
                table = app.query_one("#table", DataTable)
                table.move_cursor(row=[r.pid for r in app.shown_rows].index(b.pid))
                await pilot.pause(0.3)  # ticks go on under the prompt
                assert app.cursor_row().pid == b.pid  # type: ignore[union-attr]
                await pilot.press("y")
                assert a.wait(timeout=30) == -signal.SIGTERM

        asyncio.run(go())
        assert b.poll() is None


def test_a_narrow_terminal_drops_command_lines_before_columns() -> None:
    """`top --once` in a terminal: a process's command line must not hide columns that fit without it, nor
    wrap into a line per word; the title says it was left out."""
    gpu = DeviceInfo("GPU-1", "NVIDIA H100 80GB HBM3", 0)
    tables = {}
    for cmd in ("", "python train.py " + " ".join(f"--opt{k}=value{k}" for k in range(40))):
        state = LiveState("nvml+host")
        p = ProcessSample(time=100.0, pid=4242, device_uuid=gpu.uuid, name="python", cpu_util=0.97, rss=2**30,
                          gpu_mem_used=40 * 2**30, user="alice", start_time=100.0 - 3 * 3600, cmdline=cmd)
        for t in range(30):
            state.ingest(TickBatch(100.0 + t, [gpu], np.full((1, len(SIGNAL_NAMES)), 0.5), processes=[p]))
        state.set_phase(gpu.uuid, "training", 0.93, 40.0)
        out = io.StringIO()
        Console(file=out, width=200, color_system=None).print(render_table(state, width=200))
        tables[bool(cmd)] = out.getvalue().splitlines()
    bare, with_cmd = tables[False], tables[True]
    assert bare[0].strip() == "phasescope · 4 column(s) hidden: widen the terminal to see them"
    assert with_cmd[0].strip() == ("phasescope · 4 column(s) and command lines hidden: widen the terminal to "
                                   "see them")
    assert len(with_cmd) == len(bare) and "train.py" not in "\n".join(with_cmd)
    wide = io.StringIO()
    Console(file=wide, width=400, color_system=None).print(render_table(state, width=400))
    text = wide.getvalue()
    assert text.splitlines()[0].strip() == "phasescope" and "python train.py --opt0" in text


def test_when_the_selected_process_exits_k_aims_at_no_neighbour() -> None:
    """The selected process row goes (the process exited): the cursor does not slide onto the next process,
    so a `k` pressed in that moment is refused, not aimed at another process (a guard)."""
    with _two_watched_waiters() as (a, b, app):

        async def go() -> None:
            async with app.run_test(size=(220, 24)) as pilot:
                deadline = await _select(app, pilot, a.pid, {a.pid, b.pid})
                a.kill()
                a.wait(timeout=30)
                while any(r.pid == a.pid for r in app.shown_rows):
                    assert time.monotonic() < deadline + 10
                    await pilot.pause(0.05)
                await pilot.press("k")
                assert not isinstance(app.screen, ConfirmScreen)
                assert str(app.query_one("#status").render()).endswith("select a process row (└) first")

        asyncio.run(go())
        assert b.poll() is None
