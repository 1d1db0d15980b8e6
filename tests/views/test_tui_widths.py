"""The terminal at common widths (80, 120, 160 columns), driven with textual's pilot over real recorded
telemetry: columns chosen by priority, a help box that reflows, a footer that fits the mode, and a replay's
status line on the trace's own clock."""

from __future__ import annotations

import asyncio
import re
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from rich.text import Text
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widgets import DataTable, Static
from textual.widgets._footer import FooterKey

from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState
from phasescope.schema import Trace
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.views.table import COLUMNS, ESSENTIAL, status_line
from phasescope.views.tui import HELP_INTRO, HELP_KEYS, HELP_NOTES, HelpScreen, TopApp
from tests.live_helpers import ticks, training_traces

GEMM_ON_GPU1 = "sensorguard-rtx3090/20260825_hpc_gemm_verifier-gpu1_s3_r03/nvml.csv"
WIDTHS = (80, 120, 160)
SIGNAL_KEYS = {"k", "K", "i"}


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


@pytest.fixture(scope="module")
def busy(shared_data: Path) -> LiveState:
    """A GEMM running on GPU 1 for a minute beside an idle GPU 0, with a phase call on GPU 1."""
    traces = read(shared_data / GEMM_ON_GPU1)
    t1 = traces[1]
    state = LiveState("replay")
    for batch in ticks(traces, 0, int(t1.time.searchsorted(t1.meta["t_from"] + 60))):
        state.ingest(batch)
    state.set_phase(t1.device.uuid, "training", 0.93, 40.0)
    return state


def _screen_lines(widget: Static) -> list[str]:
    """The widget as drawn (border and padding included), one string per terminal line."""
    size = widget.outer_size
    return [strip.text for strip in widget.render_lines(Region(0, 0, size.width, size.height))]


def test_columns_by_priority_fit_each_width(busy: LiveState) -> None:
    """At 160 columns energy, temperature, clocks and PCIe were off-screen behind one-column scrolling:
    now each width shows the essentials and then what fits, in priority order, with nothing off-screen."""
    shown: dict[int, list[str]] = {}

    async def go(width: int) -> None:
        app = TopApp(busy, None, refresh_s=0.05)
        async with app.run_test(size=(width, 40)) as pilot:
            await pilot.pause(0.1)
            table = app.query_one("#table", DataTable)
            shown[width] = [str(c.key.value) for c in table.ordered_columns]
            assert shown[width] == app.shown_columns
            assert set(shown[width]) >= ESSENTIAL  # never hidden
            # Every shown column lies on the screen: no horizontal scrolling to reach one.
            assert table.virtual_size.width <= width
            assert table.max_scroll_x == 0

    for width in WIDTHS:
        asyncio.run(go(width))
    assert shown[80] == [c.key for c in COLUMNS if c.key in ESSENTIAL]
    assert {"energy", "kpi"} <= set(shown[120])
    assert {"energy", "kpi", "temp", "clocks"} <= set(shown[160])
    assert set(shown[80]) < set(shown[120]) < set(shown[160])
    for keys in shown.values():  # in COLUMNS' (priority) order, Notes last
        assert keys == [c.key for c in COLUMNS if c.key in keys] and keys[-1] == "info"


def test_widening_the_terminal_adds_columns(busy: LiveState) -> None:
    app = TopApp(busy, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=(80, 40)) as pilot:
            await pilot.pause(0.1)
            narrow = list(app.shown_columns)
            await pilot.resize_terminal(160, 40)
            await pilot.pause(0.2)
            assert set(narrow) < set(app.shown_columns)
            cells = app.query_one("#table", DataTable).get_row(busy.snapshot().devices[1].info.uuid)
            assert len(cells) == len(app.shown_columns)  # rows redrawn with the new columns

    _run(go)


