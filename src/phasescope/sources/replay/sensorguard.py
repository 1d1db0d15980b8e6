"""SensorGuard runs: `nvml.csv` (CRLF, anchor row, several GPUs per file) plus its `manifest.yaml`.

Time is `t_receipt_raw_s`, the run's own CLOCK_MONOTONIC_RAW seconds, which the labels use; the anchor
row (tick_index -1) ties it to UTC and `meta["utc_offset"]` holds the difference (unix = raw + offset).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from phasescope.errors import InputError
from phasescope.schema import KB_PER_S, MHZ, MIB, PERCENT, DeviceInfo, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    guarded,
    head_lines,
    read_csv_strings,
    require_finite,
    strings_to_float,
)

NAME = "sensorguard"

_HEADER = (
    "tick_index",
    "t_target_raw_s",
    "t_receipt_raw_s",
    "utc_anchor",
    "gpu_index",
    "gpu_uuid",
    "status",
)
# file column -> (schema signal, factor into base units)
_VALUES: dict[str, tuple[str, float]] = {
    "util_gpu_pct": ("gpu_util", PERCENT),
    "util_mem_pct": ("mem_util", PERCENT),
    "mem_used_mib": ("mem_used", MIB),
    "power_w": ("power", 1.0),
    "temp_c": ("temperature", 1.0),
    "clock_sm_mhz": ("sm_clock", MHZ),
    "clock_mem_mhz": ("mem_clock", MHZ),
    "pcie_tx_kbps": ("pcie_tx", KB_PER_S),
    "pcie_rx_kbps": ("pcie_rx", KB_PER_S),
}
# After the last pre-run marker burst / before the first post-run one (data/README.md), when the
# manifest has no workload.start_raw_s / end_raw_s.
SETTLE_AFTER_PRE_S = 3.0
SETTLE_BEFORE_POST_S = 11.0


def _csv_path(path: Path) -> Path:
    return path / "nvml.csv" if path.is_dir() else path


def sniff(path: PathLike) -> bool:
    p = Path(path)
    csv = _csv_path(p)
    if not csv.is_file():
        return False
    lines = head_lines(csv, 512)
    return bool(lines) and lines[0].startswith(",".join(_HEADER[:3]))


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path, allow_dir=True)
    check_options(p, options, (), NAME)
    csv = _csv_path(p)
    check_file(csv)
    manifest = _load_manifest(csv.parent / "manifest.yaml")
    table = _read_table(csv)
    return _split(csv, table, manifest)


def _read_table(csv: Path) -> pa.Table:
    header = head_lines(csv, 4096)
    names = header[0].strip().split(",") if header else []
    missing = [c for c in (*_HEADER, *_VALUES) if c not in names]
    if missing:
        raise InputError(
            csv,
            "header",
            f"SensorGuard nvml.csv columns ({', '.join(_HEADER)}, ...)",
            f"no column {missing[0]!r}",
        )
    numeric = [
        i for i, c in enumerate(names) if c in _VALUES or c in ("tick_index", "t_receipt_raw_s", "gpu_index")
    ]
    table = read_csv_strings(
        csv, skip_rows=1, n_columns=len(names), expected="the nvml.csv header's columns", numeric=numeric
    )
    return table.rename_columns(names)


def _split(csv: Path, table: pa.Table, manifest: dict[str, Any]) -> list[Trace]:
    n = table.num_rows
    if n == 0:
        raise InputError(csv, "data", "at least one row with status 'ok'", "no data rows")
    status = pc.utf8_trim_whitespace(table.column("status"))
    tick = strings_to_float(table.column("tick_index"), csv, "tick_index", row_base=1)
    receipt = strings_to_float(table.column("t_receipt_raw_s"), csv, "t_receipt_raw_s", row_base=1)

    utc_offset = _utc_offset(csv, table, tick, receipt)
    ok = np.asarray(pc.equal(status, "ok").to_numpy(zero_copy_only=False), dtype=bool)
    if not ok.any():
        raise InputError(csv, "column 'status'", "at least one row with status 'ok'", "none")
    rows = np.flatnonzero(ok)
    require_finite(receipt[rows], csv, "t_receipt_raw_s", "a number", "empty", rows=rows)

    # Parse on the whole table so an error names the row as it is in the file, then keep the ok rows.
    time = receipt[rows]
    gpu_index = strings_to_float(table.column("gpu_index"), csv, "gpu_index")[rows]
    whole = np.isfinite(gpu_index) & (gpu_index == np.round(gpu_index))
    if not whole.all():
        r = int(rows[np.flatnonzero(~whole)[0]])
        raise InputError(
            csv, f"row {r + 1}, field 'gpu_index'", "a whole number", table["gpu_index"][r].as_py()
        )
    values = {
        sig: strings_to_float(table.column(col), csv, col)[rows] * factor
        for col, (sig, factor) in _VALUES.items()
    }
    uuids = np.asarray(table.column("gpu_uuid").to_numpy(zero_copy_only=False), dtype=object)[rows]

    info = _manifest_meta(manifest)
    under_test: list[int] = info.pop("gpus_under_test", [])
    all_indices = sorted({int(i) for i in np.unique(gpu_index)})
    mark_from, mark_to, mark_src = _workload_span(manifest)
    dropped = int(n - ok.sum())
    traces: list[Trace] = []
    for idx in all_indices:
        sel = np.flatnonzero(gpu_index == idx)
        order = sel  # file order: replay.read cuts a clock step there, never re-sorts it into earlier data
        t = time[order]
        meta = base_meta(
            csv,
            NAME,
            gpu_index=idx,
            clock="monotonic_raw",
            utc_offset=utc_offset,
            dropped_rows=dropped,
            **info,
        )
        meta["gpus_under_test"] = list(under_test)
        meta["under_test"] = idx in under_test
        if mark_from is not None and mark_to is not None:
            meta["workload_start_raw_s"] = mark_from
            meta["workload_end_raw_s"] = mark_to
            meta["workload_span_source"] = mark_src
            # A markers-only copy ends before the workload starts: no workload span to label there.
            covers = t.size > 0 and t[0] <= mark_to and t[-1] >= mark_from
            meta["markers_only"] = not covers
            if idx in under_test and covers:
                meta["t_from"] = mark_from
                meta["t_to"] = mark_to
        uuid = str(uuids[order[0]]).strip() if order.size else ""
        device = DeviceInfo(
            uuid=uuid or f"file:{csv.parent.name}#{idx}", index=idx, host=str(info.get("host", ""))
        )
        traces.append(Trace(device, t, {k: v[order] for k, v in values.items()}, meta))
    return traces


def _utc_offset(csv: Path, table: pa.Table, tick: np.ndarray, receipt: np.ndarray) -> float | None:
    anchors = np.flatnonzero(tick == -1)
    if anchors.size == 0:
        return None
    i = int(anchors[0])
    text = str(table.column("utc_anchor")[i].as_py() or "").strip()
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(csv, f"row {i + 1}, field 'utc_anchor'", "an ISO 8601 UTC time", text) from None
    if stamp.tzinfo is None or not np.isfinite(receipt[i]):
        raise InputError(csv, f"row {i + 1}, field 'utc_anchor'", "an ISO 8601 time with a zone", text)
    return float(stamp.timestamp() - receipt[i])


def _load_manifest(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f"line {where.line + 1}" if where is not None else "content"
        raise InputError(path, line, "valid YAML", str(getattr(exc, "problem", exc))) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(path, "top level", "a YAML mapping", type(data).__name__)
    return data


def _section(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    value = manifest.get(key)
    return value if isinstance(value, dict) else {}


def _manifest_meta(manifest: dict[str, Any]) -> dict[str, Any]:
    work = _section(manifest, "workload")
    hw = _section(manifest, "hardware")
    out: dict[str, Any] = {}
    if "run_id" in manifest:
        out["run"] = str(manifest["run_id"])
        out["run_id"] = str(manifest["run_id"])
    if "name" in work:
        out["workload"] = str(work["name"])
    if "family" in work:
        out["workload_family"] = str(work["family"])
    for key in ("start_utc", "end_utc"):
        if key in manifest:
            out[key] = str(manifest[key])
    bursts = manifest.get("marker_bursts")
    if isinstance(bursts, dict):
        out["marker_bursts"] = {k: _pairs(bursts.get(k)) for k in ("pre", "post")}
    under: list[int] = []
    if "gpu_index_under_test" in hw:
        out["gpu_index_under_test"] = hw["gpu_index_under_test"]
        under += _ints(hw["gpu_index_under_test"])
    if "gpu_set" in hw:
        out["gpu_set"] = str(hw["gpu_set"])
        under += _ints(hw["gpu_set"])  # 'all' = every GPU was monitored, not that all ran the workload
    out["gpus_under_test"] = sorted(set(under))
    return out


def _ints(value: Any) -> list[int]:
    out: list[int] = []
    for part in str(value).split(","):
        part = part.strip()
        if part.lstrip("-").isdigit():
            out.append(int(part))
    return out


def _pairs(value: Any) -> list[list[float]]:
    out: list[list[float]] = []
    if isinstance(value, list):
        for item in value:
            if isinstance(item, list | tuple) and len(item) == 2:
                try:
                    out.append([float(item[0]), float(item[1])])
                except (TypeError, ValueError):
                    continue
    return out


def _workload_span(manifest: dict[str, Any]) -> tuple[float | None, float | None, str]:
    """The workload span on the raw clock: from the manifest, else trimmed inside the marker bursts."""
    work = _section(manifest, "workload")
    try:
        if "start_raw_s" in work and "end_raw_s" in work:
            return float(work["start_raw_s"]), float(work["end_raw_s"]), "manifest"
    except (TypeError, ValueError):
        pass
    bursts = manifest.get("marker_bursts")
    if isinstance(bursts, dict):
        pre, post = _pairs(bursts.get("pre")), _pairs(bursts.get("post"))
        if pre and post:
            start = max(b for _, b in pre) + SETTLE_AFTER_PRE_S
            end = min(a for a, _ in post) - SETTLE_BEFORE_POST_S
            if end > start:
                return start, end, "marker_bursts"
    return None, None, ""
