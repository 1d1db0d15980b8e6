"""`nvidia-smi dmon` text: two header lines (`# gpu pwr ...` / `# Idx W ...`), whitespace columns.

Any `-s` selection, `-` for unsupported values (NaN), optional `-o D`/`-o T` date and time columns,
headers repeated through the file, and noise lines around the table (skipped, counted in meta).
Also the same rows re-emitted as CSV (`time,gpu,pwr,...` then `s,Idx,W,...`).
Without a time column, the k-th row of a GPU is at k * interval (option `interval=`, default 1 s,
dmon's default delay).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from phasescope.errors import InputError
from phasescope.schema import MHZ, MIB, PERCENT, DeviceInfo, FloatArray, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    arrow_all,
    arrow_mask,
    base_meta,
    check_file,
    check_options,
    float_option,
    guarded,
    head_lines,
    read_lines,
    synth_uuid,
)

NAME = "nvidia-smi-dmon"
OPTIONS = ("interval",)

# dmon column -> (signal, expected unit). Unit factors below.
COLUMNS: dict[str, tuple[str, str]] = {
    "pwr": ("power", "W"),
    "gtemp": ("temperature", "C"),
    "temp": ("temperature", "C"),
    "sm": ("gpu_util", "%"),
    "mem": ("mem_util", "%"),
    "mclk": ("mem_clock", "MHz"),
    "pclk": ("sm_clock", "MHz"),  # processor (graphics) clock, which the SMs run on
    "fb": ("mem_used", "MB"),
    "rxpci": ("pcie_rx", "MB/s"),
    "txpci": ("pcie_tx", "MB/s"),
}
# dmon's "MB" of frame buffer is MiB (as nvidia-smi's memory.used); its PCIe "MB/s" is NVML KB/s / 1000.
UNITS: dict[str, float] = {"W": 1.0, "C": 1.0, "%": PERCENT, "MHz": MHZ, "MB": MIB, "MB/s": 1e6}

_HEADER_RE = re.compile(r"^#\s*(Date\s+)?(Time\s+)?gpu\b", re.IGNORECASE)
# A data row starts with a GPU index, '-', a date (YYYYMMDD, -o D) or a time of day (-o T).
_ROW_START = r"^(\d+|-|\d{1,2}:\d{2}:\d{2})(\s|$)"


def sniff(path: PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    lines = head_lines(p, 16384)
    for i, line in enumerate(lines[:40]):
        if _HEADER_RE.match(line) and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("#"):
            return True
    if len(lines) >= 2:
        first = [c.strip() for c in lines[0].split(",")]
        second = [c.strip() for c in lines[1].split(",")]
        return len(first) > 2 and "gpu" in first and len(second) == len(first) and "Idx" in second
    return False


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    opts = check_options(p, options, OPTIONS, NAME)
    interval = float_option(p, opts, "interval", 1.0)
    lines = read_lines(p, strip_bom=True)
    first = lines[0].as_py() if len(lines) else ""
    if "," in first and not first.lstrip().startswith("#"):
        table = _parse_csv(p, lines)
    else:
        table = _parse_text(p, lines)
    if table.line_no.size == 0:
        raise InputError(p, "data", "at least one dmon data row under the '# gpu ...' header", "none")
    return _to_traces(p, table, interval)


@dataclass
class _Table:
    """The data rows as text columns (Arrow), with the file line of each row for error messages."""

    names: list[str]
    units: list[str]
    cells: pa.Array  # every field of every row, row-major
    line_no: np.ndarray
    skipped: int

    def column(self, j: int) -> pa.Array:
        return self.cells.take(pa.array(np.arange(j, len(self.cells), len(self.names))))


def _parse_text(p: Path, lines: pa.Array) -> _Table:
    # Whole-file columnar pass: classify every line with Arrow kernels; only '#' lines loop in Python.
    text = pc.utf8_trim_whitespace(lines)
    comment = arrow_mask(pc.starts_with(text, "#"))
    blank = arrow_mask(pc.equal(pc.utf8_length(text), 0))
    names, units, first_header = _headers(p, lines, np.flatnonzero(comment))
    row_like = arrow_mask(pc.match_substring_regex(text, _ROW_START))
    after = np.arange(len(lines)) > first_header
    data = row_like & after & ~comment & ~blank
    skipped = int(np.count_nonzero(~data & ~comment & ~blank))  # text around the table (prompts, logs)
    # ASCII splitting is ~3x faster than Unicode-aware; both agree on ASCII text (all real dmon output).
    split = pc.ascii_split_whitespace if arrow_all(pc.string_is_ascii(text)) else pc.utf8_split_whitespace
    return _split_rows(p, text, data, names, units, skipped, split, "whitespace-separated")


def _headers(p: Path, lines: pa.Array, comments: np.ndarray) -> tuple[list[str], list[str], int]:
    """Column names, units (of the last header) and the line index of the first header."""
    names: list[str] = []
    units: list[str] = []
    first = -1
    consumed = -1  # the units line under a header is not itself a header
    for i in comments.tolist():
        stripped = str(lines[i].as_py()).strip()
        if i == consumed or not _HEADER_RE.match(stripped):
            continue
        head = stripped.lstrip("#").split()
        unit_line = str(lines[i + 1].as_py()).strip() if i + 1 < len(lines) else ""
        unit = unit_line.lstrip("#").split() if unit_line.startswith("#") else []
        if names and head != names:
            raise InputError(p, f"line {i + 1}", "the same dmon columns as the first header", " ".join(head))
        if not names:
            first = i
        names = head
        units = unit if len(unit) == len(head) else []
        consumed = i + 1 if unit_line.startswith("#") else -1
    if not names:
        raise InputError(p, "header", "a dmon header line '# gpu pwr ...'", "none")
    return names, units, first


def _parse_csv(p: Path, lines: pa.Array) -> _Table:
    head = str(lines[0].as_py())
    names = [c.strip() for c in head.split(",")]
    units = [c.strip() for c in str(lines[1].as_py()).split(",")] if len(lines) > 1 else []
    if "gpu" not in names:
        raise InputError(p, "header", "dmon columns including 'gpu'", head[:60])
    text = lines  # index = line number - 1; the two header lines are masked out below
    data = ~arrow_mask(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0))
    data[:2] = False
    table = _split_rows(p, text, data, names, units, 0, lambda a: pc.split_pattern(a, ","), "comma-separated")
    table.cells = pc.utf8_trim_whitespace(table.cells)
    return table


def _split_rows(
    p: Path,
    text: pa.Array,
    data: np.ndarray,
    names: list[str],
    units: list[str],
    skipped: int,
    split: Callable[[pa.Array], pa.Array],
    how: str,
) -> _Table:
    rows = np.flatnonzero(data)
    fields = split(text.filter(pa.array(data)))
    counts = np.asarray(pc.list_value_length(fields).to_numpy(zero_copy_only=False))
    bad = np.flatnonzero(counts != len(names))
    if bad.size:
        k = int(bad[0])
        line = text[int(rows[k])].as_py()
        sep = " " if how.startswith("white") else ","
        raise InputError(
            p,
            f"line {rows[k] + 1}",
            f"{len(names)} {how} fields ({sep.join(names)})",
            f"{counts[k]} fields: {line[:60]!r}",
        )
    return _Table(names, units, pc.list_flatten(fields), rows + 1, skipped)


def _to_traces(p: Path, table: _Table, interval: float) -> list[Trace]:
    lower = [n.lower() for n in table.names]
    if "gpu" not in lower:
        raise InputError(p, "header", "a 'gpu' column", " ".join(table.names))
    gpu_col = lower.index("gpu")
    gpu = _column(p, table, gpu_col, "gpu")
    whole = np.isfinite(gpu) & (gpu == np.round(gpu)) & (gpu >= 0) & (gpu < 2**31)  # 1e308 is whole too
    if not np.all(whole):
        i = int(np.flatnonzero(~whole)[0])
        got = table.column(gpu_col)[i].as_py()
        raise InputError(p, f"line {table.line_no[i]}, field 'gpu'", "a GPU index", got)
    signals: dict[str, FloatArray] = {}
    for j, name in enumerate(lower):
        if name not in COLUMNS or COLUMNS[name][0] in signals:
            continue
        sig, expected_unit = COLUMNS[name]
        unit = table.units[j] if table.units else expected_unit
        if unit not in UNITS:
            raise InputError(p, f"unit of column {name!r}", f"one of {', '.join(UNITS)}", unit)
        with np.errstate(over="ignore"):  # a huge reading scales to inf, which the range check drops
            signals[sig] = _column(p, table, j, name) * UNITS[unit]
    time, clock = _time(p, table, lower)
    traces: list[Trace] = []
    for idx in np.unique(gpu).astype(np.int64).tolist():
        sel = np.flatnonzero(gpu == idx)
        t = time[sel] if time is not None else np.arange(sel.size) * interval
        cols = {s: v[sel] for s, v in signals.items()}
        meta = base_meta(
            p,
            NAME,
            run=p.stem,
            gpu_index=idx,
            clock=clock if time is not None else "sweep",
            skipped_lines=table.skipped,
        )
        if time is None:
            meta["interval_s"] = interval
        traces.append(Trace(DeviceInfo(uuid=synth_uuid(p, idx), index=idx), t, cols, meta))
    return traces


def _column(p: Path, table: _Table, j: int, name: str) -> FloatArray:
    col = table.column(j)
    missing = pc.or_(pc.equal(col, "-"), pc.equal(col, "N/A"))  # dmon's "unsupported" -> NaN
    try:
        values = pc.if_else(missing, pa.scalar(None, col.type), col).cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _column_slow(p, table, col, name)
    return np.asarray(pc.fill_null(values, np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def _column_slow(p: Path, table: _Table, col: pa.Array, name: str) -> FloatArray:
    """Error path: name the first token that is not a number (or parse what Arrow alone refused)."""
    out = np.full(len(col), np.nan)
    for i, token in enumerate(col.to_pylist()):
        if token in ("-", "N/A"):
            continue
        try:
            out[i] = float(token)
        except (ValueError, TypeError):
            where = f"line {table.line_no[i]}, field {name!r}"
            raise InputError(p, where, "a number or '-'", token) from None
    return out


def _time(p: Path, table: _Table, lower: list[str]) -> tuple[FloatArray | None, str]:
    if "time" in lower and "date" not in lower and _looks_numeric(table.column(lower.index("time"))):
        return _column(p, table, lower.index("time"), "time"), "relative"
    if "date" not in lower and "time" not in lower:
        return None, "sweep"
    n = len(table.line_no)
    kind = table.cells.type
    date = table.column(lower.index("date")) if "date" in lower else pa.array(["19700101"] * n, kind)
    clock = table.column(lower.index("time")) if "time" in lower else pa.array(["00:00:00"] * n, kind)
    joined = pc.binary_join_element_wise(date, clock, pa.scalar(" ", kind))
    stamps = pc.strptime(joined, format="%Y%m%d %H:%M:%S", unit="s", error_is_null=True)
    bad = arrow_mask(pc.is_null(stamps))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        where = f"line {table.line_no[i]}, field 'Date/Time'"
        raise InputError(p, where, "YYYYMMDD HH:MM:SS", joined[i].as_py())
    out = np.asarray(stamps.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    if "date" not in lower:  # time of day only: unwrap midnight
        out = out + 86400.0 * np.concatenate(([0], np.cumsum(np.diff(out) < -43200)))
        return out, "time_of_day"
    return out, "unix"


def _looks_numeric(values: pa.Array) -> bool:
    try:
        float(values[0].as_py())
    except (ValueError, IndexError, TypeError):
        return False
    return True
