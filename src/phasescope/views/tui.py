"""The live views over `LiveState`: a full-screen textual app (keyboard only, fine over SSH) and a plain
rich table for scripts. Both are thin: every number and string comes from views/table.py.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from itertools import accumulate

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Header, Input, Static

from phasescope.live.state import LiveSnapshot, LiveState
from phasescope.sources.host import signal_process
from phasescope.views.display import MISSING, ellipsize, printable
from phasescope.views.palette import HELD_IDLE, PALETTE, look
from phasescope.views.table import (
    COLUMN_KEYS,
    COLUMNS,
    ESSENTIAL,
    IDLE_HELD,
    SORT_KEYS,
    Row,
    process_detail,
    status_line,
)
from phasescope.views.table import rows as table_rows

# The `?` box: paragraphs as single lines, so the box reflows them to the terminal's width (no hard wraps
# that leave orphan words), and the keys as a two-column grid whose descriptions wrap under themselves.
HELP_INTRO = (
    "[b]phasescope top[/b]: one row per device, its processes as sub-rows (└).",
    "Phase is the live classifier's call on the last minute, with its confidence ([b](held)[/b]: the newest "
    "minute could not be judged, so the phase and % are the last judged ones); Phase KPIs are step time, "
    "samples/s and MFU for training, requests/s and p50/p99 latency for inference (from hooks: --events, or "
    "a serving engine's /metrics: --scrape). Energy · cost is so far, at the configured prices. A device in "
    f"[{PALETTE[HELD_IDLE].terminal}] IDLE·HELD [/] is idle while a process (or its memory) holds it.",
)
HELP_KEYS = (
    ("s", "cycle the sort column: order, phase, util, mem, power, temp, name"),
    ("/", "filter rows (device, uuid, process name, pid, user or command line, a phase, idle-held); Enter "
          "keeps it, Esc clears it"),
    ("k / K / i", "send SIGTERM / SIGKILL / SIGINT to the selected process row, after a y/n prompt (this "
                  "host's processes only: not in a replay)"),
    ("↑ ↓ PgUp PgDn ← →", "move and scroll (← → by a column; here, ↑ ↓ scroll this help)"),
    ("?", "this help"),
    ("q / Ctrl-C", "quit"),
)
HELP_NOTES = (
    "Columns that do not fit the terminal are left out, the least useful first: sparklines, PCIe, clocks, "
    "temperature, the KPIs, energy · cost.",
    "Util is the device's utilisation; on a process row it is that process's CPU (100% = one core). A "
    "process row shows its user, RSS and its share of host RAM (%MEM), how long it has run (up) and its "
    "command line; the line under the table has the selected process's whole command. A value the source did "
    "not give is shown as [b]–[/b], never as 0.",
    "With a live store (--store, or the default one), sparklines and the phase start from its recent history "
    "(--history); a blank column marks where this session's samples begin.",
    "Press any key to close.",
)


def help_body() -> Group:
    """The help box's text, wrapped by rich to whatever width the box has."""
    keys = Table.grid(padding=(0, 2))
    keys.add_column(no_wrap=True)
    keys.add_column()
    for key, what in HELP_KEYS:
        keys.add_row(Text(key, style="bold"), what)
    parts: list[Text | Table] = []
    for para in HELP_INTRO:
        parts += [Text.from_markup(para), Text()]
    parts += [keys, Text()]
    for para in HELP_NOTES:
        parts += [Text.from_markup(para), Text()]
    return Group(*parts[:-1])


class HelpScreen(ModalScreen[None]):
    """Key help, scrolled with ↑ ↓ PgUp PgDn Home End where the terminal is too short for it; any other
    key closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 100%; max-width: 110; height: auto; max-height: 100%; border: round $accent; padding: 0 1;
        background: $surface;
    }
    HelpScreen Static { width: 100%; }
    """
    SCROLL_KEYS = frozenset({"up", "down", "pageup", "pagedown", "home", "end"})

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box", can_focus=False):
            yield Static(help_body(), id="help-text")

    def on_key(self, event: events.Key) -> None:
        # Stop it here: the app's own keys (q, s, /) must not act through the modal, only close it.
        event.stop()
        event.prevent_default()
        if event.key not in self.SCROLL_KEYS:
            self.dismiss()
            return
        box = self.query_one("#help-box", VerticalScroll)
        {"up": box.scroll_up, "down": box.scroll_down, "pageup": box.scroll_page_up,
         "pagedown": box.scroll_page_down, "home": box.scroll_home, "end": box.scroll_end}[event.key](
            animate=False)


