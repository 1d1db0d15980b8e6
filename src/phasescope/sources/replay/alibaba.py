"""Alibaba cluster-trace-v2026-GenAI (GenTD26) pod GPU metrics: a pair of long CSV files.

`pod_gpu_duty_cycle_anon.csv` (value = GPU utilisation in percent, per the source README; 0-100 in the
data) and `pod_gpu_memory_used_bytes_anon.csv` (bytes), joined on `container_ip` and `timestamp_anon`.
Given either file, its sibling is read too when present. One Trace per container. The data is
anonymised: timestamps are shifted (seconds, not real dates) and values are scaled by the publisher;
meta says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from phasescope.errors import InputError
from phasescope.schema import PERCENT, DeviceInfo, FloatArray, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    dictionary_codes,
    first_step_back,
    guarded,
    head_lines,
    read_csv_strings,
    require_finite,
    strings_to_float,
)

NAME = "alibaba-gentd26"
FILES: dict[str, tuple[str, float]] = {
    "pod_gpu_duty_cycle_anon.csv": ("gpu_util", PERCENT),
    "pod_gpu_memory_used_bytes_anon.csv": ("mem_used", 1.0),
}
_COLUMNS = {"value", "timestamp_anon", "container_ip"}


def _header(path: Path) -> list[str]:
    lines = head_lines(path, 1024)
    return [c.strip() for c in lines[0].split(",")] if lines else []


def sniff(path: PathLike) -> bool:
    p = Path(path)
    return p.is_file() and set(_header(p)) == _COLUMNS


def _signal_of(p: Path) -> tuple[str, float]:
    if p.name in FILES:
        return FILES[p.name]
    name = p.name.lower()
    if "duty" in name or "util" in name:
        return "gpu_util", PERCENT
    if "memory" in name or "bytes" in name:
        return "mem_used", 1.0
    raise InputError(p, "file name", f"one of {', '.join(FILES)} (tells which signal 'value' is)", p.name)


def _load(p: Path) -> tuple[str, FloatArray, FloatArray, pa.ChunkedArray]:
    header = _header(p)
    if set(header) != _COLUMNS or len(header) != 3:
        raise InputError(p, "header", "columns value, timestamp_anon, container_ip", ",".join(header)[:60])
    sig, factor = _signal_of(p)
    numeric = [header.index("value"), header.index("timestamp_anon")]
    table = read_csv_strings(p, skip_rows=1, n_columns=3, expected=",".join(header), numeric=numeric)
    col = {name: table.column(f"c{j}") for j, name in enumerate(header)}
    value = strings_to_float(col["value"], p, "value", strip_suffix=False) * factor
    time = strings_to_float(col["timestamp_anon"], p, "timestamp_anon", strip_suffix=False)
    require_finite(time, p, "timestamp_anon", "a time in seconds", "empty")
    ip = pc.utf8_trim_whitespace(col["container_ip"])
    # The files are joined by time below, so a clock step cannot be cut there (replay.read): refuse it.
    codes, names = dictionary_codes(ip)
    step = first_step_back(codes, time)
    if step is not None:
        i, j = step
        raise InputError(
            p, f"row {j + 1}, field 'timestamp_anon'",
            f"times that never go back for container {names[codes[j]]} (a clock step: split the file there)",
            f"{time[j]:.0f} after {time[i]:.0f} in row {i + 1}",
        )
    return sig, value, time, ip


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    check_options(p, options, (), NAME)
    parts = [p]
    sig, _ = _signal_of(p)
    for name, (other_sig, _) in FILES.items():
        sibling = p.with_name(name)
        if other_sig != sig and sibling.is_file():
            parts.append(sibling)
    loaded = [_load(f) for f in parts]
    # Join on (container, time): the union of sample times per container, NaN where a file lacks one.
    # Container hashes -> integer codes through Arrow's dictionary encoding (no per-row Python).
    ips = pa.chunked_array([c for _, _, _, ip in loaded for c in ip.chunks], pa.string())
    code, names = dictionary_codes(ips)
    times = np.concatenate([t for _, _, t, _ in loaded])
    # Codes in sorted-hash order, so traces come out in the same order whichever file was given.
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(np.array(names, dtype=object))] = np.arange(len(names))
    code = rank[code]
    names = sorted(names)
    order = np.lexsort((times, code))
    sc, st = code[order], times[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (np.diff(sc) != 0) | (np.diff(st) != 0)
    group = np.cumsum(new) - 1
    slot = np.empty(order.size, dtype=np.int64)
    slot[order] = group  # row of the joined table for every input row
    u_code, u_t = sc[new], st[new]
    columns: dict[str, FloatArray] = {}
    offset = 0
    for sig_name, value, t, _ in loaded:
        col = np.full(u_t.size, np.nan)
        col[slot[offset : offset + t.size]] = value
        columns[sig_name] = col
        offset += t.size
    traces: list[Trace] = []
    bounds = np.flatnonzero(np.diff(u_code)) + 1
    starts = np.concatenate(([0], bounds)).tolist()
    ends = np.concatenate((bounds, [u_code.size])).tolist()
    for n, (a, b) in enumerate(zip(starts, ends, strict=True)):
        ip = str(names[u_code[a]])
        meta = base_meta(
            p,
            NAME,
            run=ip,
            container_ip=ip,
            gpu_index=n,
            clock="anonymised",
            sibling_paths=[str(f) for f in parts[1:]],
            note="anonymised by the publisher: timestamps shifted, values scaled, ids hashed",
        )
        device = DeviceInfo(uuid=f"alibaba-gentd26:{ip}", extra={"container_ip": ip})
        traces.append(Trace(device, u_t[a:b], {k: v[a:b] for k, v in columns.items()}, meta))
    return traces
