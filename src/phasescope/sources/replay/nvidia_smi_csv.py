"""`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` logs.

Handles units in the header (`power.draw [W]`) and/or in the values (`575.3 W`), `[N/A]` and
`[Not Supported]` (NaN), any subset of fields, and devices told apart by `index`, `uuid` or
`pci.bus_id`; without those, GPUs interleaved row by row are split by the sweep structure of the
timestamps (`gpus=N` forces the count). Timestamps carry no zone and are read as UTC.

Options: `columns=` the --query-gpu list (needed for ambiguous noheader files), `gpus=N`,
`interval=S` (seconds between sweeps when the file has no timestamp; default 1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
    head_lines,
    int_option,
    parse_timestamps,
    read_csv_strings,
    strings_to_float,
    synth_uuid,
)

NAME = "nvidia-smi-csv"
OPTIONS = ("columns", "gpus", "interval")

# --query-gpu field -> (signal, default factor into base units). Earlier fields win for a signal.
FIELDS: dict[str, tuple[str, float]] = {
    "utilization.gpu": ("gpu_util", PERCENT),
    "utilization.memory": ("mem_util", PERCENT),
    "memory.used": ("mem_used", MIB),
    "memory.total": ("mem_total", MIB),
    "power.draw": ("power", 1.0),
    "power.draw.average": ("power", 1.0),
    "power.draw.instant": ("power", 1.0),
    "enforced.power.limit": ("power_limit", 1.0),
    "power.limit": ("power_limit", 1.0),
    "temperature.gpu": ("temperature", 1.0),
    "clocks.sm": ("sm_clock", MHZ),
    "clocks.current.sm": ("sm_clock", MHZ),
    "clocks.gr": ("sm_clock", MHZ),  # graphics clock: NVIDIA runs SMs on it
    "clocks.current.graphics": ("sm_clock", MHZ),
    "clocks.mem": ("mem_clock", MHZ),
    "clocks.current.memory": ("mem_clock", MHZ),
    "clocks_throttle_reasons.active": ("throttle_reasons", 1.0),
    "clocks_event_reasons.active": ("throttle_reasons", 1.0),
}
IDENTITY = ("timestamp", "index", "uuid", "name", "pci.bus_id", "driver_version", "serial")
_ALIASES = {"gpu_uuid": "uuid", "gpu_name": "name", "gpu_bus_id": "pci.bus_id", "count": "count"}
# A unit in the header or the values -> factor into base units.
UNITS: dict[str, float] = {
    "%": PERCENT,
    "MiB": MIB,
    "KiB": 1024.0,
    "GiB": MIB * 1024.0,
    "W": 1.0,
    "MHz": MHZ,
    "C": 1.0,
}

_FIELD_RE = re.compile(r"^[a-z_][a-z0-9_.]*$")
_HEADER_UNIT_RE = re.compile(r"^\s*([^\[\]]+?)\s*(\[([^\]]*)\])?\s*$")
_TS_RE = re.compile(r"^\d{4}[/-]\d{2}[/-]\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?$")
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Fa-f-]+$")
_PCI_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_NUM_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)$")
_UNIT_VALUE_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)\s+(%|MiB|W|MHz)$")
_MISSING_RE = re.compile(r"^(\[.*\]|N/?A)$")


def _split_line(line: str) -> list[str]:
    return [f.strip() for f in line.rstrip("\r\n").split(",")]


def _first_lines(path: Path, n: int = 64) -> list[str]:
    return [ln for ln in head_lines(path) if ln.strip()][:n]


def _is_header(fields: Sequence[str]) -> bool:
    names = [_HEADER_UNIT_RE.match(f) for f in fields]
    if not all(names):
        return False
    bare = [m.group(1).strip() for m in names if m]
    known = [b for b in bare if b in FIELDS or b in IDENTITY or b in _ALIASES]
    return bool(known) and all(_FIELD_RE.match(b) for b in bare)


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
    first = _split_line(lines[0])
    if _is_header(first):
        return True
    # noheader: nvidia-smi separates with ', ' and leads with a timestamp, an index or a uuid
    return ", " in lines[0] and _looks_like_row(first)


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    opts = check_options(p, options, OPTIONS, NAME)
    lines = _first_lines(p)
    if not lines:
        raise InputError(p, "file", "nvidia-smi CSV rows", "an empty file")
    first = _split_line(lines[0])
    has_header = _is_header(first)
    if "columns" in opts:
        columns = [c.strip() for c in opts["columns"].split(",") if c.strip()]
        header_units: list[str | None] = [None] * len(columns)
        if has_header and len(first) != len(columns):
            raise InputError(p, "option columns", f"{len(first)} names to match the header", len(columns))
    elif has_header:
        columns, header_units = _parse_header(first)
    else:
        columns = _infer_columns(p, [_split_line(ln) for ln in lines[:32]])
        header_units = [None] * len(columns)
    columns = [_ALIASES.get(c, c) for c in columns]
    # Blank lines before the header are skipped by Arrow too, so skipping one row skips the header.
    table = read_csv_strings(
        p, skip_rows=1 if has_header else 0, n_columns=len(columns), expected=", ".join(columns)
    )
    if table.num_rows == 0:
        raise InputError(p, "data", "at least one data row", "only a header")
    return _to_traces(p, table, columns, header_units, opts)


def _parse_header(fields: Sequence[str]) -> tuple[list[str], list[str | None]]:
    names: list[str] = []
    units: list[str | None] = []
    for f in fields:
        m = _HEADER_UNIT_RE.match(f)
        names.append(m.group(1).strip() if m else f)
        units.append(m.group(3) if m and m.group(3) else None)
    return names, units


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
    if unknown or not any(n in FIELDS for n in names if n):
        raise InputError(
            p,
            f"column {(unknown or [0])[0] + 1} of {width}",
            "a header line, or the --query-gpu field list as nvidia-smi-csv:columns=a,b,c "
            "(noheader columns are only inferred where unambiguous)",
            rows[0][(unknown or [0])[0]],
        )
    return [n if n is not None else f"_unknown{j}" for j, n in enumerate(names)]


def _to_traces(
    p: Path, table: pa.Table, columns: list[str], header_units: list[str | None], opts: dict[str, str]
) -> list[Trace]:
    n = table.num_rows
    col = {name: table.column(f"c{j}") for j, name in enumerate(columns)}
    signals: dict[str, FloatArray] = {}
    for field, (sig, default_factor) in FIELDS.items():
        if field not in col or sig in signals:
            continue
        j = columns.index(field)
        unit = header_units[j]
        factor = default_factor
        if unit is not None and sig != "throttle_reasons":
            if unit not in UNITS:
                raise InputError(p, f"header field {field!r}", f"a unit among {', '.join(UNITS)}", unit)
            factor = UNITS[unit]
        signals[sig] = strings_to_float(col[field], p, field, hex_ok=sig == "throttle_reasons") * factor

    if "timestamp" in col:
        time = parse_timestamps(col["timestamp"], p, "timestamp")
        clock = "unix"
    else:
        time = None
        clock = "sweep"

    keys, key_field = _device_keys(p, col, n, time, opts)
    uniq = list(dict.fromkeys(keys.tolist()))
    if time is None:
        interval = float_option(p, opts, "interval", 1.0)
        time = np.empty(n)
        for k in uniq:  # no clock in the file: the k-th row of a GPU is sweep k
            sel = keys == k
            time[sel] = np.arange(int(sel.sum())) * interval
    text: dict[str, list[object]] = {
        f: col[f].to_pylist() for f in ("uuid", "name", "index", "pci.bus_id", "driver_version") if f in col
    }
    traces: list[Trace] = []
    for pos, k in enumerate(uniq):
        sel = np.flatnonzero(keys == k)
        first = int(sel[0])
        index = _index_of(text, first, k, key_field, pos)
        uuid = str(text["uuid"][first]).strip() if "uuid" in text else ""
        name = str(text["name"][first]).strip() if "name" in text else ""
        extra = {"pci_bus_id": str(text["pci.bus_id"][first]).strip()} if "pci.bus_id" in text else {}
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
            NAME,
            run=p.stem,
            gpu_index=index if index is not None else pos,
            clock=clock,
            device_key=key_field,
            timezone="UTC (assumed: nvidia-smi prints local time, no zone)",
        )
        if "driver_version" in text:
            meta["driver_version"] = str(text["driver_version"][first]).strip()
        traces.append(Trace(device, t, cols, meta))
    return traces


def _index_of(text: dict[str, list[object]], row: int, key: object, key_field: str, pos: int) -> int | None:
    if key_field == "interleave":
        return int(str(key))
    if "index" in text:
        value = str(text["index"][row]).strip()
        return int(value) if value.isdigit() else None
    return pos


def _device_keys(
    p: Path, col: dict[str, pa.ChunkedArray], n: int, time: FloatArray | None, opts: dict[str, str]
) -> tuple[np.ndarray, str]:
    """One key per row telling its device: index > uuid > pci.bus_id > interleave order."""
    for field in ("index", "uuid", "pci.bus_id"):
        if field in col:
            values = pc.utf8_trim_whitespace(col[field]).to_numpy(zero_copy_only=False)
            if field == "index":
                bad = [i for i, v in enumerate(values[:1000]) if not str(v).isdigit()]
                if bad:
                    raise InputError(
                        p, f"row {bad[0] + 1}, field 'index'", "a GPU index (0, 1, ...)", values[bad[0]]
                    )
            return np.asarray(values, dtype=object), field
    gpus = int_option(p, opts, "gpus")
    if gpus is None:
        gpus = infer_gpu_count(time) if time is not None else 1
        if gpus is None:
            raise InputError(
                p,
                "timestamps",
                "a regular sweep of rows per GPU to tell how many GPUs "
                "are interleaved; pass nvidia-smi-csv:gpus=N",
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
