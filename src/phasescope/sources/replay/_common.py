"""Helpers shared by the file readers: file checks, option parsing, vectorised number parsing.

Every reader converts at its edge into `phasescope.schema` signals in base units and reports bad
input as one `InputError` naming the file, the row or field, and what was expected.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from phasescope.errors import InputError
from phasescope.schema import RANGES, SIGNALS, FloatArray, Trace, impossible

log = logging.getLogger("phasescope.sources.replay")

Options = Mapping[str, str]
PathLike = str | Path

# Tokens nvidia-smi and friends print for a value they cannot give: read as NaN.
_MISSING_RE = r"^(\[.*\]|N/?A|n/a|-|)$"
# A decimal number. `\d+(\.\d*)?`, not `\d+\.?\d*`: that one splits a digit run two ways, and Python's
# backtracking re takes quadratic time on a long run that fails to match (4 s for 5000 digits).
_NUMBER_RE = r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"


def check_file(path: PathLike, *, allow_dir: bool = False) -> Path:
    """The path as a Path, or InputError when it does not exist, cannot be read, or is not a regular
    file: a FIFO, socket or device would block the first read forever, so it is refused before opening."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, "file", "an existing file", "no such file or directory")
    if p.is_dir() and not allow_dir:
        raise InputError(p, "file", "a file, not a directory")
    if not p.is_dir() and not p.is_file():
        raise InputError(p, "file", "a regular file (written out, not a pipe or device)", _file_kind(p))
    return p


def _file_kind(p: Path) -> str:
    for test, kind in ((p.is_fifo, "a FIFO (named pipe)"), (p.is_socket, "a socket"),
                       (p.is_char_device, "a character device"), (p.is_block_device, "a block device")):
        if test():
            return kind
    return "not a regular file"


def read_head(path: Path, size: int = 65536) -> bytes:
    """The first `size` bytes of a file (b'' for a directory)."""
    if path.is_dir():
        return b""
    try:
        with path.open("rb") as fh:
            return fh.read(size)
    except OSError as exc:
        raise InputError(path, "file", "a readable file", exc.strerror or str(exc)) from None


def read_text(path: Path) -> str:
    """Whole file as text; undecodable bytes become U+FFFD, so they show up as bad fields, not crashes."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, "file", "a readable file", exc.strerror or str(exc)) from None
    return data.decode("utf-8", errors="replace")


# Line breaks str.splitlines() honours besides "\n" (and "\r\n"); a file with any takes the slow path.
_ODD_BREAKS = (b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")


def read_lines(path: Path, *, strip_bom: bool = False) -> pa.Array:
    """The file's lines as an Arrow string array: `read_text(path).splitlines()` without a Python
    object per line (the text readers then work on whole columns).

    Plain ASCII with "\n" or "\r\n" endings is split by Arrow; anything else (other UTF-8, stray
    "\r", form feeds, a BOM) goes through Python so the lines are exactly what splitlines gives.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, "file", "a readable file", exc.strerror or str(exc)) from None
    plain = data.isascii() and not any(b in data for b in _ODD_BREAKS)
    crlf = plain and b"\r" in data
    if crlf and data.count(b"\r") != data.count(b"\r\n"):
        plain = False
    if not plain:
        text = data.decode("utf-8", errors="replace")
        return pa.array((text.lstrip("\ufeff") if strip_bom else text).splitlines(), pa.string())
    if not data:
        return pa.array([], pa.string())
    body = data[:-1] if data.endswith(b"\n") else data
    lines = pc.list_flatten(
        pc.split_pattern(pa.array([body], pa.large_binary()).cast(pa.large_string()), "\n")
    )
    return pc.utf8_rtrim(lines, "\r") if crlf else lines