class ConfirmScreen(ModalScreen[bool]):
    """A one-line y/n question at the bottom; y answers yes, any other key no."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center bottom; }
    ConfirmScreen > Static { width: 100%; height: 1; background: $warning; color: $text; padding: 0 1; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(Text(self.question, no_wrap=True), id="confirm-text")

    def on_key(self, event: events.Key) -> None:
        event.stop()  # the app's keys (q, s, k) must not act while the question is open
        event.prevent_default()
        self.dismiss(event.character in ("y", "Y"))


class ColumnTable(DataTable[Text]):
    """The live table, where ← → scroll by a whole column (by one character, a column took ~20 presses)."""

    def _column_edges(self) -> list[int]:
        return list(accumulate((c.get_render_width(self) for c in self.ordered_columns), initial=0))

    def action_cursor_right(self) -> None:
        x = self.scroll_x
        self.scroll_to(x=next((e for e in self._column_edges() if e > x), x), animate=False, immediate=True)

    def action_cursor_left(self) -> None:
        x = self.scroll_x
        to = max((e for e in self._column_edges() if e < x), default=0)
        self.scroll_to(x=to, animate=False, immediate=True)


class TopApp(App[None]):
    """Full-screen live table. `start_sampling(stop)` runs in a worker thread and feeds the shared state."""

    TITLE = "phasescope"
    DEFAULT_CSS = """
    #table { height: 1fr; }
    #status { height: 1; background: $boost; padding: 0 1; }
    #detail { display: none; height: auto; max-height: 3; background: $panel; padding: 0 1; }
    #detail.shown { display: block; }
    #filter { dock: bottom; display: none; }
    #filter.shown { display: block; }
    """
    BINDINGS = [  # noqa: RUF012 (textual's own declaration style)
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("s", "cycle_sort", "Sort"),
        Binding("slash", "start_filter", "Filter"),
        # Offered in the footer only where they work (this host's processes, `check_action`); elsewhere (a
        # replay) the same keys say why nothing is sent.
        Binding("k", "signal('SIGTERM')", "Term"),
        Binding("K", "signal('SIGKILL')", "Kill"),
        Binding("i", "signal('SIGINT')", "Int"),
        Binding("k", "refuse_signal('SIGTERM')", show=False),
        Binding("K", "refuse_signal('SIGKILL')", show=False),
        Binding("i", "refuse_signal('SIGINT')", show=False),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(
        self,
        state: LiveState,
        start_sampling: Callable[[threading.Event], None] | None = None,
        *,
        refresh_s: float = 0.5,
        duration: float | None = None,
        sort: str = "order",
        filter_text: str = "",
        web_url: str | None = None,
    ) -> None:
        super().__init__()
        self.state = state
        self.web_url = web_url  # shown in the header for the whole session (the status line moves on)
        self._start_sampling = start_sampling
        self._refresh_s = refresh_s
        self._duration = duration
        self.sort = sort
        self.filter_text = filter_text
        self.stop_event = threading.Event()
        self._worker: threading.Thread | None = None
        self._drawn: tuple[int, str, str, int] | None = None
        self.shown_rows: list[Row] = []
        self.shown_columns: list[str] = []  # keys of the COLUMNS that fit the terminal, in order
        self._local = state.local_processes  # the footer's keys follow it

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield ColumnTable(id="table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="detail")
            yield Static("", id="status")
        yield Input(placeholder="filter: device, uuid, process name, pid, user or command", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#table", DataTable)
        if self._start_sampling is not None:
            self._worker = threading.Thread(
                target=self._start_sampling, args=(self.stop_event,), name="phasescope-sampler", daemon=True
            )
            self._worker.start()
        if self._duration is not None:
            self.set_timer(self._duration, self.exit)
        self.set_interval(self._refresh_s, self.redraw)
        self.redraw()
        table.focus()

    def on_unmount(self) -> None:
        self.stop_sampling()

    def stop_sampling(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        if self._worker is not None and self._worker.is_alive():
            self._worker.join(timeout)

    # ---- drawing ----

    def redraw(self, force: bool = False) -> None:
        """Redraw the table when the state, sort or filter changed; the status line every time."""
        try:
            status = self.query_one("#status", Static)
            table = self.query_one("#table", DataTable)
        except NoMatches:  # shutting down: the refresh timer can tick once more after the widgets went
            return
        self.sub_title = header_text(self.sort, self.filter_text, self.web_url)
        if self.state.local_processes != self._local:  # the tick loop said whose processes these are
            self._local = self.state.local_processes
            self.refresh_bindings()
        key = (self.state.version, self.sort, self.filter_text, self.size.width)  # width: what columns fit
        if key != self._drawn or force:
            self._draw_table(table, key)
            self._show_detail()
        status.update(Text(status_text(self.state, self.filter_text, len(self.shown_rows)), no_wrap=True))

    def _draw_table(self, table: DataTable[Text], key: tuple[int, str, str, int]) -> None:
        same_view = self._drawn is not None and key[1:] == self._drawn[1:]  # only new samples
        self._drawn = key
        cursor = self.cursor_row()
        selected = cursor.key if cursor is not None else None
        scroll = (table.scroll_x, table.scroll_y)
        rows = table_rows(self.state, self.sort, self.filter_text)
        cells = [styled_cells(row) for row in rows]
        # The room a row has: the terminal's width, less a vertical scrollbar's where the rows overflow.
        tall = len(rows) + 1 > (table.size.height or self.size.height)
        room = self.size.width - (table.styles.scrollbar_size_vertical if tall else 0)
        shown, name_chars = fit_columns(cells, [r.kind for r in rows], room, 2 * table.cell_padding)
        for row_cells in cells:
            row_cells[COLUMN_KEYS.index("name")].truncate(name_chars, overflow="ellipsis")
        keys_shown = [COLUMNS[i].key for i in shown]
        if keys_shown != self.shown_columns:
            table.clear(columns=True)
            for i in shown:
                table.add_column(COLUMNS[i].title, key=COLUMNS[i].key)
            self.shown_columns = keys_shown
        else:
            table.clear()  # which also scrolls home
        for row, row_cells in zip(rows, cells, strict=True):
            table.add_row(*(row_cells[i] for i in shown), key=row.key)
        self.shown_rows = rows
        keys = [r.key for r in rows]
        if selected in keys:
            table.move_cursor(row=keys.index(selected), scroll=not same_view)
        # A new sample must not undo the user's scrolling (→ to the right-hand columns of a narrow terminal,
        # PgDn through many rows); a new sort or filter shows the cursor's row instead.
        table.scroll_to(x=scroll[0], y=scroll[1] if same_view else None, animate=False, immediate=True)

    def cursor_row(self) -> Row | None:
        """The row under the cursor, None when the table is empty."""
        table = self.query_one("#table", DataTable)
        if table.row_count and 0 <= table.cursor_row < len(self.shown_rows):
            return self.shown_rows[table.cursor_row]
        return None

    def _show_detail(self) -> None:
        """The selected process in full (whole command line, start) under the table; hidden otherwise."""
        try:
            detail = self.query_one("#detail", Static)
        except NoMatches:
            return
        row = self.cursor_row()
        p = self.state.process_sample(row.device_uuid, row.pid) if row and row.pid is not None else None
        if p is None:
            detail.remove_class("shown")
            return
        detail.update(Text(printable(process_detail(p, self.state.host_mem_total))))
        detail.add_class("shown")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    # ---- actions ----

    def action_signal(self, name: str) -> None:
        """Ask y/n, then send signal `name` to the selected process row; refuse with one status line where
        it cannot go (not a process row, processes not from this host, the process gone)."""
        sig = signal.Signals[name]
        row = self.cursor_row()
        if row is None or row.pid is None:
            self._say(f"{name} not sent: select a process row (└) first")
            return
        if not self.state.local_processes:
            self.action_refuse_signal(name)
            return
        p = self.state.process_sample(row.device_uuid, row.pid)
        if p is None:
            self._say(f"{name} not sent: process {row.pid} is gone")
            return
        who = f"{p.pid} {p.name}".rstrip() + (f" ({p.user})" if p.user else "")
        cmd = f": {ellipsize(p.cmdline, 80)}" if p.cmdline else ""

        def answer(yes: bool | None) -> None:
            self._say(signal_process(p.pid, p.start_time, sig)[1] if yes else f"{name} to {p.pid}: not sent")

        self.push_screen(ConfirmScreen(printable(f"Send {name} to {who}{cmd}? y/n")), answer)

    def action_refuse_signal(self, name: str) -> None:
        self._say(f"{name} not sent: the {self.state.source_name or 'current'} source's processes are "
                  "not this host's to signal")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Signal keys act (and show in the footer) for this host's processes; else they only refuse."""
        if action == "signal":
            return self.state.local_processes
        if action == "refuse_signal":
            return not self.state.local_processes
        return True

    def _say(self, line: str) -> None:
        self.state.note(line)  # the status line shows the newest note
        self.redraw()

    def action_cycle_sort(self) -> None:
        self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]
        self.redraw()

    def action_start_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.value = self.filter_text
        box.focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_filter(keep=True)

    def on_key(self, event: object) -> None:
        key = getattr(event, "key", "")
        box = self.query_one("#filter", Input)
        if key == "escape" and box.has_class("shown"):
            self._close_filter(keep=False)

    def _close_filter(self, keep: bool) -> None:
        box = self.query_one("#filter", Input)
        if not keep:
            self.filter_text = ""
        box.remove_class("shown")
        self.query_one("#table", DataTable).focus()
        self.redraw()


