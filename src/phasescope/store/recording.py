"""phasescope's own recording format: crash-safe while it is written, one Parquet file once closed.

Layout (long): one row per device per tick, columns `time` (float64 Unix s), `device` (uuid string),
then one float64 column per schema signal. Process samples go to a sibling table.

While recording, everything lives in `<file>.partial/`:
  header.json          devices, host, source, rate; replaced atomically whenever it changes
  seg-00001.parquet    closed segments, written to a temp name and renamed into place
  seg-00002.arrows     the open segment: an Arrow IPC stream, one record batch per flush (<= 0.5 s)
  proc-0000k.*         the same for process samples
A segment `k` is `seg-k.parquet` once rolled, else `seg-k.arrows`; the reader prefers the Parquet
file, so a crash between the rename and the delete never duplicates rows. A `kill -9` loses only
what was not yet flushed: at most `flush_s` plus one tick. `finalize()` (on close, or through
`phasescope record --recover`) merges the segments into `<file>`, `<file>.processes.parquet` and
`<file>.manifest.json`, each written to a temp name and renamed, then writes `finished.json` (fsync'd,
with the final file's sample count) into the partial dir and only then empties it, the marker last.
A kill at any point of that delete leaves a partial dir that `--recover` recognises as finished: it
checks the final file holds the marked count and completes the delete, never rebuilding from what
is left. Without the marker, `--recover` still refuses to replace a complete file with fewer samples.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from phasescope.errors import InputError
from phasescope.identity import host_name
from phasescope.schema import (
    PAPER_SIGNALS,
    SIGNAL_NAMES,
    DeviceInfo,
    FloatArray,
    ProcessSample,
    TickBatch,
    Trace,
)
from phasescope.version import __version__

FORMAT_NAME = "phasescope-recording"
PROCESSES_FORMAT_NAME = "phasescope-processes"
FORMAT_VERSION = 1
META_KEY = b"phasescope"
PARTIAL_SUFFIX = ".partial"
MANIFEST_SUFFIX = ".manifest.json"
PROCESSES_SUFFIX = ".processes.parquet"
HEADER_NAME = "header.json"
FINISHED_NAME = "finished.json"  # written once the final file is durable: the partial is only leftovers
ROW_GROUP_ROWS = 131_072
_MAX_EVENTS = 200

SAMPLE_SCHEMA = pa.schema(
    [pa.field("time", pa.float64(), nullable=False), pa.field("device", pa.string(), nullable=False)]
    + [pa.field(name, pa.float64()) for name in SIGNAL_NAMES]
)
_PROCESS_FLOATS = ("gpu_mem_used", "sm_util", "cpu_util", "rss", "threads", "read_bytes", "write_bytes")
PROCESS_SCHEMA = pa.schema(
    [
        pa.field("time", pa.float64(), nullable=False),
        pa.field("device", pa.string()),
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
    ]
    + [pa.field(name, pa.float64()) for name in _PROCESS_FLOATS]
    + [pa.field("uses_torch", pa.bool_())]
)


def partial_dir_for(path: str | Path) -> Path:
    p = Path(path)
    return p.with_name(p.name + PARTIAL_SUFFIX)


def manifest_path_for(path: str | Path) -> Path:
    p = Path(path)
    return p.with_name(p.name + MANIFEST_SUFFIX)


def processes_path_for(path: str | Path) -> Path:
    p = Path(path)
    return p.with_name(p.name + PROCESSES_SUFFIX)


def final_path_for(partial_dir: str | Path) -> Path:
    p = Path(partial_dir)
    if not p.name.endswith(PARTIAL_SUFFIX) or p.name == PARTIAL_SUFFIX:
        raise InputError(p, "directory name", f"FILE{PARTIAL_SUFFIX} (a recording in progress)", p.name)
    return p.with_name(p.name[: -len(PARTIAL_SUFFIX)])


def device_to_json(d: DeviceInfo) -> dict[str, Any]:
    return {
        "uuid": d.uuid,
        "name": d.name,
        "index": d.index,
        "host": d.host,
        "parent_uuid": d.parent_uuid,
        "extra": dict(d.extra),
    }


def device_from_json(obj: Any, where: str, path: Path) -> DeviceInfo:
    if not isinstance(obj, dict) or not isinstance(obj.get("uuid"), str) or not obj["uuid"]:
        raise InputError(path, where, "an object with a non-empty 'uuid' string", obj)
    index = obj.get("index")
    if index is not None and not isinstance(index, int):
        raise InputError(path, f"{where}.index", "an integer or null", index)
    extra = obj.get("extra") or {}
    if not isinstance(extra, dict):
        raise InputError(path, f"{where}.extra", "an object", extra)
    return DeviceInfo(
        uuid=obj["uuid"],
        name=str(obj.get("name") or ""),
        index=index,
        host=str(obj.get("host") or ""),
        parent_uuid=obj.get("parent_uuid") if isinstance(obj.get("parent_uuid"), str) else None,
        extra={str(k): str(v) for k, v in extra.items()},
    )


def _utc(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    """Make the renames and deletes inside `path` durable (a directory's entries live in the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_json(path: Path, obj: Any) -> None:
    _atomic_write_bytes(path, (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def _driver_of(devices: list[DeviceInfo]) -> str | None:
    for d in devices:
        for key in ("driver_version", "driver"):
            if d.extra.get(key):
                return str(d.extra[key])
    return None


def _processes_batch(samples: list[ProcessSample]) -> pa.RecordBatch:
    cols: list[pa.Array] = [
        pa.array([p.time for p in samples], pa.float64()),
        pa.array([p.device_uuid for p in samples], pa.string()),
        pa.array([int(p.pid) for p in samples], pa.int64()),
        pa.array([p.name for p in samples], pa.string()),
    ]
    cols += [pa.array([float(getattr(p, n)) for p in samples], pa.float64()) for n in _PROCESS_FLOATS]
    cols.append(pa.array([bool(p.uses_torch) for p in samples], pa.bool_()))
    return pa.RecordBatch.from_arrays(cols, schema=PROCESS_SCHEMA)


class _SegmentStream:
    """One kind of rows (samples or processes) of the open segment: an IPC tail plus its batches in memory."""

    def __init__(self, directory: Path, prefix: str, schema: pa.Schema) -> None:
        self.directory = directory
        self.prefix = prefix
        self.schema = schema
        self.batches: list[pa.RecordBatch] = []
        self._sink: pa.NativeFile | None = None
        self._writer: ipc.RecordBatchStreamWriter | None = None

    def tail_path(self, k: int) -> Path:
        return self.directory / f"{self.prefix}-{k:05d}.arrows"

    def append(self, k: int, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            # OSFile is unbuffered: each batch reaches the kernel at once, so it survives kill -9.
            self._sink = pa.OSFile(str(self.tail_path(k)), "wb")
            self._writer = ipc.new_stream(self._sink, self.schema)
        self._writer.write_batch(batch)
        self.batches.append(batch)

    def roll(self, k: int) -> None:
        """Close the tail of segment k and replace it by a closed Parquet file."""
        if self._writer is not None and self._sink is not None:
            self._writer.close()
            self._sink.close()
        self._writer = self._sink = None
        if self.batches:
            final = self.directory / f"{self.prefix}-{k:05d}.parquet"
            tmp = final.with_name(final.name + ".tmp")
            pq.write_table(pa.Table.from_batches(self.batches, self.schema), tmp, compression="zstd")
            _fsync(tmp)
            os.replace(tmp, final)
        self.batches = []
        self.tail_path(k).unlink(missing_ok=True)


class RecordingWriter:
    """Writes TickBatches into `<path>.partial/`, and into `<path>` (+ manifest) on close."""

    def __init__(
        self,
        path: str | Path,
        *,
        source_spec: str = "",
        interval_s: float | None = None,
        host: str | None = None,
        segment_s: float = 60.0,
        flush_s: float = 0.5,
        overwrite: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.partial_dir = partial_dir_for(self.path)
        if self.partial_dir.exists():
            raise InputError(
                self.partial_dir,
                "output",
                "no unfinished recording here (finalise it with "
                f"'phasescope record --recover {self.partial_dir}')",
                "an existing partial recording",
            )
        if self.path.exists() and not overwrite:
            raise InputError(self.path, "output", "a new file name", "an existing file")
        if segment_s <= 0 or flush_s < 0:
            raise ValueError("segment_s must be > 0 and flush_s >= 0")
        self.partial_dir.mkdir(parents=True)
        self.source_spec = source_spec
        self.interval_s = interval_s
        self.host = host if host is not None else host_name()
        self.segment_s = segment_s
        self.flush_s = flush_s
        self._clock = clock
        self._segment = 1
        self._segment_started = clock()
        self._last_flush = -float("inf")
        self._samples = _SegmentStream(self.partial_dir, "seg", SAMPLE_SCHEMA)
        self._procs = _SegmentStream(self.partial_dir, "proc", PROCESS_SCHEMA)
        self._pending: list[tuple[float, list[str], FloatArray]] = []
        self._pending_procs: list[ProcessSample] = []
        self._devices: dict[str, DeviceInfo] = {}
        self._events: list[str] = []
        self._error_counts: dict[str, int] = {}
        self._seen = np.zeros(len(SIGNAL_NAMES), dtype=bool)
        self.start: float | None = None
        self.end: float | None = None
        self.ticks = 0
        self.rows = 0
        self.closed = False
        self._write_header()

    # -- progress figures ------------------------------------------------------------------------
    @property
    def devices(self) -> list[DeviceInfo]:
        return list(self._devices.values())

    def missing_signals(self) -> list[str]:
        """Paper signals with no finite value from any device so far."""
        return [s for i, s in enumerate(SIGNAL_NAMES) if s in PAPER_SIGNALS and not self._seen[i]]

    def bytes_on_disk(self) -> int:
        target = self.partial_dir if self.partial_dir.exists() else None
        if target is None:
            return sum(p.stat().st_size for p in (self.path, processes_path_for(self.path)) if p.exists())
        return sum(e.stat().st_size for e in os.scandir(target) if e.is_file())

    # -- writing ---------------------------------------------------------------------------------
    def note_errors(self, error_counts: dict[str, int]) -> None:
        """The source's failure counters, for the manifest."""
        self._error_counts = {str(k): int(v) for k, v in error_counts.items()}

    def write(self, batch: TickBatch) -> None:
        if self.closed:
            raise RuntimeError("recording is closed")
        n = len(batch.devices)
        if batch.values.shape != (n, len(SIGNAL_NAMES)):
            raise ValueError(
                f"TickBatch.values has shape {batch.values.shape}, expected ({n}, {len(SIGNAL_NAMES)})"
            )
        new = [d for d in batch.devices if d.uuid not in self._devices]
        for d in new:
            self._devices[d.uuid] = d
        for e in batch.events:
            if len(self._events) < _MAX_EVENTS:
                self._events.append(f"{_utc(batch.time)} {e}")
        if self.start is None:
            self.start = batch.time
        self.end = batch.time
        if new or batch.events:
            self._write_header()
        if n:
            values = np.array(batch.values, dtype=np.float64)
            self._pending.append((batch.time, [d.uuid for d in batch.devices], values))
            self._seen |= np.isfinite(values).any(axis=0)
            self.rows += n
        self._pending_procs.extend(batch.processes)
        self.ticks += 1
        now = self._clock()
        if now - self._last_flush >= self.flush_s:
            self.flush()
        if now - self._segment_started >= self.segment_s:
            self.roll()

    def flush(self) -> None:
        """Append what is pending to the open segment's IPC tail."""
        self._last_flush = self._clock()
        if self._pending:
            times = np.concatenate([np.full(len(u), t) for t, u, _ in self._pending])
            uuids = [u for _, us, _ in self._pending for u in us]
            values = np.vstack([v for _, _, v in self._pending])
            arrays = [pa.array(times, pa.float64()), pa.array(uuids, pa.string())]
            arrays += [pa.array(values[:, j], pa.float64()) for j in range(values.shape[1])]
            self._samples.append(self._segment, pa.RecordBatch.from_arrays(arrays, schema=SAMPLE_SCHEMA))
            self._pending = []
        if self._pending_procs:
            self._procs.append(self._segment, _processes_batch(self._pending_procs))
            self._pending_procs = []

    def roll(self) -> None:
        """Close the open segment into Parquet and start the next one."""
        self.flush()
        self._samples.roll(self._segment)
        self._procs.roll(self._segment)
        self._segment += 1
        self._segment_started = self._clock()
        self._write_header()

    def close(self) -> dict[str, Any]:
        """Finish: merge into the final file and manifest; returns the manifest."""
        if self.closed:
            raise RuntimeError("recording is already closed")
        self.roll()
        self.closed = True
        return finalize(self.partial_dir)

    def discard(self) -> None:
        """Drop everything written (a recording stopped before its first tick)."""
        self._samples.roll(self._segment)
        self._procs.roll(self._segment)
        self.closed = True
        shutil.rmtree(self.partial_dir, ignore_errors=True)

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.close()

    def _write_header(self) -> None:
        header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "phasescope_version": __version__,
            "host": self.host,
            "source": self.source_spec,
            "interval_s": self.interval_s,
            "start": self.start,
            "devices": [device_to_json(d) for d in self._devices.values()],
            "driver": _driver_of(list(self._devices.values())),
            "events": self._events,
            "source_errors": self._error_counts,
        }
        _atomic_write_json(self.partial_dir / HEADER_NAME, header)


# -- reading the partial directory ---------------------------------------------------------------


def read_ipc_tolerant(path: Path, schema: pa.Schema) -> tuple[list[pa.RecordBatch], bool]:
    """Every complete batch of an IPC stream; True as second value when the stream was torn."""
    data = path.read_bytes()
    try:
        reader = ipc.open_stream(pa.py_buffer(data))
    except (pa.ArrowInvalid, OSError):
        return [], True  # killed before the schema message was complete: no data lost but this file
    if reader.schema.names != schema.names:
        raise InputError(path, "Arrow stream schema", f"columns {schema.names}", reader.schema.names)
    batches: list[pa.RecordBatch] = []
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            return batches, False
        except (pa.ArrowInvalid, OSError):
            return batches, True


def _segment_files(partial_dir: Path, prefix: str) -> list[Path]:
    """Segment files in order; a rolled Parquet segment wins over a leftover tail of the same number."""
    found: dict[int, Path] = {}
    for p in partial_dir.iterdir():
        stem, _, ext = p.name.partition(".")
        if not stem.startswith(prefix + "-") or ext not in ("parquet", "arrows"):
            continue
        try:
            k = int(stem[len(prefix) + 1 :])
        except ValueError:
            continue
        if k not in found or ext == "parquet":
            found[k] = p
    return [found[k] for k in sorted(found)]


def _load_segment(path: Path, schema: pa.Schema) -> tuple[pa.Table, bool]:
    if path.suffix == ".arrows":
        batches, torn = read_ipc_tolerant(path, schema)
        return pa.Table.from_batches(batches, schema), torn
    return _read_parquet_with(path, schema, "Parquet segment", "segment columns").cast(schema), False


def _read_parquet_with(path: Path, schema: pa.Schema, what: str, columns: str) -> pa.Table:
    """A whole Parquet file that must have exactly `schema`'s columns; InputError otherwise."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, UnicodeError) as exc:
        raise InputError(path, what, "a complete Parquet file", str(exc)) from exc
    if table.schema.names != schema.names:
        raise InputError(path, columns, f"{schema.names}", table.schema.names)
    return table


def _iter_segments(partial_dir: Path, prefix: str, schema: pa.Schema) -> Iterator[tuple[pa.Table, bool]]:
    for p in _segment_files(partial_dir, prefix):
        yield _load_segment(p, schema)


def read_header(partial_dir: Path) -> dict[str, Any]:
    path = partial_dir / HEADER_NAME
    if not path.exists():
        return {}
    try:
        header = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(path, "header", "JSON", str(exc)) from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise InputError(
            path,
            "header 'format'",
            repr(FORMAT_NAME),
            header.get("format") if isinstance(header, dict) else header,
        )
    return header


def is_partial_dir(path: Path) -> bool:
    return path.is_dir() and ((path / HEADER_NAME).exists() or any(_segment_files(path, "seg")))


def partial_tables(partial_dir: Path) -> tuple[dict[str, Any], pa.Table, pa.Table, bool]:
    """(header, samples, processes, torn) of a recording in progress or one that crashed."""
    if not is_partial_dir(partial_dir):
        raise InputError(
            partial_dir, "directory", "a partial phasescope recording (header.json, seg-*)", "neither"
        )
    header = read_header(partial_dir)
    torn = False
    parts = []
    for table, t in _iter_segments(partial_dir, "seg", SAMPLE_SCHEMA):
        parts.append(table)
        torn |= t
    procs = []
    for table, t in _iter_segments(partial_dir, "proc", PROCESS_SCHEMA):
        procs.append(table)
        torn |= t
    samples = pa.concat_tables(parts) if parts else SAMPLE_SCHEMA.empty_table()
    processes = pa.concat_tables(procs) if procs else PROCESS_SCHEMA.empty_table()
    return header, samples, processes, torn


# -- finalising --------------------------------------------------------------------------------


@dataclass
class _Stats:
    rows: dict[str, int] = field(default_factory=dict)
    nans: dict[str, FloatArray] = field(default_factory=dict)
    tick_times: list[FloatArray] = field(default_factory=list)
    torn: bool = False

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        dev = table.column("device").combine_chunks().dictionary_encode()
        codes = dev.indices.to_numpy()
        names = dev.dictionary.to_pylist()
        nan = np.column_stack([np.isnan(table.column(s).to_numpy()) for s in SIGNAL_NAMES])
        for code, uuid in enumerate(names):
            mask = codes == code
            self.rows[uuid] = self.rows.get(uuid, 0) + int(mask.sum())
            counts = nan[mask].sum(axis=0).astype(np.float64)
            self.nans[uuid] = self.nans[uuid] + counts if uuid in self.nans else counts
        self.tick_times.append(np.unique(table.column("time").to_numpy()))


def _missing(nan_counts: FloatArray, rows: int) -> dict[str, float]:
    return {s: (float(nan_counts[i] / rows) if rows else 1.0) for i, s in enumerate(SIGNAL_NAMES)}


def finalize(partial_dir: str | Path) -> dict[str, Any]:
    """Merge a partial recording into `<file>`, `<file>.processes.parquet` and `<file>.manifest.json`.

    Works for a cleanly closed writer and for one that was killed (`phasescope record --recover`).
    Returns the manifest.
    """
    pdir = Path(partial_dir)
    final = final_path_for(pdir)
    if (pdir / FINISHED_NAME).exists() or (pdir.is_dir() and final.exists() and not any(pdir.iterdir())):
        return _finish_delete(pdir, final)  # finalised already, killed while its partial dir was deleted
    if not is_partial_dir(pdir):
        raise InputError(pdir, "directory", "a partial phasescope recording (header.json, seg-*)", "neither")
    header = read_header(pdir)
    stats = _Stats()
    # A clean close leaves only Parquet segments; an IPC tail means the writer never finished.
    unclean = any(f.suffix == ".arrows" for f in _segment_files(pdir, "seg") + _segment_files(pdir, "proc"))
    for table, torn in _iter_segments(pdir, "seg", SAMPLE_SCHEMA):
        stats.add(table)
        stats.torn |= torn
    if not stats.rows:
        raise InputError(pdir, "partial recording", "at least one complete sample batch", "none")

    devices = [
        device_from_json(d, f"header.devices[{i}]", pdir) for i, d in enumerate(header.get("devices", []))
    ]
    known = {d.uuid for d in devices}
    devices += [DeviceInfo(uuid=u) for u in stats.rows if u not in known]  # header older than the data
    ticks = np.unique(np.concatenate(stats.tick_times))
    start, end = float(ticks[0]), float(ticks[-1])
    dt = np.diff(ticks)
    rate_hz = float(1.0 / np.median(dt)) if dt.size and np.median(dt) > 0 else None
    total_rows = sum(stats.rows.values())
    _refuse_to_shrink(final, pdir, total_rows)
    total_nans = np.sum([stats.nans[u] for u in stats.rows], axis=0)
    missing = _missing(total_nans, total_rows)
    proc_rows = 0
    for table, torn in _iter_segments(pdir, "proc", PROCESS_SCHEMA):
        proc_rows += table.num_rows
        stats.torn |= torn
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "file": final.name,
        "processes_file": processes_path_for(final).name if proc_rows else None,
        "phasescope_version": header.get("phasescope_version", __version__),
        "host": header.get("host", ""),
        "source": header.get("source", ""),
        "driver": header.get("driver") or _driver_of(devices),
        "interval_s": header.get("interval_s"),
        "rate_hz": rate_hz,
        "start": start,
        "end": end,
        "start_utc": _utc(start),
        "end_utc": _utc(end),
        "duration_s": end - start,
        "ticks": int(ticks.size),
        "rows": total_rows,
        "process_rows": proc_rows,
        "devices": [
            {
                **device_to_json(d),
                "rows": stats.rows.get(d.uuid, 0),
                "missing_fraction": _missing(
                    stats.nans.get(d.uuid, np.zeros(len(SIGNAL_NAMES))), stats.rows.get(d.uuid, 0)
                ),
            }
            for d in devices
        ],
        "missing_fraction": missing,
        "missing_signals": [s for s, f in missing.items() if f >= 1.0],
        "source_errors": header.get("source_errors", {}),
        "events": header.get("events", []),
        "recovered": unclean or stats.torn or not header,
        "torn_tail": stats.torn,
        "finalized_utc": _utc(time.time()),
    }
    _write_merged(pdir, "seg", SAMPLE_SCHEMA, final, {**manifest, "file": final.name})
    if proc_rows:
        _write_merged(
            pdir,
            "proc",
            PROCESS_SCHEMA,
            processes_path_for(final),
            {"format": PROCESSES_FORMAT_NAME, "version": FORMAT_VERSION, "recording": final.name},
        )
    _atomic_write_json(manifest_path_for(final), manifest)
    _fsync_dir(final.parent)  # the renames above reach the disk before the marker says they did
    _atomic_write_json(pdir / FINISHED_NAME, {"file": final.name, "rows": total_rows})
    _fsync_dir(pdir)
    _remove_partial(pdir)
    return manifest


def _complete_rows(final: Path) -> int | None:
    """Samples in `final` if it is a complete recording (footer, metadata and row count agree), else None."""
    try:
        meta = read_file_metadata(final)
        rows = pq.ParquetFile(final).metadata.num_rows
    except (InputError, pa.ArrowException, OSError):
        return None
    return rows if meta.get("rows") == rows else None


def _refuse_to_shrink(final: Path, pdir: Path, rows: int) -> None:
    """A complete `final` with more samples than `pdir` holds is never replaced by it."""
    if not final.exists():
        return
    have = _complete_rows(final)
    if have is not None and have > rows:
        raise InputError(
            final,
            "existing recording",
            f"at most the {rows} samples {pdir.name}/ holds (recovering would shrink a complete "
            f"recording: keep {final.name} and delete {pdir.name}/, or move {final.name} away first)",
            f"a complete recording of {have} samples",
        )


def _finish_delete(pdir: Path, final: Path) -> dict[str, Any]:
    """Complete the delete of a partial dir whose recording was finalised; the final file's manifest."""
    marker = pdir / FINISHED_NAME
    expected: object = None
    if marker.exists():
        try:
            expected = json.loads(marker.read_text()).get("rows")
        except (ValueError, UnicodeDecodeError, AttributeError):
            expected = None  # torn before its rename is impossible (atomic), but a hand edit is not
    have = _complete_rows(final)
    if have is None or (expected is not None and have != expected):
        raise InputError(
            final,
            "finalised recording",
            f"a complete recording of {expected if expected is not None else 'its'} samples "
            f"({pdir.name}/ is marked finished and may be partly deleted: it cannot rebuild it)",
            "a missing or incomplete file" if have is None else f"{have} samples",
        )
    _remove_partial(pdir)
    return read_manifest(final)


def _remove_partial(pdir: Path) -> None:
    """Delete the partial dir of a finalised recording, its finished marker last: safe to interrupt."""
    for entry in sorted(pdir.iterdir()):
        if entry.name != FINISHED_NAME:
            entry.unlink()
    (pdir / FINISHED_NAME).unlink(missing_ok=True)
    pdir.rmdir()


def _write_merged(pdir: Path, prefix: str, schema: pa.Schema, final: Path, meta: dict[str, Any]) -> None:
    tmp = final.with_name(final.name + ".tmp")
    out_schema = schema.with_metadata({META_KEY: json.dumps(meta, allow_nan=False).encode()})
    buffered: list[pa.Table] = []
    nrows = 0
    with pq.ParquetWriter(tmp, out_schema, compression="zstd") as writer:
        for table, _ in _iter_segments(pdir, prefix, schema):
            buffered.append(table)
            nrows += table.num_rows
            if nrows >= ROW_GROUP_ROWS:
                writer.write_table(
                    pa.concat_tables(buffered).replace_schema_metadata(out_schema.metadata),
                    row_group_size=ROW_GROUP_ROWS,
                )
                buffered, nrows = [], 0
        if buffered:
            writer.write_table(
                pa.concat_tables(buffered).replace_schema_metadata(out_schema.metadata),
                row_group_size=ROW_GROUP_ROWS,
            )
    _fsync(tmp)
    os.replace(tmp, final)


# -- reading the final file ----------------------------------------------------------------------


def read_file_metadata(path: Path) -> dict[str, Any]:
    """The `phasescope` schema metadata of a closed recording; InputError if it is not one."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError, UnicodeError) as exc:  # UnicodeError: a non-UTF-8 column name
        raise InputError(
            path,
            "Parquet footer",
            f"a complete Parquet file (a recording that crashed lives in {path.name}{PARTIAL_SUFFIX}/)",
            str(exc),
        ) from exc
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise InputError(
            path,
            "schema metadata 'phasescope'",
            "a phasescope recording (from phasescope record)",
            "no such key",
        )
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(path, "schema metadata 'phasescope'", "JSON", raw[:40]) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise InputError(
            path,
            "schema metadata 'phasescope'.format",
            repr(FORMAT_NAME),
            meta.get("format") if isinstance(meta, dict) else meta,
        )
    version = meta.get("version")
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise InputError(
            path, "schema metadata 'phasescope'.version", f"an integer 1..{FORMAT_VERSION}", version
        )
    return meta


def _check_columns(path: Path, schema: pa.Schema) -> list[str]:
    for name, ok, expected in (
        ("time", pa.types.is_floating, "float64"),
        (
            "device",
            lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t),
            "string",
        ),
    ):
        idx = schema.get_field_index(name)
        if idx < 0:
            raise InputError(path, f"column {name!r}", f"a {expected} column", "no such column")
        if not ok(schema.field(idx).type):
            raise InputError(path, f"column {name!r}", expected, str(schema.field(idx).type))
    signals = []
    for name in SIGNAL_NAMES:
        idx = schema.get_field_index(name)
        if idx < 0:
            continue
        typ = schema.field(idx).type
        if not (pa.types.is_floating(typ) or pa.types.is_integer(typ) or pa.types.is_null(typ)):
            raise InputError(path, f"column {name!r}", "float64", str(typ))
        signals.append(name)
    return signals


def table_to_traces(
    path: Path, table: pa.Table, devices: list[DeviceInfo], meta: dict[str, Any]
) -> list[Trace]:
    """Split a long table into one Trace per device (file order of the device list first)."""
    signals = _check_columns(path, table.schema)
    if table.num_rows == 0:
        raise InputError(path, "rows", "at least one sample", "an empty recording")
    time_col = table.column("time").cast(pa.float64())
    if time_col.null_count:
        raise InputError(path, "column 'time'", "no nulls", f"{time_col.null_count} nulls")
    times = time_col.to_numpy()
    bad = np.flatnonzero(~np.isfinite(times))
    if bad.size:
        raise InputError(
            path, f"row {int(bad[0])}, column 'time'", "a finite Unix time", float(times[bad[0]])
        )
    dev = table.column("device")
    if dev.null_count:
        raise InputError(path, "column 'device'", "a device uuid in every row", f"{dev.null_count} nulls")
    enc = dev.cast(pa.string()).combine_chunks().dictionary_encode()
    codes = enc.indices.to_numpy()
    uuids: list[str] = enc.dictionary.to_pylist()
    cols = {
        s: table.column(s).cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        for s in signals
    }
    info = {d.uuid: d for d in devices}
    order = [u for u in info if u in uuids] + [u for u in uuids if u not in info]
    by_code = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[by_code], np.arange(len(uuids) + 1))
    traces = []
    for uuid in order:
        code = uuids.index(uuid)
        rows = by_code[bounds[code] : bounds[code + 1]]
        rows = rows[np.argsort(times[rows], kind="stable")]
        d = info.get(uuid, DeviceInfo(uuid=uuid))
        tmeta = dict(meta)
        if d.index is not None:
            tmeta["gpu_index"] = d.index
        traces.append(Trace(d, times[rows], {s: c[rows] for s, c in cols.items()}, tmeta))
    return traces


def _trace_meta(path: Path, meta: dict[str, Any], partial: bool) -> dict[str, Any]:
    keep = (
        "host",
        "source",
        "driver",
        "interval_s",
        "rate_hz",
        "start",
        "end",
        "phasescope_version",
        "recovered",
    )
    out = {k: meta[k] for k in keep if k in meta}
    out.update({"source_path": str(path), "format": "phasescope", "partial": partial})
    return out


def _devices_from_meta(path: Path, meta: dict[str, Any]) -> list[DeviceInfo]:
    devices = meta.get("devices", [])
    if not isinstance(devices, list):
        raise InputError(path, "metadata 'devices'", "a list", devices)
    return [device_from_json(d, f"metadata devices[{i}]", path) for i, d in enumerate(devices)]


def read_recording(path: str | Path) -> list[Trace]:
    """Traces (one per device) from a closed recording or a `.partial` directory."""
    p = Path(path)
    if p.is_dir():
        header, samples, _, torn = partial_tables(p)
        if samples.num_rows == 0:
            raise InputError(p, "partial recording", "at least one complete sample batch", "none")
        meta = {**header, "recovered": torn}
        return table_to_traces(p, samples, _devices_from_meta(p, header), _trace_meta(p, meta, True))
    if not p.exists():
        raise InputError(p, "file", "an existing phasescope recording", "no such file")
    meta = read_file_metadata(p)
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError, UnicodeError) as exc:
        raise InputError(p, "Parquet data", "readable row groups", str(exc)) from exc
    return table_to_traces(p, table, _devices_from_meta(p, meta), _trace_meta(p, meta, False))


def read_processes(path: str | Path) -> pa.Table:
    """The process samples of a recording (closed or partial); an empty table when none were recorded."""
    p = Path(path)
    if p.is_dir():
        return partial_tables(p)[2]
    side = processes_path_for(p)
    if not side.exists():
        return PROCESS_SCHEMA.empty_table()
    return _read_parquet_with(side, PROCESS_SCHEMA, "Parquet data", "columns")


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The sidecar manifest of a closed recording (falls back to the Parquet metadata)."""
    p = Path(path)
    side = manifest_path_for(p)
    if side.exists():
        try:
            data = json.loads(side.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise InputError(side, "manifest", "JSON", str(exc)) from exc
        if isinstance(data, dict):
            return data
        raise InputError(side, "manifest", "a JSON object", type(data).__name__)
    return read_file_metadata(p)


def sniff(path: str | Path) -> bool:
    """True for a phasescope recording or a `.partial` directory; never raises."""
    try:
        p = Path(path)
        if p.is_dir():
            return p.name.endswith(PARTIAL_SUFFIX) and is_partial_dir(p)
        with open(p, "rb") as fh:
            if fh.read(4) != b"PAR1":
                return False
        read_file_metadata(p)
        return True
    except Exception:
        return False