def decode_utf8(path: PathLike, data: bytes) -> str:
    """`data` as UTF-8 text without a leading BOM; InputError naming the line of the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(path, f"line {line}", "UTF-8 text", data[exc.start : exc.start + 4]) from None


def head_text(path: Path, size: int = 65536) -> str:
    return read_head(path, size).decode("utf-8", errors="replace")


def head_lines(path: Path, size: int = 65536) -> list[str]:
    """The lines in the first `size` bytes, without a leading BOM (what the sniffers look at)."""
    return head_text(path, size).lstrip("\ufeff").splitlines()


def check_options(path: PathLike, options: Options | None, known: Iterable[str], fmt: str) -> dict[str, str]:
    """Options as a dict; an option the reader does not know, or a malformed value, is an InputError.

    Every value is checked here, up front: a reader parses some options only when the file needs them
    (`interval` without a time column), and a bad value must not pass just because this file did not.
    """
    opts = dict(options or {})
    allowed = set(known)
    for key in opts:
        if key not in allowed:
            listed = ", ".join(sorted(allowed)) or "none"
            raise InputError(path, f"option {key!r}", f"an option of format {fmt!r} ({listed})")
        check = _OPTION_CHECKS.get(key)
        if check is not None:
            check(path, opts, key)
    return opts


def _check_names(path: PathLike, opts: Mapping[str, str], key: str) -> None:
    if not any(c.strip() for c in opts[key].split(",")):
        raise InputError(path, f"option {key}", "a comma-separated list of field names", opts[key])


# Options with the same meaning in every reader that takes them: seconds between samples, a GPU count, names.
_OPTION_CHECKS: dict[str, Callable[[PathLike, Mapping[str, str], str], object]] = {
    "interval": lambda path, opts, key: float_option(path, opts, key, 1.0),
    "gpus": lambda path, opts, key: int_option(path, opts, key),
    "columns": _check_names,
}


def float_option(path: PathLike, opts: Mapping[str, str], key: str, default: float) -> float:
    if key not in opts:
        return default
    try:
        value = float(opts[key])
    except ValueError:
        raise InputError(path, f"option {key}", "a number", opts[key]) from None
    if not np.isfinite(value) or value <= 0:
        raise InputError(path, f"option {key}", "a positive number", opts[key])
    return value


def int_option(path: PathLike, opts: Mapping[str, str], key: str) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError:
        raise InputError(path, f"option {key}", "a whole number", opts[key]) from None
    if value < 1:
        raise InputError(path, f"option {key}", "a whole number >= 1", opts[key])
    return value


def synth_uuid(path: PathLike, index: int | str) -> str:
    """A stable id for a device in a file that names none: `file:<stem>#<index>`."""
    return f"file:{Path(path).stem}#{index}"


def base_meta(path: PathLike, fmt: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"source_path": str(path), "format": fmt}
    meta.update(extra)
    return meta


def _as_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def strings_to_float(
    col: pa.Array | pa.ChunkedArray,
    path: PathLike,
    field: str,
    *,
    row_base: int = 1,
    strip_suffix: bool = True,
    hex_ok: bool = False,
) -> FloatArray:
    """Parse a column of text numbers (maybe with a unit suffix like '575.3 W') into float64, vectorised.

    Missing tokens ('', '[N/A]', 'N/A', '[Not Supported]', '-') become NaN. Anything else that is not a
    number is an InputError naming the data row (`row_base` = number of the first row) and the value.
    """
    arr = _as_array(col)
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_null(arr.type):
        return np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    text = pc.utf8_trim_whitespace(arr)
    if strip_suffix:
        # '575.3 W' -> '575.3'; '0 %' -> '0'; a bracketed token keeps its brackets (it is a missing marker).
        text = pc.replace_substring_regex(text, r"^([^\[\s]+)\s+\S+$", r"\1")
    missing = pc.fill_null(pc.match_substring_regex(text, _MISSING_RE), True)
    if hex_ok:
        is_hex = pc.fill_null(pc.match_substring_regex(text, r"^0[xX][0-9a-fA-F]+$"), False)
        if pc.any(is_hex).as_py():
            return _hex_to_float(text, missing, is_hex, path, field, row_base)
    cleaned = pc.if_else(missing, pa.scalar(None, pa.string()), text)
    try:
        out = cleaned.cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = pc.fill_null(pc.match_substring_regex(cleaned, _NUMBER_RE), True)
        bad = np.flatnonzero(~np.asarray(ok.to_numpy(zero_copy_only=False), dtype=bool))
        i = int(bad[0]) if bad.size else 0
        raise InputError(path, f"row {row_base + i}, field {field!r}", "a number", arr[i].as_py()) from None
    return np.asarray(out.to_numpy(zero_copy_only=False), dtype=np.float64)


def arrow_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow boolean column as a numpy bool array (null = False)."""
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def dictionary_codes(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Dictionary-encode a text column: per-row codes (numpy int64, null read as "") and the distinct
    values in order of first appearance. One Python object per distinct value, none per row."""
    enc = pc.dictionary_encode(pc.fill_null(_as_array(col), ""))
    codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return codes, enc.dictionary.to_pylist()


def arrow_all(arr: pa.Array | pa.ChunkedArray) -> bool:
    """Whether every value of an Arrow boolean column is true (null = False; empty = True)."""
    return bool(pc.all(pc.fill_null(arr, False)).as_py() is not False)


def require_finite(
    values: FloatArray, path: PathLike, field: str, expected: str, got: str, *, rows: np.ndarray | None = None
) -> None:
    """InputError naming the first row whose value is NaN/inf (`rows`: file row index of each value)."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = int(bad[0]) if rows is None else int(rows[bad[0]])
        raise InputError(path, f"row {row + 1}, field {field!r}", expected, got)


def _hex_to_float(
    text: pa.Array, missing: pa.Array, is_hex: pa.Array, path: PathLike, field: str, row_base: int
) -> FloatArray:
    values = text.to_pylist()
    miss = np.asarray(missing.to_numpy(zero_copy_only=False), dtype=bool)
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):  # bitmask columns are short and rare; plain Python is fine here
        if miss[i]:
            continue
        try:
            out[i] = float(int(v, 16)) if v.lower().startswith("0x") else float(v)
        except (ValueError, AttributeError):
            raise InputError(
                path, f"row {row_base + i}, field {field!r}", "a number or 0x bitmask", v
            ) from None
    return out