IDLE_HELD_STYLE = PALETTE[HELD_IDLE].terminal  # the palette's held-idle colour, as on the fleet page


def header_text(sort: str, filter_text: str = "", web_url: str | None = None) -> str:
    """The header's subtitle: the dashboard's URL first (when one is served), then sort and filter."""
    parts = [f"dashboard {web_url}"] if web_url else []
    parts.append(f"sort: {sort}")
    if filter_text:
        parts.append(f"filter: {filter_text}")
    return " · ".join(parts)


def status_text(state: LiveState | LiveSnapshot, filter_text: str, rows_shown: int) -> str:
    """The status line; first, when a filter hides every row of a sampled table, that it does (an empty
    table alone reads as "nothing running")."""
    line = status_line(state)
    if filter_text.strip() and not rows_shown and state.ticks:
        return printable(f"no row matches {filter_text.strip()!r} · {line}")
    return line


def styled_cells(row: Row, with_cmd: bool = True) -> list[Text]:
    """A row's cells as rich Text: the phase as a badge in its palette colour, an idle-but-held device's
    name in held idle's. `with_cmd=False`: a process row's Notes without its command line."""
    base = "bold" if row.kind == "device" else "dim"
    out = []
    for col in COLUMNS:
        text = row.cells[col.key]
        if col.key == "info" and row.cmd and not with_cmd:
            text = text.removesuffix(f" · {row.cmd}")
        text = printable(text)  # a replay's or an old recording's names are not sanitized
        style = base
        if col.key == "phase" and row.phase and text != MISSING:
            style = look(row.phase).terminal
            text = f" {text} "
        elif row.idle_held and col.key in ("name", "info"):
            style = IDLE_HELD_STYLE if col.key == "name" or IDLE_HELD in text else base
        out.append(Text(text, style=style))
    return out


