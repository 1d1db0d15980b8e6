"""CSV GPU logs: `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`, and the CSVs people write
with their own scripts (format `csv`, module `generic_csv`, read by the same code here).

Columns are recognised by name, synonym and unit through `phasescope.signal_names` (`power.draw [W]`,
`power_W`, `utilization_gpu_percent`, `GPU Temp (C)`); units come from the header, else the values
(`575.3 W`), else the name's usual unit. `[N/A]` and `[Not Supported]` read as NaN. The time column may hold
nvidia-smi's `YYYY/MM/DD HH:MM:SS.fff`, ISO 8601 (`T` or space, with an offset or `Z`, or none: read as UTC),
Unix epoch seconds, milliseconds, microseconds or nanoseconds (told apart by magnitude, or by a unit in the
header: `time_ms`), or seconds from the log's start. Devices are told apart by an index, uuid or PCI bus id
column, or by the GPU number in the names of a wide log's columns (`time,gpu0_util,gpu1_util`); without
either, GPUs interleaved row by row are split by the sweep structure of the timestamps (`gpus=N` forces the
count). A last line cut off by a killed logger, and the odd row with the wrong number of
fields or a header repeated by a restarted logger, are dropped with one line saying how many and where.

Options: `columns=` the --query-gpu list (needed for ambiguous noheader files), `gpus=N`,
`interval=S` (seconds between sweeps when the file has no timestamp; default 1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from phasescope.errors import InputError
from phasescope.schema import SIGNALS, DeviceInfo, FloatArray, Trace
from phasescope.signal_names import (
    NVIDIA_SMI,
    TIME_UNITS,
    UNITS,
    Column,
    Name,
    recognise,
    unit_factor,
    units_for,
)
from phasescope.sources.replay._common import (
    CUT_OFF,
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    float_option,
    guarded,
    head_lines,
    int_option,
    log,
    read_csv_strings,
    strings_to_float,
    synth_uuid,
)

NAME = "nvidia-smi-csv"
OPTIONS = ("columns", "gpus", "interval")

_FIELD_RE = re.compile(r"^[a-z_][a-z0-9_.]*$")  # how nvidia-smi spells a --query-gpu field
_TS_RE = re.compile(r"^\d{4}[/-]\d{2}[/-]\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?$")
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Fa-f-]+$")
_PCI_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
# Numbers as `\d+(?:\.\d*)?`, never `\d+\.?\d*`: the latter backtracks quadratically on a long digit run.
_NUM_RE = re.compile(r"^[+-]?(\d+(?:\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_UNIT_VALUE_RE = re.compile(r"^[+-]?(\d+(?:\.\d*)?|\.\d+)\s+(%|MiB|W|MHz)$")
_MISSING_RE = re.compile(r"^(\[.*\]|N/?A)$")
# A value with its unit, spaced or not ('575.3 W', '41%'): the number, and the unit.
_VALUE_UNIT_RE = re.compile(r"^\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*([A-Za-z%°/]+)\s*$")
_NUMBER_THEN_UNIT = r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*[A-Za-z%°/]+\s*$"
# A device column's value: 0, 'cuda:0', 'GPU 0', 'gpu0'.
_DEVICE_NUMBER_RE = re.compile(r"^(?:cuda:|gpu\s*)?(\d+)$", re.IGNORECASE)
_ZONE_RE = re.compile(r"(Z|[+-]\d{2}(:?\d{2})?)$")
_DATE_ONLY_RE = re.compile(r"^\d{4}[/-]\d{2}[/-]\d{2}$")
_TIME_OF_DAY_RE = re.compile(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|[+-]\d{2}(:?\d{2})?)?$")
_DELIMITERS = (",", "\t", ";")
_BAD_ROWS_AT_MOST = 0.1  # more malformed rows than this share: the file is not the layout its header says
_SAY_AT_MOST = 3  # lines named in a message; the count says the rest


@dataclass(frozen=True)
class Layout:
    """A header line understood: its delimiter and columns, and whether it is nvidia-smi's own."""

    delimiter: str
    columns: list[Column]

    @property
    def nvidia_smi(self) -> bool:
        """Every name is a lower-case field name and every one we read is spelled as nvidia-smi does."""
        return all(_FIELD_RE.match(c.name) for c in self.columns) and all(
            c.nvidia_smi for c in self.columns if c.meaning is not None
        )

    def signals(self) -> list[str]:
        return [c.role for c in self.columns if c.is_signal and c.role]