def parse_timestamps(
    col: pa.Array | pa.ChunkedArray, path: PathLike, field: str, *, row_base: int = 1
) -> FloatArray:
    """nvidia-smi timestamps ('2025/07/27 00:22:27.858', also ISO 'YYYY-MM-DD HH:MM:SS') -> Unix seconds.

    The files carry no zone; we read them as UTC.
    """
    arr = _as_array(col)
    text = pc.replace_substring(pc.utf8_trim_whitespace(arr.cast(pa.string())), "/", "-")
    try:
        ts = text.cast(pa.timestamp("us"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = pc.fill_null(
            pc.match_substring_regex(text, r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?$"), False
        )
        bad = np.flatnonzero(~np.asarray(ok.to_numpy(zero_copy_only=False), dtype=bool))
        i = int(bad[0]) if bad.size else 0
        raise InputError(
            path,
            f"row {row_base + i}, field {field!r}",
            "a timestamp like 2025/07/27 00:22:27.858",
            arr[i].as_py(),
        ) from None
    if ts.null_count:
        i = int(np.flatnonzero(np.asarray(pc.is_null(ts).to_numpy(zero_copy_only=False)))[0])
        raise InputError(path, f"row {row_base + i}, field {field!r}", "a timestamp", arr[i].as_py())
    micros = np.asarray(ts.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    return micros / 1e6


# The times a trace may carry, in seconds: Unix time up to 2100, or a log's own clock from 0. Beyond it
# is a millisecond or nanosecond stamp read as seconds, or garbage; the standard library cannot even
# format most of it as a date (OSError, OverflowError), so it stops here, in one line.
EARLIEST_TIME = 0.0
LATEST_TIME = 4_102_444_800.0  # 2100-01-01T00:00:00Z


def check_times(path: PathLike, traces: list[Trace]) -> list[Trace]:
    """The traces, or InputError naming the first device and sample whose time is not a finite number
    within [EARLIEST_TIME, LATEST_TIME)."""
    for t in traces:
        time = np.asarray(t.time, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~((time >= EARLIEST_TIME) & (time < LATEST_TIME)))
        if bad.size:
            i = int(bad[0])
            raise InputError(
                path,
                f"{_device_name(t)}, sample {i + 1} of {time.size}: time",
                "a Unix time in seconds up to 2100-01-01 (or a log's own clock from 0); a millisecond "
                "or nanosecond stamp read as seconds?",
                float(time[i]),
            )
    return traces


def split_clock_steps(path: PathLike, traces: list[Trace]) -> list[Trace]:
    """Each trace cut where its time goes backwards, in file order: a clock step (an NTP step, a reboot,
    two runs in one file), after which the times are on another clock. Sorting them into the earlier data
    would mix two runs into one timeline and change its segments, so each part is its own trace: the
    first keeps the device's uuid, part k (k >= 2) is `<uuid>/clock<k>` with `meta["clock_step"]` = k - 1,
    and one line says where the file was cut. Readers keep the file's order so that this can see it."""
    out: list[Trace] = []
    said: list[str] = []
    for t in traces:
        steps = np.flatnonzero(np.diff(t.time) < 0) + 1
        if not steps.size:
            out.append(t)
            continue
        bounds = [0, *steps.tolist(), len(t)]
        for k, (a, b) in enumerate(itertools.pairwise(bounds)):
            part = t.take(slice(a, b))
            if k:
                part.device = replace(t.device, uuid=f"{t.device.uuid}/clock{k + 1}")
                part.meta = {**t.meta, "clock_step": k}
            out.append(part)
        where = ", ".join(
            f"sample {i + 1} ({t.time[i - 1] - t.time[i]:.3f} s back)" for i in steps[:_SAY_AT_MOST].tolist()
        )
        more = f" and {steps.size - _SAY_AT_MOST} more" if steps.size > _SAY_AT_MOST else ""
        said.append(f"{_device_name(t)} at {where}{more}, {steps.size + 1} parts")
    if said:
        log.warning(
            "phasescope: warning: %s: time goes backwards (a clock step): split into separate traces, "
            "never re-sorted: %s", path, "; ".join(said)
        )
    return out


def drop_impossible(path: PathLike, traces: list[Trace]) -> list[Trace]:
    """The traces with every value outside its signal's physical range (schema.RANGES) read as NaN
    (missing, never 0), and one line naming each signal, the count and the first samples: no joule, cost
    or verdict is computed from a reading no GPU can give."""
    out: list[Trace] = []
    found: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for t in traces:
        fixed: dict[str, FloatArray] = {}
        for name, col in t.columns.items():
            bad = impossible(name, col)
            if not bad.any():
                continue
            fixed[name] = np.where(bad, np.nan, col)
            rows = np.flatnonzero(bad)
            counts[name] = counts.get(name, 0) + rows.size
            shown = ", ".join(str(i + 1) for i in rows[:_SAY_AT_MOST].tolist())
            more = ", ..." if rows.size > _SAY_AT_MOST else ""
            found.setdefault(name, []).append(f"{_device_name(t)} sample {shown}{more}")
        out.append(t.with_columns(**fixed) if fixed else t)
    if counts:
        parts = []
        for name, n in counts.items():
            lo, hi = RANGES[name]
            unit = SIGNALS[name].unit
            parts.append(f"{name}: {n} outside {lo:g}..{hi:g} {unit} ({'; '.join(found[name])})")
        log.warning(
            "phasescope: warning: %s: %d impossible value(s) dropped, read as missing: %s",
            path, sum(counts.values()), "; ".join(parts),
        )
    return out


def first_step_back(keys: np.ndarray, time: FloatArray) -> tuple[int, int] | None:
    """For readers that join samples by time and so cannot cut at a clock step: the positions (earlier,
    later) of the first pair of samples of one key (a series, a container) whose time goes back in file
    order; None when every key's time only goes forward."""
    order = np.lexsort((np.arange(time.size), keys))  # by key, then file order
    back = np.flatnonzero((np.diff(keys[order]) == 0) & (np.diff(time[order]) < 0))
    return (int(order[back[0]]), int(order[back[0] + 1])) if back.size else None


_SAY_AT_MOST = 3  # places named in a warning line; the count says the rest


def _device_name(t: Trace) -> str:
    index = t.meta.get("gpu_index", t.device.index)
    return f"gpu {index}" if index is not None else t.device.uuid


F = TypeVar("F", bound=Callable[..., list[Trace]])


def guarded(fmt: str) -> Callable[[F], F]:
    """Turn the parse errors of the libraries we read with into one InputError line.

    Our own checks raise InputError with the row and field; this catches what slips past them in
    malformed bytes (Arrow CSV/Parquet errors, undecodable text, bad YAML) so no traceback escapes.
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(path: PathLike, *args: Any, **kwargs: Any) -> list[Trace]:
            try:
                return fn(path, *args, **kwargs)
            except InputError:
                raise
            except (pa.ArrowException, UnicodeError, yaml.YAMLError, OSError) as exc:
                raise InputError(path, "file", f"a well-formed {fmt} file", _first_line(exc)) from None
            except ValueError as exc:  # numpy/float conversion of a malformed field
                raise InputError(path, "file", f"a well-formed {fmt} file", _first_line(exc)) from None

        return inner  # type: ignore[return-value]

    return wrap


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_SIMPLE_NUM = re.compile(_NUMBER_RE)


def is_number(token: str) -> bool:
    return bool(_SIMPLE_NUM.match(token))


def read_csv_strings(
    path: Path,
    *,
    skip_rows: int,
    n_columns: int,
    expected: str,
    delimiter: str = ",",
    numeric: Iterable[int] = (),
    dropped: list[str] | None = None,
) -> pa.Table:
    """Read a CSV with every column as text (columns c0..cN-1), fast, through Arrow.

    Columns in `numeric` are parsed straight to float64 by Arrow (empty = null) when every value is a
    plain number; if one is not, the whole file is read as text instead, so that `strings_to_float`
    can name the bad row and value. A row with the wrong number of fields is an InputError naming its
    line and what was expected; with `dropped` given, such rows (and a cut last line) are skipped
    instead and `dropped` gets one entry per row, the first few naming their line, for the caller to say.
    """
    import pyarrow.csv as pcsv  # local: only the CSV readers need it

    bad: list[Any] = []

    def on_invalid(row: Any) -> str:
        bad.append(row)
        return "skip"

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, "file", "a readable file", exc.strerror or str(exc)) from None
    # Arrow's bad-row callback cannot decode non-UTF-8 text (it prints a stray traceback): check first.
    if not data.isascii():
        decode_utf8(path, data)
    whole = len(data)
    data = drop_cut_last_line(data, delimiter, n_columns)
    if dropped is not None and len(data) < whole:
        line = data.count(b"\n") + 1
        dropped.append(f"line {line} (the last, {CUT_OFF} after {whole - len(data)} bytes)")
    names = [f"c{i}" for i in range(n_columns)]
    fast = {f"c{i}" for i in numeric if 0 <= i < n_columns}

    def load(typed: set[str]) -> pa.Table:
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(skip_rows=skip_rows, column_names=names, block_size=1 << 22),
            parse_options=pcsv.ParseOptions(
                delimiter=delimiter, quote_char=False, invalid_row_handler=on_invalid
            ),
            convert_options=pcsv.ConvertOptions(
                column_types={n: pa.float64() if n in typed else pa.string() for n in names},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )

    try:
        table = load(fast)
    except pa.ArrowInvalid:
        if not fast:
            raise
        bad.clear()
        table = load(set())  # slow path: text, so the bad value can be named with its row
    if bad and dropped is not None:
        named = [f"{_where(data, r)} ({getattr(r, 'actual_columns', '?')} fields)" for r in bad[:3]]
        dropped[:0] = named + [""] * (len(bad) - len(named))
    elif bad:
        row = bad[0]
        text = str(getattr(row, "text", ""))
        where = _where(data, row)
        got = f"{getattr(row, 'actual_columns', '?')} fields: {text[:60]!r}"
        raise InputError(path, where, f"{n_columns} comma-separated fields ({expected})", got)
    return table


def _where(data: bytes, row: Any) -> str:
    """'line N' for an Arrow invalid row (multi-threaded Arrow does not know the line; find it)."""
    number = getattr(row, "number", None)
    if not (isinstance(number, int) and number > 0):
        number = _line_of(data, str(getattr(row, "text", "")))
    return f"line {number}" if number else "a row"


CUT_OFF = "cut off"  # the words a `dropped` entry of read_csv_strings uses for a cut last line


def drop_cut_last_line(data: bytes, delimiter: str, n_columns: int) -> bytes:
    """`data` without its last line when that line was cut short: no line break after it and fewer
    fields than the header. A logger killed mid-write (`nvidia-smi -f` stopped by `kill`) leaves such a
    line; every complete row before it is kept rather than refusing the whole file."""
    if not data or data.endswith(b"\n"):
        return data
    cut = data.rfind(b"\n")
    if cut < 0 or data[cut + 1 :].count(delimiter.encode()) >= n_columns - 1:
        return data
    return data[: cut + 1]


def _line_of(data: bytes, text: str) -> int | None:
    """The number of the first line of `data` that is `text` whole (a line break or the file's end after it,
    "\r" allowed): a short bad row ('20', a cut timestamp) is also a piece of many good lines before it."""
    needle = text.encode("utf-8", errors="replace") if text else b""
    at = data.find(needle) if needle else -1
    while at >= 0:
        end = at + len(needle)
        if (at == 0 or data[at - 1] == 0x0A) and (end == len(data) or data[end] in (0x0A, 0x0D)):
            return data.count(b"\n", 0, at) + 1
        at = data.find(needle, at + 1)
    return None