# Columns a narrow terminal drops first, in this order: the reverse of their priority (COLUMNS' order);
# the ESSENTIAL ones always stay.
NARROW_DROP: tuple[str, ...] = tuple(reversed([c.key for c in COLUMNS if c.key not in ESSENTIAL]))
_NEVER_WRAP = frozenset({"phase", "spark_util", "spark_power"})  # a badge, block characters
_GIVES_WAY = "info"  # Notes: last, and the one long free-form cell (a process's command line)


def fit_columns(cells: list[list[Text]], kinds: list[str], width: int, pad: int) -> tuple[list[int], int]:
    """Which of COLUMNS (indices, in order) the app shows in `width` terminal columns, and how many
    characters of a name fit: the ESSENTIAL ones always (where even they overflow, the device names are cut,
    to no less than the column's title), then the others in COLUMNS' (priority) order where they fit, each
    as wide as its title or widest cell plus `pad`. Notes counts its device rows only: a process's notes
    and command line may run off to the right (the detail line has the command whole) rather than hide the
    device's columns."""

    def need(i: int) -> int:
        key = COLUMNS[i].key
        body = [row[i].cell_len for row, kind in zip(cells, kinds, strict=True)
                if key != _GIVES_WAY or kind == "device"]
        return max([len(COLUMNS[i].title), *body]) + pad

    shown = [i for i, col in enumerate(COLUMNS) if col.key in ESSENTIAL]
    used = sum(need(i) for i in shown)
    name = COLUMN_KEYS.index("name")
    name_chars = need(name) - pad
    if used > width:
        name_chars = max(len(COLUMNS[name].title), name_chars - (used - width))
    for i, col in enumerate(COLUMNS):
        if col.key not in ESSENTIAL and used + need(i) <= width:
            shown.append(i)
            used += need(i)
    return sorted(shown), name_chars


