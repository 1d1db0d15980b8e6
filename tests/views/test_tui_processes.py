"""`top`'s process rows on real child processes: k / K / i send SIGTERM / SIGKILL / SIGINT to the selected
process row after a y/n prompt, only where the processes are this host's; the detail line under the table
shows the selected process's whole command line; the plain table cuts a long command, not other columns."""

from __future__ import annotations

import asyncio
import io
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

import numpy as np
import psutil
import pytest
from rich.console import Console
from textual.pilot import Pilot

from phasescope.live.loop import feed
from phasescope.live.state import LiveState
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, ProcessSample, TickBatch
from phasescope.sources.host import HostSource
from phasescope.views.tui import ConfirmScreen, TopApp, _natural_width, render_table

SIZE = (220, 24)
_WAIT = "import time; print('ready', flush=True); time.sleep(120)"


def _spawn(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WAIT, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "child did not start"
    return proc


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = _spawn("--run-name", "sweep-7")
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


async def _until(pilot: Pilot[None], cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)


def _host_app(*pids: int) -> TopApp:
    """`top --source host` watching `pids`: the real host source through the real sampler."""
    source = HostSource(find_torch=False)
    source.watch(pids)
    state = LiveState(source.name)
    return TopApp(state, lambda stop: feed(state, source, 0.1, stop), refresh_s=0.05)


async def _select(pilot: Pilot[None], app: TopApp, pid: int) -> None:
    """Move the cursor down, as a user would, to the process row of `pid`."""
    await _until(pilot, lambda: any(r.pid == pid for r in app.shown_rows))
    for _ in range(len(app.shown_rows)):
        row = app.cursor_row()
        if row is not None and row.pid == pid:
            return
        await pilot.press("down")
    raise AssertionError(f"no row for {pid}")


def _status(app: TopApp) -> str:
    return str(app.query_one("#status").render())


def test_k_asks_then_terminates_the_selected_process(child: subprocess.Popen[str]) -> None:
    app = _host_app(child.pid)
    pid = child.pid
    name = psutil.Process(pid).name()

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await _select(pilot, app, pid)
            detail = str(app.query_one("#detail").render())  # the whole command, with who and since when
            assert detail.startswith(f"PID {pid} · {psutil.Process(pid).username()} · started ")
            assert detail.endswith(f"{sys.executable} -c {_WAIT} --run-name sweep-7")

            await pilot.press("k")
            assert isinstance(app.screen, ConfirmScreen)
            assert app.screen.question.startswith(f"Send SIGTERM to {pid} {name} (")
            question = app.screen.question
            assert question.endswith("…? y/n") and f"): {sys.executable} -c import" in question
            await pilot.press("n")
            assert not isinstance(app.screen, ConfirmScreen)
            assert _status(app).endswith(f"SIGTERM to {pid}: not sent")
            assert child.poll() is None

            await pilot.press("k", "q")  # the prompt takes every key: q answers no, it does not quit
            assert app.is_running and child.poll() is None

            await pilot.press("k", "y")
            assert child.wait(timeout=30) == -signal.SIGTERM
            assert _status(app).endswith(f"sent SIGTERM to {pid}")
            await _until(pilot, lambda: all(r.pid != pid for r in app.shown_rows))  # gone from the table
            assert not app.query_one("#detail").has_class("shown")

    _run(go)


@pytest.mark.parametrize(("key", "sig"), [("K", signal.SIGKILL), ("i", signal.SIGINT)])
def test_shift_k_kills_and_i_interrupts(child: subprocess.Popen[str], key: str, sig: signal.Signals) -> None:
    app = _host_app(child.pid)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await _select(pilot, app, child.pid)
            await pilot.press(key)
            assert isinstance(app.screen, ConfirmScreen) and sig.name in app.screen.question
            await pilot.press("y")
            # SIGINT in a Python child is KeyboardInterrupt, which Python ends by dying of SIGINT too.
            assert child.wait(timeout=30) == -sig
            assert _status(app).endswith(f"sent {sig.name} to {child.pid}")

    _run(go)


def test_a_process_gone_before_the_answer_is_not_signalled(child: subprocess.Popen[str]) -> None:
    """Between the prompt and y the process exits: nothing is sent (its PID could be another's by then)."""
    app = _host_app(child.pid)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await _select(pilot, app, child.pid)
            await pilot.press("k")
            child.kill()
            child.wait(timeout=30)
            await pilot.press("y")
            assert _status(app).endswith(f"SIGTERM not sent: process {child.pid} has exited")

    _run(go)


def test_refused_on_a_device_row_and_for_processes_from_elsewhere(child: subprocess.Popen[str]) -> None:
    app = _host_app(child.pid)

    async def on_host() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: any(r.pid == child.pid for r in app.shown_rows))
            assert app.cursor_row() is not None and app.cursor_row().kind == "device"  # type: ignore[union-attr]
            await pilot.press("k")
            assert not isinstance(app.screen, ConfirmScreen)
            assert _status(app).endswith("SIGTERM not sent: select a process row (└) first")
            await pilot.press("slash", "k", "i")  # in the filter box the keys are text
            assert app.filter_text == "ki" and not isinstance(app.screen, ConfirmScreen)

    _run(on_host)

    # A replay (or anything not sampling this host) may name a PID that is alive here by chance: refused.
    state = LiveState("replay")
    gpu = DeviceInfo("GPU-replayed")
    real = psutil.Process(child.pid)
    p = ProcessSample(time=time.time(), pid=child.pid, device_uuid=gpu.uuid, name="python",
                      start_time=real.create_time(), user=real.username())
    state.ingest(TickBatch(p.time, [gpu], np.full((1, len(SIGNAL_NAMES)), np.nan),
                           processes=[p]))
    replay_app = TopApp(state, None)

    async def on_replay() -> None:
        async with replay_app.run_test(size=SIZE) as pilot:
            await _select(pilot, replay_app, child.pid)
            await pilot.press("K")
            assert not isinstance(replay_app.screen, ConfirmScreen)
            said = "SIGKILL not sent: the replay source's processes are not this host's to signal"
            assert _status(replay_app).endswith(said)

    _run(on_replay)
    assert child.poll() is None


