"""The embedded live store: recent telemetry for the dashboard, `top` history and queries.

SQLite in WAL mode (see docs/ARCHITECTURE.md for why not DuckDB). One row per device per tick,
one REAL column per schema signal, clustered on (device, time) in a WITHOUT ROWID table so a
device's time range is one contiguous B-tree scan. One writer connection (the sampler thread)
under a lock; every reading thread gets its own read-only connection, and WAL lets those read a
consistent snapshot while the writer appends. NaN is stored as NULL and read back as NaN.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, FloatArray, Trace
from phasescope.sources.base import TickBatch

DEFAULT_RETENTION_S = 7 * 86400.0
DEFAULT_PRUNE_EVERY_S = 600.0
SCHEMA_VERSION = 1
_PROC_FLOATS = ("gpu_mem_used", "sm_util", "cpu_util", "rss", "threads", "read_bytes", "write_bytes")


def default_store_path() -> Path:
    """`$PHASESCOPE_HOME/live.sqlite`, else `$XDG_DATA_HOME/phasescope/live.sqlite` (~/.local/share)."""
    home = os.environ.get("PHASESCOPE_HOME")
    if home:
        return Path(home) / "live.sqlite"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "phasescope" / "live.sqlite"


def _col(name: str) -> str:
    return '"' + name + '"'  # signal names are identifiers from schema.py, never user input


class Store:
    """Live telemetry store. Thread-safe: `ingest` from one thread, queries from any."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        retention_s: float | None = DEFAULT_RETENTION_S,
        prune_every_s: float = DEFAULT_PRUNE_EVERY_S,
    ) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.retention_s = retention_s
        self.prune_every_s = prune_every_s
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._device_ids: dict[str, int] = {}
        self._last_prune: float | None = None
        self._closed = False
        try:
            self._w = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self._w.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL: a commit survives a process crash; only an OS crash may lose the last ones.
            self._w.execute("PRAGMA synchronous=NORMAL")
            self._create()
        except sqlite3.DatabaseError as exc:
            raise InputError(self.path, "store", "a phasescope SQLite store", str(exc)) from None
        self._signals = self._signal_columns()
        for uuid, dev_id in self._w.execute("SELECT uuid, id FROM devices"):
            self._device_ids[uuid] = dev_id

    # -- schema ----------------------------------------------------------------------------------
    def _create(self) -> None:
        sig_cols = ", ".join(f"{_col(s)} REAL" for s in SIGNAL_NAMES)
        proc_cols = ", ".join(f"{_col(s)} REAL" for s in _PROC_FLOATS)
        with self._w:
            self._w.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = self._w.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise InputError(self.path, "meta.schema_version", f"<= {SCHEMA_VERSION}", row[0])
            self._w.execute(
                "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            self._w.execute(
                "CREATE TABLE IF NOT EXISTS devices (id INTEGER PRIMARY KEY, uuid TEXT NOT NULL UNIQUE, "
                "name TEXT, idx INTEGER, host TEXT, parent_uuid TEXT, extra TEXT)"
            )
            self._w.execute(
                f"CREATE TABLE IF NOT EXISTS samples (device_id INTEGER NOT NULL, time REAL NOT NULL, "
                f"{sig_cols}, PRIMARY KEY (device_id, time)) WITHOUT ROWID"
            )
            self._w.execute(
                f"CREATE TABLE IF NOT EXISTS processes (time REAL NOT NULL, device_id INTEGER, "
                f"pid INTEGER NOT NULL, name TEXT, {proc_cols}, uses_torch INTEGER)"
            )
            self._w.execute("CREATE INDEX IF NOT EXISTS processes_time ON processes (time)")
            # A store made by an older phasescope lacks signals added since: add them as NULL columns.
            have = {r[1] for r in self._w.execute("PRAGMA table_info(samples)")}
            for s in SIGNAL_NAMES:
                if s not in have:
                    self._w.execute(f"ALTER TABLE samples ADD COLUMN {_col(s)} REAL")

    def _signal_columns(self) -> list[str]:
        have = {r[1] for r in self._w.execute("PRAGMA table_info(samples)")}
        return [s for s in SIGNAL_NAMES if s in have]

    # -- writing ---------------------------------------------------------------------------------
    def _device_id(self, d: DeviceInfo) -> int:
        dev_id = self._device_ids.get(d.uuid)
        if dev_id is None:
            cur = self._w.execute(
                "INSERT INTO devices (uuid, name, idx, host, parent_uuid, extra) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(uuid) DO UPDATE SET name=excluded.name RETURNING id",
                (d.uuid, d.name, d.index, d.host, d.parent_uuid, json.dumps(dict(d.extra))),
            )
            dev_id = int(cur.fetchone()[0])
            self._device_ids[d.uuid] = dev_id
        return dev_id

    def ingest(self, batch: TickBatch) -> None:
        """Store one tick (all devices, and its processes) in one transaction."""
        self.ingest_many([batch])

    def ingest_many(self, batches: Iterable[TickBatch]) -> None:
        """Store many ticks in one transaction (bulk loads, replays)."""
        placeholders = ", ".join("?" * (2 + len(SIGNAL_NAMES)))
        sql = (
            f"INSERT OR REPLACE INTO samples (device_id, time, {', '.join(map(_col, SIGNAL_NAMES))}) "
            f"VALUES ({placeholders})"
        )
        psql = (
            f"INSERT INTO processes (time, device_id, pid, name, {', '.join(map(_col, _PROC_FLOATS))}, "
            f"uses_torch) VALUES ({', '.join('?' * (5 + len(_PROC_FLOATS)))})"
        )
        newest = None
        with self._write_lock:
            self._check_open()
            with self._w:
                for batch in batches:
                    ids = [self._device_id(d) for d in batch.devices]
                    t = float(batch.time)
                    # NaN binds as NULL in SQLite; tolist() turns the whole matrix into floats at C speed.
                    rows = [(i, t, *vals) for i, vals in zip(ids, batch.values.tolist(), strict=True)]
                    self._w.executemany(sql, rows)
                    if batch.processes:
                        self._w.executemany(
                            psql,
                            [
                                (
                                    p.time,
                                    self._device_ids.get(p.device_uuid or ""),
                                    p.pid,
                                    p.name,
                                    *(getattr(p, n) for n in _PROC_FLOATS),
                                    int(p.uses_torch),
                                )
                                for p in batch.processes
                            ],
                        )
                    newest = t if newest is None else max(newest, t)
        if newest is not None and self.retention_s is not None:
            if self._last_prune is None:
                self._last_prune = newest
            elif newest - self._last_prune >= self.prune_every_s:
                self.prune(self.retention_s, now=newest)

    def prune(self, older_than_s: float, now: float | None = None) -> int:
        """Delete samples and processes older than `now - older_than_s`; returns rows deleted.

        `now` defaults to the newest sample in the store (not the wall clock), so loading an old
        recording does not erase itself.
        """
        with self._write_lock:
            self._check_open()
            if now is None:
                row = self._w.execute("SELECT max(time) FROM samples").fetchone()
                if row is None or row[0] is None:
                    return 0
                now = float(row[0])
            cutoff = now - older_than_s
            deleted = 0
            with self._w:
                for dev_id in self._device_ids.values():  # per device: uses the (device_id, time) key
                    deleted += self._w.execute(
                        "DELETE FROM samples WHERE device_id = ? AND time < ?", (dev_id, cutoff)
                    ).rowcount
                deleted += self._w.execute("DELETE FROM processes WHERE time < ?", (cutoff,)).rowcount
            self._last_prune = now
            return deleted

    # -- reading ---------------------------------------------------------------------------------
    def _reader(self) -> sqlite3.Connection:
        self._check_open()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, timeout=30.0, check_same_thread=False
            )
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: several SELECTs see one consistent state of the store (WAL snapshot)."""
        conn = self._reader()
        if conn.in_transaction:  # nested use inside an open snapshot
            yield conn
            return
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def devices(self) -> list[DeviceInfo]:
        rows = (
            self._reader()
            .execute("SELECT uuid, name, idx, host, parent_uuid, extra FROM devices ORDER BY id")
            .fetchall()
        )
        return [
            DeviceInfo(
                uuid=u, name=n or "", index=i, host=h or "", parent_uuid=p, extra=json.loads(e) if e else {}
            )
            for u, n, i, h, p, e in rows
        ]

    def query(
        self,
        device: str | None = None,
        start: float | None = None,
        end: float | None = None,
        signals: Sequence[str] | None = None,
    ) -> list[Trace]:
        """One Trace per device (or only `device`, by uuid) with start <= time <= end, sorted by time."""
        wanted = list(self._signals if signals is None else signals)
        for s in wanted:
            if s not in self._signals:
                raise InputError(self.path, "query signals", f"signals among {', '.join(self._signals)}", s)
        with self._snapshot() as conn:
            return self._query(conn, wanted, device, start, end)

    def _query(
        self,
        conn: sqlite3.Connection,
        wanted: list[str],
        device: str | None,
        start: float | None,
        end: float | None,
    ) -> list[Trace]:
        devices = self.devices()
        if device is not None:
            devices = [d for d in devices if d.uuid == device]
        ids = {r[0]: r[1] for r in conn.execute("SELECT uuid, id FROM devices")}
        lo = -np.inf if start is None else float(start)
        hi = np.inf if end is None else float(end)
        sql = (
            f"SELECT time{''.join(', ' + _col(s) for s in wanted)} FROM samples "
            "WHERE device_id = ? AND time >= ? AND time <= ? ORDER BY time"
        )
        out = []
        for d in devices:
            rows = conn.execute(sql, (ids[d.uuid], lo, hi)).fetchall()
            if not rows:
                continue
            # None (SQL NULL) becomes NaN in a float array.
            arr = np.array(rows, dtype=np.float64).reshape(len(rows), 1 + len(wanted))
            cols = {s: np.ascontiguousarray(arr[:, j + 1]) for j, s in enumerate(wanted)}
            out.append(
                Trace(
                    d,
                    np.ascontiguousarray(arr[:, 0]),
                    cols,
                    {"source_path": str(self.path), "format": "store"},
                )
            )
        return out

    def latest(self) -> list[Trace]:
        """The newest sample of every device, as one-row Traces."""
        cols = ", ".join(_col(s) for s in self._signals)
        with self._snapshot() as conn:
            return self._latest(conn, cols)

    def _latest(self, conn: sqlite3.Connection, cols: str) -> list[Trace]:
        ids = {r[0]: r[1] for r in conn.execute("SELECT uuid, id FROM devices")}
        out = []
        for d in self.devices():
            row = conn.execute(
                f"SELECT time, {cols} FROM samples WHERE device_id = ? ORDER BY time DESC LIMIT 1",
                (ids[d.uuid],),
            ).fetchone()
            if row is None:
                continue
            arr = np.array(row, dtype=np.float64)
            out.append(
                Trace(
                    d,
                    arr[:1],
                    {s: arr[j + 1 : j + 2] for j, s in enumerate(self._signals)},
                    {"source_path": str(self.path), "format": "store"},
                )
            )
        return out

    def query_processes(
        self, device: str | None = None, start: float | None = None, end: float | None = None
    ) -> dict[str, Any]:
        """Process samples as columns: time, device (uuid or None), pid, name, float fields, uses_torch."""
        lo = -np.inf if start is None else float(start)
        hi = np.inf if end is None else float(end)
        sql = (
            f"SELECT p.time, d.uuid, p.pid, p.name, {', '.join('p.' + _col(s) for s in _PROC_FLOATS)}, "
            "p.uses_torch FROM processes p LEFT JOIN devices d ON d.id = p.device_id "
            "WHERE p.time >= ? AND p.time <= ?"
        )
        args: list[Any] = [lo, hi]
        if device is not None:
            sql += " AND d.uuid = ?"
            args.append(device)
        rows = self._reader().execute(sql + " ORDER BY p.time", args).fetchall()
        out: dict[str, Any] = {
            "time": np.array([r[0] for r in rows], dtype=np.float64),
            "device": [r[1] for r in rows],
            "pid": np.array([r[2] for r in rows], dtype=np.int64),
            "name": [r[3] or "" for r in rows],
        }
        floats: FloatArray = np.array([r[4 : 4 + len(_PROC_FLOATS)] for r in rows], dtype=np.float64)
        for j, s in enumerate(_PROC_FLOATS):
            out[s] = floats[:, j] if rows else np.empty(0)
        out["uses_torch"] = np.array([bool(r[-1]) for r in rows], dtype=bool)
        return out

    def count(self) -> int:
        row = self._reader().execute("SELECT count(*) FROM samples").fetchone()
        return int(row[0])

    # -- lifecycle -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("store is closed")

    def close(self) -> None:
        if self._closed:
            return
        with self._write_lock:
            self._closed = True
            with self._readers_lock:
                for conn in self._readers:
                    conn.close()
                self._readers.clear()
            self._w.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