def _one_line(cell: Text) -> Text:
    out = cell.copy()
    out.no_wrap, out.overflow = True, "ellipsis"
    return out


def render_table(
    state: LiveState, sort: str = "order", filter_text: str = "", web_url: str | None = None,
    width: int | None = None,
) -> Table:
    """The same table as the app, as one rich Table (for --once / --plain and logs); a dashboard served
    beside it (`web_url`) is named in the title of every table, as in the app's header.

    `width` (a terminal's columns): the table drops process command lines, then NARROW_DROP columns until
    it fits, and says so in its title, rather than letting rich squeeze every column (the phase shrank to
    nothing at 80 columns).
    """
    snap = state.snapshot()  # the rows and the status line of one moment
    rows = table_rows(snap, sort, filter_text)
    cells = [styled_cells(row) for row in rows]
    status = status_text(snap, filter_text, len(rows))
    hidden: list[str] = []
    has_cmd = with_cmd = any(row.cmd for row in rows)
    while True:
        shown = [i for i, col in enumerate(COLUMNS) if col.key not in hidden]
        title = "phasescope" + (f" · dashboard {web_url}" if web_url else "")
        what = [f"{len(hidden)} column(s)"] if hidden else []
        what += ["command lines"] if has_cmd and not with_cmd else []
        if what:
            title += f" · {' and '.join(what)} hidden: widen the terminal to see them"
        # Text, not a str: rich would read "[/]" or "[red]" in a path or device name as markup (and raise).
        table = Table(title=Text(title), caption=Text(status), caption_justify="left", expand=False)
        for i in shown:  # fitted: a cell may wrap at its spaces rather than be cut to "…"
            key = COLUMNS[i].key
            # Unfitted (a file or pipe), every row stays one line; past the console's width, rich narrows
            # the wrappable Notes first (its cells cut to "…": a long command line) rather than every column.
            no_wrap = key in _NEVER_WRAP or (width is None and key != _GIVES_WAY)
            table.add_column(COLUMNS[i].title, no_wrap=no_wrap)
        for row_cells in cells:
            table.add_row(*(_one_line(row_cells[i]) if width is None and COLUMNS[i].key == _GIVES_WAY
                            else row_cells[i] for i in shown))
        if width is None or len(hidden) == len(NARROW_DROP) or _natural_width(table) <= width:
            return table
        if with_cmd:
            # Too narrow for every column: process command lines give way first (wrapped in Notes they take
            # a line per word, and their width would hide columns that fit without them); the TUI's detail
            # line and the piped table keep them.
            with_cmd = False
            cells = [styled_cells(row, with_cmd=False) for row in rows]
            continue
        hidden.append(NARROW_DROP[len(hidden)])


def _natural_width(table: Table) -> int:
    """Columns the table takes when nothing limits it."""
    return Console(width=100_000).measure(table).maximum
