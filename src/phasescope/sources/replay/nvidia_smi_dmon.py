"""`nvidia-smi dmon` text: two header lines (`# gpu pwr ...` / `# Idx W ...`), whitespace columns.

Any `-s` selection, `-` for unsupported values (NaN), optional `-o D`/`-o T` date and time columns,
headers repeated through the file, and noise lines around the table (skipped, counted in meta).
Also the same rows re-emitted as CSV (`time,gpu,pwr,...` then `s,Idx,W,...`).
Without a time column, the k-th row of a GPU is at k * interval (option `interval=`, default 1 s,
dmon's default delay).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import MHZ, MIB, PERCENT, DeviceInfo, FloatArray, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    float_option,
    guarded,
    head_text,
    read_text,
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


def sniff(path: PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    lines = head_text(p, 16384).lstrip("\ufeff").splitlines()
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
    lines = read_text(p).lstrip("\ufeff").splitlines()
    first = lines[0] if lines else ""
    if "," in first and not first.lstrip().startswith("#"):
        names, units, rows, line_no, skipped = _parse_csv(p, lines)
    else:
        names, units, rows, line_no, skipped = _parse_text(p, lines)
    if not rows:
        raise InputError(p, "data", "at least one dmon data row under the '# gpu ...' header", "none")
    return _to_traces(p, names, units, rows, line_no, skipped, interval)


def _parse_text(p: Path, lines: list[str]) -> tuple[list[str], list[str], list[list[str]], list[int], int]:
    names: list[str] = []
    units: list[str] = []
    rows: list[list[str]] = []
    line_no: list[int] = []
    skipped = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            continue
        if stripped.startswith("#"):
            if _HEADER_RE.match(stripped):
                head = stripped.lstrip("#").split()
                unit_line = lines[i + 1].strip() if i + 1 < len(lines) else ""
                unit = unit_line.lstrip("#").split() if unit_line.startswith("#") else []
                if names and head != names:
                    raise InputError(
                        p, f"line {i + 1}", "the same dmon columns as the first header", " ".join(head)
                    )
                names = head
                units = unit if len(unit) == len(head) else []
                i += 2 if unit_line.startswith("#") else 1
                continue
            i += 1  # other comment
            continue
        tokens = stripped.split()
        if not names or not _starts_like_row(tokens[0]):
            skipped += 1  # text printed around the table (a shell prompt, a script's log line)
            i += 1
            continue
        if len(tokens) != len(names):
            raise InputError(
                p,
                f"line {i + 1}",
                f"{len(names)} whitespace-separated fields ({' '.join(names)})",
                f"{len(tokens)} fields: {stripped[:60]!r}",
            )
        rows.append(tokens)
        line_no.append(i + 1)
        i += 1
    if not names:
        raise InputError(p, "header", "a dmon header line '# gpu pwr ...'", "none")
    return names, units, rows, line_no, skipped


def _parse_csv(p: Path, lines: list[str]) -> tuple[list[str], list[str], list[list[str]], list[int], int]:
    names = [c.strip() for c in lines[0].split(",")]
    units = [c.strip() for c in lines[1].split(",")] if len(lines) > 1 else []
    if "gpu" not in names:
        raise InputError(p, "header", "dmon columns including 'gpu'", lines[0][:60])
    rows: list[list[str]] = []
    line_no: list[int] = []
    for i, line in enumerate(lines[2:], start=3):
        if not line.strip():
            continue
        tokens = [c.strip() for c in line.split(",")]
        if len(tokens) != len(names):
            raise InputError(
                p,
                f"line {i}",
                f"{len(names)} comma-separated fields ({','.join(names)})",
                f"{len(tokens)} fields: {line[:60]!r}",
            )
        rows.append(tokens)
        line_no.append(i)
    return names, units, rows, line_no, 0


def _starts_like_row(token: str) -> bool:
    return token.isdigit() or token == "-"


def _to_traces(
    p: Path,
    names: list[str],
    units: list[str],
    rows: list[list[str]],
    line_no: list[int],
    skipped: int,
    interval: float,
) -> list[Trace]:
    grid = np.array(rows, dtype=str)
    lower = [n.lower() for n in names]
    gpu_col = lower.index("gpu") if "gpu" in lower else None
    if gpu_col is None:
        raise InputError(p, "header", "a 'gpu' column", " ".join(names))
    gpu = _column(p, grid, gpu_col, "gpu", line_no)
    if not np.all(np.isfinite(gpu)):
        i = int(np.flatnonzero(~np.isfinite(gpu))[0])
        raise InputError(p, f"line {line_no[i]}, field 'gpu'", "a GPU index", grid[i, gpu_col])
    signals: dict[str, FloatArray] = {}
    for j, name in enumerate(lower):
        if name not in COLUMNS or COLUMNS[name][0] in signals:
            continue
        sig, expected_unit = COLUMNS[name]
        unit = units[j] if units else expected_unit
        if unit not in UNITS:
            raise InputError(p, f"unit of column {name!r}", f"one of {', '.join(UNITS)}", unit)
        signals[sig] = _column(p, grid, j, name, line_no) * UNITS[unit]
    time, clock = _time(p, grid, lower, line_no)
    traces: list[Trace] = []
    for idx in sorted({int(g) for g in gpu}):
        sel = np.flatnonzero(gpu == idx)
        t = time[sel] if time is not None else np.arange(sel.size) * interval
        cols = {s: v[sel] for s, v in signals.items()}
        meta = base_meta(
            p,
            NAME,
            run=p.stem,
            gpu_index=idx,
            clock=clock if time is not None else "sweep",
            skipped_lines=skipped,
        )
        if time is None:
            meta["interval_s"] = interval
        traces.append(Trace(DeviceInfo(uuid=synth_uuid(p, idx), index=idx), t, cols, meta))
    return traces


def _column(p: Path, grid: np.ndarray, j: int, name: str, line_no: list[int]) -> FloatArray:
    col = grid[:, j].astype(str)
    col = np.where((col == "-") | (col == "N/A"), "nan", col)  # dmon's "unsupported" -> NaN
    try:
        return np.asarray(col.astype(np.float64), dtype=np.float64)
    except ValueError:
        pass
    for i, token in enumerate(col.tolist()):  # error path only: find the first bad token
        try:
            float(token)
        except ValueError:
            raise InputError(p, f"line {line_no[i]}, field {name!r}", "a number or '-'", token) from None
    raise InputError(p, f"column {name!r}", "numbers or '-'")


def _time(p: Path, grid: np.ndarray, lower: list[str], line_no: list[int]) -> tuple[FloatArray | None, str]:
    if "time" in lower and "date" not in lower and _looks_numeric(grid[:, lower.index("time")]):
        return _column(p, grid, lower.index("time"), "time", line_no), "relative"
    if "date" not in lower and "time" not in lower:
        return None, "sweep"
    d = lower.index("date") if "date" in lower else None
    t = lower.index("time") if "time" in lower else None
    out = np.empty(grid.shape[0])
    for i in range(grid.shape[0]):
        date = grid[i, d] if d is not None else "19700101"
        clock = grid[i, t] if t is not None else "00:00:00"
        try:
            stamp = datetime.strptime(f"{date} {clock}", "%Y%m%d %H:%M:%S").replace(tzinfo=UTC)
        except ValueError:
            raise InputError(
                p, f"line {line_no[i]}, field 'Date/Time'", "YYYYMMDD HH:MM:SS", f"{date} {clock}"
            ) from None
        out[i] = stamp.timestamp()
    if d is None:  # time of day only: unwrap midnight
        out = out + 86400.0 * np.concatenate(([0], np.cumsum(np.diff(out) < -43200)))
        return out, "time_of_day"
    return out, "unix"


def _looks_numeric(values: np.ndarray) -> bool:
    try:
        float(values[0])
    except (ValueError, IndexError):
        return False
    return True
