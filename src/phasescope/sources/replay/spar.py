"""SPAR GPU-monitoring Parquet (robirahman/SPAR-GPU-monitoring): NVML + DCGM fields at 1 Hz, one GPU.

Units, read off the values: `mem_*_mb` are MiB (A100-40GB total = 40960); `pcie_*_mbps` are NVML's KB/s
divided by 1024 (341 KB/s idle reads 0.3330078125), so bytes/s = value * 1024 * 1000.
`dcgm_*` columns fill gaps in their NVML twins; DCGM profiling columns, where a file has them, map to
sm_active / tensor_active / dram_active (ratios).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from phasescope.errors import InputError
from phasescope.schema import KB_PER_S, MHZ, MIB, PERCENT, DeviceInfo, FloatArray, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    guarded,
    read_head,
    require_finite,
    synth_uuid,
)

NAME = "spar"

# column -> (signal, factor into base units). First column present and finite wins per signal.
_NVML: dict[str, tuple[str, float]] = {
    "gpu_utilization_pct": ("gpu_util", PERCENT),
    "mem_utilization_pct": ("mem_util", PERCENT),
    "mem_used_mb": ("mem_used", MIB),
    "mem_total_mb": ("mem_total", MIB),
    "power_draw_w": ("power", 1.0),
    "temperature_c": ("temperature", 1.0),
    "sm_clock_mhz": ("sm_clock", MHZ),
    "mem_clock_mhz": ("mem_clock", MHZ),
    "pcie_tx_mbps": ("pcie_tx", 1024.0 * KB_PER_S),
    "pcie_rx_mbps": ("pcie_rx", 1024.0 * KB_PER_S),
    "power_limit_w": ("power_limit", 1.0),
    "energy_mj": ("energy", 1e-3),
}
_DCGM: dict[str, tuple[str, float]] = {
    "dcgm_gpu_util": ("gpu_util", PERCENT),
    "dcgm_mem_copy_util": ("mem_util", PERCENT),
    "dcgm_fb_used": ("mem_used", MIB),
    "dcgm_power_usage": ("power", 1.0),
    "dcgm_gpu_temp": ("temperature", 1.0),
    "dcgm_sm_clock": ("sm_clock", MHZ),
    "dcgm_mem_clock": ("mem_clock", MHZ),
    "dcgm_total_energy_consumption": ("energy", 1e-3),  # mJ
    "dcgm_sm_active": ("sm_active", 1.0),
    "dcgm_prof_sm_active": ("sm_active", 1.0),
    "dcgm_tensor_active": ("tensor_active", 1.0),
    "dcgm_pipe_tensor_active": ("tensor_active", 1.0),
    "dcgm_prof_pipe_tensor_active": ("tensor_active", 1.0),
    "dcgm_dram_active": ("dram_active", 1.0),
    "dcgm_prof_dram_active": ("dram_active", 1.0),
}
_REQUIRED = ("timestamp_epoch", "gpu_utilization_pct")


def sniff(path: PathLike) -> bool:
    p = Path(path)
    if not p.is_file() or read_head(p, 4) != b"PAR1":
        return False
    try:
        names = pq.read_schema(p).names
    except (pa.ArrowException, OSError, UnicodeError):  # UnicodeError: a damaged, non-UTF-8 column name
        return False
    return all(c in names for c in _REQUIRED)


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    check_options(p, options, (), NAME)
    table = pq.read_table(p)
    missing = [c for c in _REQUIRED if c not in table.column_names]
    if missing:
        raise InputError(p, f"column {missing[0]!r}", "a SPAR Parquet file (timestamp_epoch, *_pct, ...)")
    file_meta = _file_gpu_metadata(table)
    uuid_col = _strings(table, "gpu_uuid")
    keys = sorted(set(uuid_col)) if uuid_col is not None else [""]
    traces: list[Trace] = []
    for n, key in enumerate(keys):
        sub = table if uuid_col is None or len(keys) == 1 else table.filter(pc.equal(table["gpu_uuid"], key))
        traces.append(_one(p, sub, key, n, file_meta))
    return traces


def _one(p: Path, table: pa.Table, uuid: str, n: int, file_meta: dict[str, Any]) -> Trace:
    time = _float(p, table, "timestamp_epoch")
    require_finite(time, p, "timestamp_epoch", "a Unix time in seconds", "null")
    cols: dict[str, FloatArray] = {}
    for mapping in (_NVML, _DCGM):
        for col, (sig, factor) in mapping.items():
            if col not in table.column_names:
                continue
            vals = _float(p, table, col) * factor
            if sig in cols:
                cols[sig] = np.where(np.isfinite(cols[sig]), cols[sig], vals)  # DCGM fills NVML gaps
            else:
                cols[sig] = vals
    # -1 is SPAR's "not available" (e.g. fan speed on SXM boards); never a real reading of these signals.
    for sig, vals in cols.items():
        cols[sig] = np.where(vals < 0, np.nan, vals)
    first = {k: _first_str(table, k) for k in ("workload_label", "run_id", "gpu_name", "driver_version")}
    meta = base_meta(p, NAME, run=p.stem, gpu_index=_index(file_meta.get("gpu_index"), n), clock="unix")
    if first["workload_label"]:
        meta["workload"] = first["workload_label"]
        meta["workload_label"] = first["workload_label"]
    if first["run_id"]:
        meta["run_id"] = first["run_id"]
    if first["driver_version"]:
        meta["driver_version"] = first["driver_version"]
    name = first["gpu_name"] or str(file_meta.get("gpu_name", ""))
    uuid = uuid or str(file_meta.get("gpu_uuid", "")) or synth_uuid(p, n)
    device = DeviceInfo(uuid=uuid, name=name, index=meta["gpu_index"])
    return Trace(device, time, cols, meta)


def _float(p: Path, table: pa.Table, col: str) -> FloatArray:
    arr = table.column(col)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_null(arr.type)):
        raise InputError(p, f"column {col!r}", "numbers", str(arr.type))
    return np.asarray(arr.cast(pa.float64()).to_numpy(), dtype=np.float64)


def _strings(table: pa.Table, col: str) -> list[str] | None:
    if col not in table.column_names:
        return None
    return [str(v) if v is not None else "" for v in table.column(col).to_pylist()]


def _first_str(table: pa.Table, col: str) -> str:
    if col not in table.column_names or table.num_rows == 0:
        return ""
    value = table.column(col)[0].as_py()
    return "" if value is None else str(value)


def _index(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _file_gpu_metadata(table: pa.Table) -> dict[str, Any]:
    raw = (table.schema.metadata or {}).get(b"gpu_metadata")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