def _split_line(line: str, delimiter: str = ",") -> list[str]:
    return [f.strip() for f in line.rstrip("\r\n").split(delimiter)]


def _first_lines(path: Path, n: int = 64) -> list[str]:
    return [ln for ln in head_lines(path) if ln.strip()][:n]


def header_layout(line: str) -> Layout | None:
    """The layout of a header line; None when it is not one (a data row, or no column we read).

    A header names at least one signal and holds no number; the delimiter is the first of ',', tab, ';'
    under which it does."""
    for delimiter in _DELIMITERS:
        cells = _split_line(line, delimiter)
        if len(cells) < 2 and delimiter != ",":
            continue
        if any(_NUM_RE.match(c.strip('"')) for c in cells):
            return None
        columns = [recognise(c) for c in cells]
        if any(c.is_signal for c in columns):
            return Layout(delimiter, columns)
    return None


def _is_smi_header(layout: Layout | None) -> bool:
    return layout is not None and layout.nvidia_smi


# Signals that do not make a CSV a GPU log on their own: a room or weather log has a temperature, a results
# table an energy per step, a spec sheet the limits.
_NOT_ENOUGH = frozenset({"temperature", "energy", "power_limit", "mem_total", "throttle_reasons"})


def _is_own_header(layout: Layout | None) -> bool:
    """A header of someone's own script: read as format `csv` when it names a GPU signal that changes with
    the work (utilisation, power, memory used, clocks, PCIe ...), not only those in _NOT_ENOUGH."""
    return layout is not None and not layout.nvidia_smi and bool(set(layout.signals()) - _NOT_ENOUGH)


def _looks_like_row(fields: Sequence[str]) -> bool:
    if len(fields) < 2:
        return False
    return all(_classify(f) != "text" or f for f in fields) and (
        bool(_TS_RE.match(fields[0])) or fields[0].isdigit() or bool(_UUID_RE.match(fields[0]))
    )