def test_plain_table_cuts_a_long_command_line_not_the_other_columns() -> None:
    """Piped `top` prints one line per row at a fixed width (cli/top PLAIN_WIDTH; narrower here, as a GPU
    with every column filled is): a long command line is cut in Notes (the last column), and the phase and
    the rest keep their whole text."""
    gpu = DeviceInfo("GPU-1", "NVIDIA H100 80GB HBM3", 0)
    state = LiveState("nvml+host")
    p = ProcessSample(time=100.0, pid=4242, device_uuid=gpu.uuid, name="python", cpu_util=0.97, rss=2**30,
                      gpu_mem_used=40 * 2**30, user="alice", start_time=100.0 - 3 * 3600,
                      cmdline="python train.py " + " ".join(f"--opt{k}=value{k}" for k in range(40)))
    state.ingest(TickBatch(100.0, [gpu], np.full((1, len(SIGNAL_NAMES)), 0.5), processes=[p]))
    state.set_phase(gpu.uuid, "training", 0.93, 40.0)
    table = render_table(state)
    width = _natural_width(table) - 30
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("│")]
    assert len(lines) == 2 and all(len(ln) <= width for ln in lines)
    device, proc = lines
    assert " training 93% " in device and "#0 NVIDIA H100 80GB HBM3" in device
    assert "└ 4242 python (alice)" in proc and "dev 40.0 GiB · rss 1.0 GiB" in proc
    assert "up 3h00m · python train.py --opt0=value0" in proc and proc.rstrip(" │").endswith("…")