def test_arrow_keys_scroll_by_a_whole_column(busy: LiveState) -> None:
    """Narrower than the essentials (50 columns), → moved the table one character a press."""
    app = TopApp(busy, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=(50, 20)) as pilot:
            await pilot.pause(0.1)
            table = app.query_one("#table", DataTable)
            first = table.ordered_columns[0].get_render_width(table)
            await pilot.press("right")
            await pilot.pause(0.1)
            assert table.scroll_x == min(first, table.max_scroll_x) > 1
            await pilot.press("left")
            await pilot.pause(0.1)
            assert table.scroll_x == 0
            await pilot.press(*["right"] * len(table.ordered_columns))  # one press a column: at the end
            await pilot.pause(0.1)
            assert table.scroll_x == table.max_scroll_x > first

    _run(go)


@pytest.mark.parametrize("width", WIDTHS)
def test_help_box_reflows_to_the_terminal(busy: LiveState, width: int) -> None:
    """The help text was hard-wrapped at ~100 columns, so a narrower box broke each line again into orphan
    words. Each paragraph now reads exactly as the same text wrapped at the box's width."""
    app = TopApp(busy, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=(width, 40)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause(0.1)
            assert isinstance(app.screen, HelpScreen)
            box = app.screen.query_one("#help-text", Static)
            assert box.region.right <= width and box.region.x >= 0  # the whole box is on the screen
            inner = box.content_region.width
            lines = [re.sub(r"^[│ ]+|[│ ]+$", "", ln) for ln in _screen_lines(box)]
            lines = [" ".join(ln.split()) for ln in lines]  # the badge's padding spaces, trailing blanks
            for para in (*HELP_INTRO, *HELP_NOTES):
                plain = Text.from_markup(para).plain
                want = [" ".join(ln.split()) for ln in textwrap.wrap(plain, inner, break_on_hyphens=False)]
                at = lines.index(want[0])
                assert lines[at:at + len(want)] == want, para
            assert "Press any key to close." in lines  # fits 40 rows: nothing cut at the bottom
            # The keys' grid: each description wrapped at its own column's width, under itself.
            raw = [re.sub(r"^│ ?|[ │]*$", "", ln) for ln in _screen_lines(box)]
            col = max(len(key) for key, _ in HELP_KEYS) + 2  # the key column and the grid's gap
            start = next(i for i, ln in enumerate(raw) if ln.startswith(HELP_KEYS[0][0] + "  "))
            at = start
            for key, what in HELP_KEYS:
                want = textwrap.wrap(what, inner - col, break_on_hyphens=False)
                assert raw[at][:col].strip() == key
                assert [ln[col:].rstrip() for ln in raw[at:at + len(want)]] == want, key
                assert all(not ln[:col].strip() for ln in raw[at + 1:at + len(want)])  # under itself
                at += len(want)

    _run(go)


def test_help_scrolls_in_a_short_terminal(busy: LiveState) -> None:
    """At 80x24 the help is taller than the screen: ↓ scrolls it (nothing cut for good), another key
    closes it."""
    app = TopApp(busy, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause(0.1)
            box = app.screen.query_one("#help-box")
            assert box.region.height <= 24 and box.max_scroll_y > 0
            await pilot.press("end")
            await pilot.pause(0.1)
            assert box.scroll_y == box.max_scroll_y and isinstance(app.screen, HelpScreen)
            await pilot.press("x")
            await pilot.pause(0.1)
            assert not isinstance(app.screen, HelpScreen)

    _run(go)


async def _footer(pilot: Pilot[None], app: TopApp, expect: set[str]) -> list[FooterKey]:
    """The footer's keys once it has drawn `expect` (it recomposes a moment after the bindings change)."""
    deadline = time.monotonic() + 10
    while not expect <= {k.key for k in app.query(FooterKey)}:
        assert time.monotonic() < deadline, f"footer never showed {expect}"
        await pilot.pause(0.05)
    await pilot.pause(0.1)
    return list(app.query(FooterKey))


@pytest.mark.parametrize("width", WIDTHS)
def test_footer_offers_signal_keys_only_for_this_hosts_processes(busy: LiveState, width: int) -> None:
    """A replay's processes are not this host's: k / K were offered and then refused. Now the footer shows
    k, K and i only where they work, and every key it shows is on the screen."""
    replay = TopApp(busy, None, refresh_s=0.05)
    host_state = LiveState("nvml+host")
    host_state.set_local_processes(True)
    host = TopApp(host_state, None, refresh_s=0.05)
    seen: dict[str, set[str]] = {}

    async def go(app: TopApp, name: str) -> None:
        async with app.run_test(size=(width, 40)) as pilot:
            keys = await _footer(pilot, app, {"q", "question_mark"})
            seen[name] = {k.key for k in keys}
            assert all(k.region.right <= width for k in keys), [(k.key, k.region) for k in keys]

    asyncio.run(go(replay, "replay"))
    asyncio.run(go(host, "host"))
    assert not seen["replay"] & SIGNAL_KEYS
    assert seen["host"] >= SIGNAL_KEYS
    assert {"q", "s", "slash", "question_mark"} <= seen["replay"] & seen["host"]


def test_footer_follows_the_tick_loop_saying_whose_processes(busy: LiveState) -> None:
    """`top` on this host: the tick loop says the processes are local after the app started; the footer
    then offers the signal keys."""
    state = LiveState("nvml+host")
    app = TopApp(state, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            assert not {k.key for k in await _footer(pilot, app, {"q"})} & SIGNAL_KEYS
            state.set_local_processes(True)
            await _footer(pilot, app, SIGNAL_KEYS)

    _run(go)


def _replay(traces: list[Trace], now: list[float], *, loop: bool = False) -> tuple[ReplaySource, LiveState,
                                                                                    TickLoop]:
    source = ReplaySource(traces, speed=10.0, loop=loop, clock=lambda: now[0], wall_clock=lambda: 1_000.0)
    state = LiveState(source.name)
    return source, state, TickLoop(source, 1.0, state)


H100_EPOCH_CLOCK = "nvidia-smi-h100-training/ckpt1.csv"  # stamped in Unix time (2025-07-27)


def _trace_time(stamp: float) -> str:
    """How the status line writes a trace's time: a date where the log is on Unix time, else its own clock."""
    if stamp > 1e9:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    return f"t={stamp:.0f}s"


def _own_clock(traces: list[Trace]) -> list[Trace]:
    """The same recording on a log's own clock (seconds of uptime) with no UTC anchor: no date to show."""
    start = min(float(t.time[0]) for t in traces)
    return [Trace(t.device, t.time - start + 16_000.0, t.columns,
                  {k: v for k, v in t.meta.items() if k != "utc_offset"}) for t in traces]


@pytest.mark.parametrize("log", [H100_EPOCH_CLOCK, "own clock"])
def test_replay_status_line_shows_the_trace_time_not_the_wall(shared_data: Path, log: str) -> None:
    """At 10x, 10 real seconds play 100 recorded ones: the status line says the recording's own time at the
    newest tick, not a wall clock running ten times faster (a log on its own uptime clock: its seconds,
    not a time in 1970)."""
    epoch = log == H100_EPOCH_CLOCK
    traces = read(shared_data / log)[:1] if epoch else _own_clock(training_traces(shared_data))
    now = [0.0]
    source, state, loop = _replay(traces, now)
    now[0] = 10.0
    loop.on_tick(source.read())
    want = f"replay 10× · {_trace_time(source.t0 + 100.0)} (trace time)"
    assert (source.t0 > 1e9) == epoch and "1970" not in want
    assert status_line(state).startswith(want + " · ")
    assert state.clock_offset_s == pytest.approx(source.clock_offset_s)
    app = TopApp(state, None, refresh_s=0.05)

    async def go() -> None:
        async with app.run_test(size=(80, 40)) as pilot:
            await pilot.pause(0.1)
            assert str(app.query_one("#status", Static).render()).startswith(want)

    _run(go)
    live = LiveState("nvml")
    live.ingest(next(ticks(traces, 0, 1)))
    assert "trace time" not in status_line(live) and status_line(live).startswith("nvml · ")


def test_a_looping_replay_starts_its_clock_over(shared_data: Path) -> None:
    traces = _own_clock(training_traces(shared_data))
    now = [0.0]
    source, state, loop = _replay(traces, now, loop=True)
    now[0] = (source.period + 30.0) / source.speed  # 30 recorded seconds into the second pass
    loop.on_tick(source.read())
    assert f"{_trace_time(source.t0 + 30.0)} (trace time)" in status_line(state)