def sniff(path: PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    lines = _first_lines(p, 4)
    if not lines:
        return False
    if _is_smi_header(header_layout(lines[0])):
        return True
    # noheader: nvidia-smi separates with ', ' and leads with a timestamp, an index or a uuid
    return ", " in lines[0] and _looks_like_row(_split_line(lines[0]))


def sniff_own(path: PathLike) -> bool:
    """A CSV with a header of someone's own names (format `csv`); nvidia-smi's own headers are `sniff`'s."""
    p = Path(path)
    if not p.is_file():
        return False
    lines = _first_lines(p, 2)
    return bool(lines) and _is_own_header(header_layout(lines[0]))


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    return read_log(path, options, NAME)


def read_log(path: PathLike, options: Options | None, fmt: str) -> list[Trace]:
    """Read a CSV GPU log (either format); `fmt` names it in messages and meta."""
    p = check_file(path)
    opts = check_options(p, options, OPTIONS, fmt)
    lines = _first_lines(p)
    if not lines:
        raise InputError(p, "file", "CSV rows of GPU telemetry", "an empty file")
    layout = header_layout(lines[0])
    delimiter = layout.delimiter if layout else ","
    if "columns" in opts:
        columns = [recognise(c) for c in opts["columns"].split(",") if c.strip()]
        if layout is not None and len(layout.columns) != len(columns):
            raise InputError(
                p, "option columns", f"{len(layout.columns)} names to match the header", len(columns)
            )
    elif layout is not None:
        columns = layout.columns
    else:
        columns = [recognise(c) for c in _infer_columns(p, [_split_line(ln) for ln in lines[:32]])]
    dropped: list[str] = []
    # Blank lines before the header are skipped by Arrow too, so skipping one row skips the header.
    table = read_csv_strings(
        p,
        skip_rows=1 if layout else 0,
        n_columns=len(columns),
        expected=", ".join(c.header for c in columns),
        delimiter=delimiter,
        dropped=dropped,
    )
    if layout is not None:
        table = _drop_repeated_headers(table, lines[0], delimiter, dropped)
    table = _drop_cut_last_value(p, table, dropped)
    if table.num_rows == 0:
        raise InputError(p, "data", "at least one data row", "only a header")
    if dropped:
        _say_dropped(p, table.num_rows, dropped)
    if any(c.device is not None for c in columns):
        table, columns = _long_from_wide(p, table, columns)
    return _to_traces(p, table, columns, opts, fmt)


def _long_from_wide(p: Path, table: pa.Table, columns: list[Column]) -> tuple[pa.Table, list[Column]]:
    """A wide log (`time,gpu0_util,gpu0_power,gpu1_util,...`) as the long one the rest reads: each GPU's
    rows in turn, with the shared columns (the time), one column per signal and the GPU number as index."""
    wide = [j for j, c in enumerate(columns) if c.device is not None]
    shared = [j for j, c in enumerate(columns) if c.device is None]
    roles = list(dict.fromkeys(columns[j].role for j in wide))
    # A column of no one GPU (a total, a row's own device column) would be copied to every GPU: ignored.
    out = [replace(columns[j], meaning=None) if columns[j].is_signal or columns[j].role == "index"
           else columns[j] for j in shared]
    for role in roles:
        mine = [columns[j] for j in wide if columns[j].role == role]
        odd = next((c for c in mine if unit_factor(c) != unit_factor(mine[0])), None)
        if odd is not None:
            raise InputError(p, f"header fields {mine[0].header!r} and {odd.header!r}",
                             f"one unit for {role} on every GPU", f"{mine[0].unit} and {odd.unit}")
        headers = ", ".join(c.header for c in mine)
        out.append(Column(headers, mine[0].name, mine[0].unit, mine[0].meaning, False))
    out.append(Column("the GPU numbers in the column names", "gpu", None, Name("index"), False))
    n = table.num_rows
    parts = []
    for device in sorted({d for d in (columns[j].device for j in wide) if d is not None}):
        arrays: list[pa.Array | pa.ChunkedArray] = [table.column(f"c{j}") for j in shared]
        for role in roles:
            j = next((k for k in wide if columns[k].device == device and columns[k].role == role), None)
            arrays.append(table.column(f"c{j}") if j is not None else pa.nulls(n, pa.string()))
        arrays.append(pa.array(np.full(n, str(device))))
        parts.append(pa.table(arrays, names=[f"c{k}" for k in range(len(arrays))]))
    return pa.concat_tables(parts), out


def _drop_repeated_headers(table: pa.Table, header: str, delimiter: str, dropped: list[str]) -> pa.Table:
    """A logger restarted with `>>` writes its header again: those rows go (and are counted)."""
    first = _split_line(header, delimiter)[0]
    again = np.asarray(
        pc.fill_null(pc.equal(pc.utf8_trim_whitespace(table.column("c0")), first), False), dtype=bool
    )
    if again.any():
        rows = np.flatnonzero(again)
        dropped += [f"data row {i + 1} (the header again)" for i in rows[:_SAY_AT_MOST].tolist()]
        dropped += [""] * max(0, rows.size - _SAY_AT_MOST)
        table = table.filter(pa.array(~again))
    return table


def _drop_cut_last_value(p: Path, table: pa.Table, dropped: list[str]) -> pa.Table:
    """A last line with every field but no line break was cut inside its last value when that value lost
    the unit the line before has ('41 %' cut to '4'): that row goes too. (Without units a cut '41' -> '4'
    cannot be told.)"""
    if table.num_rows < 2 or _ends_with_newline(p):
        return table
    last = table.column(table.num_columns - 1).slice(table.num_rows - 2, 2).to_pylist()
    before, after = (_VALUE_UNIT_RE.match(str(v)) for v in last)
    if before is not None and (after is None or after.group(1) != before.group(1)):
        where = f"the last line (data row {table.num_rows})"
        dropped.append(f"{where}, {CUT_OFF} inside its last value {last[1]!r}")
        return table.slice(0, table.num_rows - 1)
    return table


def _ends_with_newline(p: Path) -> bool:
    with p.open("rb") as fh:
        fh.seek(0, 2)
        if fh.tell() == 0:
            return True
        fh.seek(-1, 2)
        return fh.read(1) in (b"\n", b"\r")


def _say_dropped(p: Path, kept: int, dropped: list[str]) -> None:
    """One line for the rows that were not read; InputError when they are too many to be damage."""
    named = [d for d in dropped if d]
    malformed = [d for d in dropped if CUT_OFF not in d]  # a killed logger's cut last line is always passed
    if len(malformed) > 1 and len(malformed) > _BAD_ROWS_AT_MOST * (kept + len(dropped)):
        raise InputError(
            p,
            named[0] if named else "rows",
            f"rows in the header's layout (at most 1 in {round(1 / _BAD_ROWS_AT_MOST)} malformed)",
            f"{len(malformed)} of {kept + len(dropped)} rows malformed",
        )
    more = f" and {len(dropped) - len(named[:_SAY_AT_MOST])} more" if len(dropped) > _SAY_AT_MOST else ""
    log.warning(
        "phasescope: warning: %s: %d row(s) cut off or malformed, not read (%d read): %s%s",
        p, len(dropped), kept, "; ".join(named[:_SAY_AT_MOST]), more,
    )


def _classify(value: str) -> str:
    if _TS_RE.match(value):
        return "timestamp"
    if _UUID_RE.match(value):
        return "uuid"
    if _PCI_RE.match(value):
        return "pci"
    if _MISSING_RE.match(value):
        return "missing"
    m = _UNIT_VALUE_RE.match(value)
    if m:
        return "unit:" + m.group(2)
    if _NUM_RE.match(value):
        return "number"
    return "text"


def _infer_columns(p: Path, rows: list[list[str]]) -> list[str]:
    """Name the columns of a noheader file from its values, only where that is unambiguous.

    Identified by value shape: timestamps, GPU/MIG uuids, PCI bus ids. Values with units map by unit
    when each unit occurs in one column only (W power.draw, % utilization.gpu, MiB memory.used,
    MHz clocks.sm). Without units, only the widespread logging recipe
    `timestamp,utilization.gpu,memory.used` is recognised: a timestamp, a 0-100 whole number, a whole number.
    Anything else needs `columns=`.
    """
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise InputError(p, "rows", "the same number of fields on every line", "ragged rows")
    kinds: list[str] = []
    for j in range(width):
        seen = {_classify(r[j]) for r in rows} - {"missing"}
        kinds.append(seen.pop() if len(seen) == 1 else ("missing" if not seen else "mixed"))
    names: list[str | None] = [None] * width
    for j, kind in enumerate(kinds):
        if kind == "timestamp":
            names[j] = "timestamp"
        elif kind == "uuid":
            names[j] = "uuid"
        elif kind == "pci":
            names[j] = "pci.bus_id"
    by_unit = {"W": "power.draw", "%": "utilization.gpu", "MiB": "memory.used", "MHz": "clocks.sm"}
    for unit, field in by_unit.items():
        cols = [j for j, k in enumerate(kinds) if k == f"unit:{unit}"]
        if len(cols) == 1:
            names[cols[0]] = field
    plain = [j for j, k in enumerate(kinds) if k == "number"]
    if len(plain) == 2 and kinds.count("timestamp") == 1 and width == 3 and kinds[0] == "timestamp":
        a = np.array([float(r[plain[0]]) for r in rows])
        b = np.array([float(r[plain[1]]) for r in rows])
        whole = bool(np.all(a == np.round(a)) and np.all(b == np.round(b)))
        if whole and a.min() >= 0 and a.max() <= 100:
            names[plain[0]], names[plain[1]] = "utilization.gpu", "memory.used"
    unknown = [j for j, k in enumerate(kinds) if names[j] is None and k not in ("text", "missing")]
    if unknown or not any(n and recognise(n).is_signal for n in names):
        raise InputError(
            p,
            f"column {(unknown or [0])[0] + 1} of {width}",
            "a header line, or the --query-gpu field list as nvidia-smi-csv:columns=a,b,c "
            "(noheader columns are only inferred where unambiguous)",
            rows[0][(unknown or [0])[0]],
        )
    return [n if n is not None else f"_unknown{j}" for j, n in enumerate(names)]


def _preference(c: Column, position: int) -> int:
    """Which of two columns of one signal is read: nvidia-smi's fields in the table's order, then the
    file's order."""
    order = list(NVIDIA_SMI)
    return order.index(c.name) if c.name in NVIDIA_SMI else len(order) + position


def _value_unit(values: pa.ChunkedArray, c: Column) -> str | None:
    """The unit written in the first values that carry one ('575.3 W' -> 'w'), when it fits the signal."""
    for v in values.slice(0, 50).to_pylist():
        m = _VALUE_UNIT_RE.match(str(v))
        if m:
            unit = m.group(1).lower()
            known = UNITS.get(unit)
            if known is not None and c.role and known[0] == SIGNALS[c.role].unit:
                return unit
            return None
    return None


def _to_traces(
    p: Path, table: pa.Table, columns: list[Column], opts: dict[str, str], fmt: str
) -> list[Trace]:
    n = table.num_rows
    chosen: dict[str, int] = {}  # role -> column position
    for j in sorted(range(len(columns)), key=lambda j: _preference(columns[j], j)):
        role = columns[j].role
        if role is not None and role not in chosen:
            chosen[role] = j
    signals: dict[str, FloatArray] = {}
    units: dict[str, str] = {}
    for role, j in chosen.items():
        c = columns[j]
        if not c.is_signal:
            continue
        col = table.column(f"c{j}")
        unit = c.unit or _value_unit(col, c)
        factor = unit_factor(c, unit)
        if factor is None:
            raise InputError(
                p, f"header field {c.name!r}", f"a unit among {', '.join(units_for(role))}", c.unit
            )
        # strings_to_float strips a spaced unit ('575.3 W'); one written on the number ('41%') goes here,
        # only where the first values show one (a regex over every row costs more than the parse).
        head = [str(v) for v in col.slice(0, 50).to_pylist()]
        attached = any(re.match(_NUMBER_THEN_UNIT, v) and not re.search(r"\d\s+\S", v) for v in head)
        bare = pc.replace_substring_regex(col, _NUMBER_THEN_UNIT, r"\1") if attached else col
        signals[role] = strings_to_float(bare, p, c.name, hex_ok=role == "throttle_reasons") * factor
        units[role] = unit or (c.meaning.unit if c.meaning else None) or ""

    time: FloatArray | None = None
    clock, zone, form = "sweep", "", ""
    time_col: Column | None = None
    time_from: list[int] = []
    if "time" in chosen:
        time_col, stamps, time_from = _time_column(table, columns, chosen)
        time, clock, zone, form = parse_times(stamps, p, time_col)

    keys, key_field = _device_keys(p, table, columns, chosen, n, time, opts, fmt)
    uniq = list(dict.fromkeys(keys.tolist()))
    if time is None:
        interval = float_option(p, opts, "interval", 1.0)
        time = np.empty(n)
        for k in uniq:  # no clock in the file: the k-th row of a GPU is sweep k
            sel = keys == k
            time[sel] = np.arange(int(sel.sum())) * interval
    text: dict[str, list[object]] = {
        role: table.column(f"c{chosen[role]}").to_pylist()
        for role in ("uuid", "name", "index", "pci", "driver")
        if role in chosen
    }
    if fmt != NAME:
        _say_recognised(p, columns, chosen, units, (time_col, form, time_from), key_field, len(uniq))
    traces: list[Trace] = []
    for pos, k in enumerate(uniq):
        sel = np.flatnonzero(keys == k)
        first = int(sel[0])
        index = _index_of(text, first, k, key_field, pos)
        uuid = str(text["uuid"][first]).strip() if "uuid" in text else ""
        if not uuid and key_field == "uuid":  # an index column that holds uuids
            uuid = str(k)
        name = str(text["name"][first]).strip() if "name" in text else ""
        extra = {"pci_bus_id": str(text["pci"][first]).strip()} if "pci" in text else {}
        device = DeviceInfo(
            uuid=uuid or synth_uuid(p, index if index is not None else pos),
            name=name,
            index=index,
            extra=extra,
        )
        t = time[sel]
        cols = {s: v[sel] for s, v in signals.items()}  # file order: replay.read cuts a clock step there
        meta = base_meta(
            p,
            fmt,
            run=p.stem,
            gpu_index=index if index is not None else pos,
            clock=clock,
            device_key=key_field,
            timezone=zone,
        )
        if "driver" in text:
            meta["driver_version"] = str(text["driver"][first]).strip()
        traces.append(Trace(device, t, cols, meta))
    return traces


def _say_recognised(
    p: Path,
    columns: list[Column],
    chosen: dict[str, int],
    units: dict[str, str],
    time: tuple[Column | None, str, list[int]],
    key_field: str,
    gpus: int,
) -> None:
    """One line: which column became what, and which were ignored. A warning, as the CLI prints every line
    besides its one error, and a guess at someone's own names is one to check."""
    time_col, form, time_from = time
    used = set(chosen.values()) | set(time_from)
    parts: list[str] = []
    for role, j in chosen.items():
        c = time_col if role == "time" and time_col is not None else columns[j]
        if role == "time":
            parts.append(f"time {c.header!r} ({form})")
        elif c.is_signal:
            parts.append(f"{role} {c.header!r}" + (f" ({units[role]})" if units.get(role) else ""))
        else:
            parts.append(f"{role} {c.header!r}")
    if key_field == "interleave":
        parts.append("no device column: " + ("one GPU" if gpus == 1 else f"{gpus} GPUs, row by row"))
    ignored = [repr(c.header) if c.header else "(unnamed)" for j, c in enumerate(columns) if j not in used]
    log.warning(
        "phasescope: warning: %s: read as a CSV log (check the columns): %s; ignored: %s",
        p, ", ".join(parts), ", ".join(ignored) or "none",
    )


def _time_column(
    table: pa.Table, columns: list[Column], chosen: dict[str, int]
) -> tuple[Column, pa.ChunkedArray, list[int]]:
    """The time column, its values and the columns they come from. A `date` column and a time-of-day column
    beside it (`date,time,...` as Excel and shell loggers write them) are joined into one stamp."""
    j = chosen["time"]
    stamps = table.column(f"c{j}")
    first = str(stamps[0].as_py()).strip() if len(stamps) else ""
    others = [k for k, c in enumerate(columns) if c.role == "time" and k != j]
    if _DATE_ONLY_RE.match(first) and others:
        clock = table.column(f"c{others[0]}")
        if _TIME_OF_DAY_RE.match(str(clock[0].as_py()).strip()):
            joined = pc.binary_join_element_wise(
                pc.utf8_trim_whitespace(stamps), pc.utf8_trim_whitespace(clock), " "
            )
            name = f"{columns[j].name}+{columns[others[0]].name}"
            return Column(name, name, None, columns[j].meaning, False), joined, [j, others[0]]
    return columns[j], stamps, [j]


def parse_times(
    col: pa.ChunkedArray, p: Path, column: Column
) -> tuple[FloatArray, str, str, str]:
    """A time column -> (seconds, clock, timezone note, the form found), or InputError naming the first
    row that is not a time of the form of the first row.

    Numbers are Unix epoch seconds, ms, us or ns (by the header's unit, else by magnitude: a year between
    1973 and 2100 in one of them) or, below that, seconds from the log's own start. Text is nvidia-smi's
    `YYYY/MM/DD HH:MM:SS.fff` or ISO 8601 with `T` or a space; an offset or `Z` is honoured, none is read
    as UTC."""
    text = pc.utf8_trim_whitespace(col.combine_chunks().cast(pa.string()))
    first = next((v for v in text.slice(0, 20).to_pylist() if v), "")
    if _NUM_RE.match(first):
        try:
            values = np.asarray(text.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values = strings_to_float(text, p, column.name)  # names the bad row
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(bad[0])
            where = f"row {i + 1}, field {column.name!r}"
            raise InputError(p, where, "a number of seconds", col[i].as_py())
        return _numeric_times(values, column)
    zoned = bool(_ZONE_RE.search(first)) and not _TS_RE.match(first)
    iso = pc.replace_substring(text, "/", "-")  # nvidia-smi's date; a plain replace is cheaper than a regex
    ts = _cast_times(iso, "UTC" if zoned else None)
    if ts is None:
        zone = r"\s*(Z|[+-]\d{2}(:?\d{2})?)$" if zoned else "$"
        shape = r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?" + zone
        ok = np.asarray(pc.fill_null(pc.match_substring_regex(iso, shape), False), dtype=bool)
        bad = np.flatnonzero(~ok)
        i = int(bad[0]) if bad.size else 0
        expected = (
            "an ISO 8601 time with a zone like 2025-07-27T00:22:27.858+02:00 (as the first row)"
            if zoned
            else "a timestamp like 2025/07/27 00:22:27.858 or 2025-07-27T00:22:27"
        )
        raise InputError(p, f"row {i + 1}, field {column.name!r}", expected, col[i].as_py())
    if ts.null_count:
        i = int(np.flatnonzero(np.asarray(pc.is_null(ts), dtype=bool))[0])
        raise InputError(p, f"row {i + 1}, field {column.name!r}", "a timestamp", col[i].as_py())
    per_second = 1e6 if ts.type.unit == "us" else 1e9
    seconds = np.asarray(ts.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.float64) / per_second
    if zoned:
        return seconds, "unix", "from the file (UTC offsets)", "ISO 8601 with a UTC offset"
    if "/" in first:
        smi_zone = "UTC (assumed: nvidia-smi prints local time, no zone)"
        return seconds, "unix", smi_zone, "nvidia-smi timestamps"
    return seconds, "unix", "UTC (assumed: no zone in the file)", "ISO 8601 without a zone, read as UTC"


def _cast_times(iso: pa.Array, tz: str | None) -> pa.Array | None:
    """ISO text -> Arrow timestamps: microseconds (years to 9999, so check_times can name a far one), else
    nanoseconds (a 9-digit fraction); None when neither parses every row."""
    for unit in ("us", "ns"):
        try:
            return iso.cast(pa.timestamp(unit, tz))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


# Epoch stamps by magnitude: seconds, ms, us and ns for 1973..2100 do not overlap (LATEST_TIME ~ 4.1e9).
_EPOCH_SCALES = ((1e17, 1e-9, "ns"), (1e14, 1e-6, "us"), (1e11, 1e-3, "ms"), (1e8, 1.0, "s"))


def _numeric_times(values: FloatArray, column: Column) -> tuple[FloatArray, str, str, str]:
    if column.unit is not None:
        scale = TIME_UNITS.get(column.unit)
        seconds = values * scale if scale is not None else values
        unit = column.unit if scale is not None else "s"
        if float(np.median(seconds)) >= 1e8:
            return seconds, "unix", "UTC (Unix time)", f"Unix time in {unit}"
        return seconds, "relative", "", f"{unit} from the log's start"
    typical = float(np.median(values))
    for floor, scale, unit in _EPOCH_SCALES:
        if typical >= floor:
            return values * scale, "unix", "UTC (Unix time)", f"Unix time in {unit}"
    return values, "relative", "", "seconds from the log's start"


def _index_of(text: dict[str, list[object]], row: int, key: object, key_field: str, pos: int) -> int | None:
    if key_field == "interleave":
        return int(str(key))
    if "index" in text:
        m = _DEVICE_NUMBER_RE.match(str(text["index"][row]).strip())
        return int(m.group(1)) if m else None
    return pos


_KEY_FIELD = {"index": "index", "uuid": "uuid", "pci": "pci.bus_id"}  # meta device_key, as before synonyms


def _device_keys(
    p: Path,
    table: pa.Table,
    columns: list[Column],
    chosen: dict[str, int],
    n: int,
    time: FloatArray | None,
    opts: dict[str, str],
    fmt: str,
) -> tuple[np.ndarray, str]:
    """One key per row telling its device: index > uuid > pci.bus_id > interleave order."""
    for role in ("index", "uuid", "pci"):
        if role in chosen:
            values = pc.utf8_trim_whitespace(table.column(f"c{chosen[role]}")).to_numpy(zero_copy_only=False)
            if role == "index":
                head = [str(v) for v in values[:1000]]
                if head and all(_UUID_RE.match(v) for v in head):  # a gpu_id column of uuids
                    return np.asarray(values, dtype=object), "uuid"
                bad = [i for i, v in enumerate(head) if not _DEVICE_NUMBER_RE.match(v)]
                if bad:
                    raise InputError(
                        p,
                        f"row {bad[0] + 1}, field {columns[chosen[role]].name!r}",
                        "a GPU index (0, 1, ... or cuda:0, GPU 0)",
                        values[bad[0]],
                    )
            return np.asarray(values, dtype=object), _KEY_FIELD[role]
    gpus = int_option(p, opts, "gpus")
    if gpus is None:
        gpus = infer_gpu_count(time) if time is not None else 1
        if gpus is None:
            raise InputError(
                p,
                "timestamps",
                "a regular sweep of rows per GPU to tell how many GPUs "
                f"are interleaved; pass {fmt}:gpus=N",
            )
    return np.arange(n) % gpus, "interleave"


def infer_gpu_count(time: FloatArray, max_gpus: int = 64) -> int | None:
    """How many GPUs nvidia-smi interleaved, from the timestamps alone.

    nvidia-smi prints one row per GPU in quick succession (ms apart), then waits the loop period.
    Split the gaps into short (within a sweep) and long (between sweeps) by Otsu's threshold on
    log(gap); the GPU count is the most common run length between long gaps, and it must explain
    >= 80% of the runs. 1 when the two groups are not far apart (one GPU at a steady rate) or the long
    gaps are rare pauses between long runs; None when it cannot be told.
    """
    if time.size < 3:
        return 1
    dt = np.diff(time)
    if np.any(dt < 0):
        return None
    logs = np.log(np.maximum(dt, 5e-4))  # ms resolution: identical stamps count as 0.5 ms apart
    split = _otsu(np.sort(logs))
    if split is None:
        return 1
    threshold, low_median, high_median = split
    if high_median - low_median < np.log(5.0):
        return 1  # one steady rate with jitter, not sweeps
    long_gap = np.flatnonzero(logs > threshold)
    if long_gap.size > dt.size / 2:
        return 1
    runs = np.diff(np.concatenate(([0], long_gap + 1)))  # complete sweeps only; the tail may be cut
    values, counts = np.unique(runs, return_counts=True)
    best = int(values[np.argmax(counts)])
    if best <= max_gpus and counts.max() >= 0.8 * runs.size:
        return best
    return 1 if float(np.median(runs)) > max_gpus else None


def _otsu(sorted_values: FloatArray) -> tuple[float, float, float] | None:
    """(threshold, median below, median above) maximising the between-class variance."""
    n = sorted_values.size
    if n < 2 or sorted_values[0] == sorted_values[-1]:
        return None
    csum = np.cumsum(sorted_values)
    k = np.arange(1, n)  # size of the low class
    mean_low = csum[:-1] / k
    mean_high = (csum[-1] - csum[:-1]) / (n - k)
    between = k * (n - k) * (mean_high - mean_low) ** 2
    between[sorted_values[1:] == sorted_values[:-1]] = -1.0  # split only between distinct values
    i = int(np.argmax(between))
    if between[i] <= 0:
        return None
    low, high = sorted_values[: i + 1], sorted_values[i + 1 :]
    return (float(low[-1] + high[0]) / 2, float(np.median(low)), float(np.median(high)))
