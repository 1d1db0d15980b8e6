"""The embedded live store: recent telemetry for the dashboard, `top` history and queries.

SQLite in WAL mode (see docs/design/store.md for why not DuckDB). Two tiers per device:
  - `samples`, the hot tier: one row per tick, one REAL column per schema signal, keyed on
    (device, time) in a WITHOUT ROWID table; it holds only the current minute (`block_s`).
  - `blocks`, the sealed tier: once a tick of a new minute arrives, the earlier minutes' rows move
    (in the same transaction) into one BLOB per device per minute: a little-endian float64 matrix,
    one row per sample, columns `time` + the signals named in the block (no pickle).
A long query then reads a few thousand blobs and lets numpy reshape them, instead of turning every
value into a Python float. One writer connection (the sampler thread) under a lock; every reading
thread gets its own read-only connection, and WAL lets those read a consistent snapshot while the
writer appends. NaN is stored as NULL (hot) or NaN (blocks) and read back as NaN.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, FloatArray, TickBatch, Trace

DEFAULT_RETENTION_S = 7 * 86400.0
DEFAULT_PRUNE_EVERY_S = 600.0
DEFAULT_BLOCK_S = 60.0
SCHEMA_VERSION = 2  # 2: + blocks (a version-1 store opens as is: its rows are the hot tier)
_BLOB = np.dtype("<f8")
_PROC_FLOATS = ("gpu_mem_used", "sm_util", "cpu_util", "rss", "threads", "read_bytes", "write_bytes")
log = logging.getLogger("phasescope.store.live")


def default_store_path() -> Path:
    """`$PHASESCOPE_HOME/live.sqlite`, else `$XDG_DATA_HOME/phasescope/live.sqlite` (~/.local/share)."""
    home = os.environ.get("PHASESCOPE_HOME")
    if home:
        return Path(home) / "live.sqlite"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "phasescope" / "live.sqlite"


def open_for_writing(path: str | Path, **kwargs: Any) -> Store:
    """`Store(path)` for `serve`/`record --store`, refused while another live process writes it: two
    writers would interleave one device's samples (and `_announce_writer` would hide the first)."""
    path = Path(path)
    if path.is_file():
        with Store(path, read_only=True) as reader:
            try:
                other = reader.active_writer()
            except sqlite3.Error:  # a malformed meta table: Store(path) below says what is wrong
                other = None
        if other is not None:
            raise InputError(
                path, f"process {other['pid']} on {other.get('host', '?')} is writing this store now "
                "(serve, record or top --store)",
                "no other writer: stop that process, or use a different --store path "
                "(top --store only reads a store another process writes)")
    return Store(path, **kwargs)


def _col(name: str) -> str:
    return '"' + name + '"'  # signal names are identifiers from schema.py, never user input


class Store:
    """Live telemetry store. Thread-safe: `ingest` from one thread, queries from any.

    `read_only=True` opens an existing store for queries only (another process may be writing it).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        retention_s: float | None = DEFAULT_RETENTION_S,
        prune_every_s: float = DEFAULT_PRUNE_EVERY_S,
        block_s: float = DEFAULT_BLOCK_S,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self.retention_s = retention_s
        self.prune_every_s = prune_every_s
        self.block_s = float(block_s)
        self.read_only = read_only
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._device_ids: dict[str, int] = {}
        self._hot_first: dict[int, float] = {}  # device id -> oldest time in the hot tier
        self._newest: dict[int, float] = {}  # device id -> newest time stored, read on first need
        self._last_prune: float | None = None
        self._closed = False
        self._w: sqlite3.Connection | None = None
        self._writer_tag: str | None = None
        try:
            if read_only:
                if not self.path.is_file():
                    raise InputError(self.path, "store", "an existing phasescope store", "no such file")
                conn = self._reader()
                if conn.execute("SELECT name FROM sqlite_master WHERE name='samples'").fetchone() is None:
                    raise InputError(self.path, "store", "a phasescope SQLite store", "no samples table")
                if conn.execute("SELECT name FROM sqlite_master WHERE name='meta'").fetchone() is not None:
                    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                    if row is not None and int(row[0]) > SCHEMA_VERSION:  # a newer phasescope's layout
                        raise InputError(self.path, "meta.schema_version", f"<= {SCHEMA_VERSION}", row[0])
                self._signals = self._signal_columns(conn)
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._w = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self._w.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL: a commit survives a process crash; only an OS crash may lose the last ones.
            self._w.execute("PRAGMA synchronous=NORMAL")
            self._create()
            self._announce_writer()
            self._signals = self._signal_columns(self._w)
            for uuid, dev_id in self._w.execute("SELECT uuid, id FROM devices"):
                self._device_ids[uuid] = dev_id
            for dev_id, first in self._w.execute(
                "SELECT device_id, min(time) FROM samples GROUP BY device_id"
            ):
                self._hot_first[dev_id] = float(first)
        except sqlite3.DatabaseError as exc:
            self.close()
            raise InputError(self.path, "store", "a phasescope SQLite store", str(exc)) from None

    # -- schema ----------------------------------------------------------------------------------
    def _create(self) -> None:
        w = self._writer()
        sig_cols = ", ".join(f"{_col(s)} REAL" for s in SIGNAL_NAMES)
        proc_cols = ", ".join(f"{_col(s)} REAL" for s in _PROC_FLOATS)
        with w:
            w.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = w.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise InputError(self.path, "meta.schema_version", f"<= {SCHEMA_VERSION}", row[0])
            w.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            w.execute(
                "CREATE TABLE IF NOT EXISTS devices (id INTEGER PRIMARY KEY, uuid TEXT NOT NULL UNIQUE, "
                "name TEXT, idx INTEGER, host TEXT, parent_uuid TEXT, extra TEXT)"
            )
            w.execute(
                f"CREATE TABLE IF NOT EXISTS samples (device_id INTEGER NOT NULL, time REAL NOT NULL, "
                f"{sig_cols}, PRIMARY KEY (device_id, time)) WITHOUT ROWID"
            )
            # id = write order: where blocks overlap (a re-ingested minute) the later one wins.
            w.execute(
                "CREATE TABLE IF NOT EXISTS blocks (id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL, "
                "t0 REAL NOT NULL, t1 REAL NOT NULL, n INTEGER NOT NULL, signals TEXT NOT NULL, "
                "data BLOB NOT NULL)"
            )
            w.execute("CREATE INDEX IF NOT EXISTS blocks_device_t1 ON blocks (device_id, t1)")
            w.execute(
                f"CREATE TABLE IF NOT EXISTS processes (time REAL NOT NULL, device_id INTEGER, "
                f"pid INTEGER NOT NULL, name TEXT, {proc_cols}, uses_torch INTEGER)"
            )
            w.execute("CREATE INDEX IF NOT EXISTS processes_time ON processes (time)")
            # A store made by an older phasescope lacks signals added since: add them as NULL columns.
            have = {r[1] for r in w.execute("PRAGMA table_info(samples)")}
            for s in SIGNAL_NAMES:
                if s not in have:
                    w.execute(f"ALTER TABLE samples ADD COLUMN {_col(s)} REAL")

    def _announce_writer(self) -> None:
        """Say in `meta` which process writes the store, so another (e.g. `top --store` while `serve
        --store` runs) can see it and only read: two writers would interleave one device's samples."""
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        self._writer_tag = json.dumps(me)
        with self._writer() as w:
            w.execute("INSERT OR REPLACE INTO meta VALUES ('writer', ?)", (self._writer_tag,))

    def active_writer(self) -> dict[str, Any] | None:
        """The process that has the store open for writing now ({pid, host, since}), or None.

        A writer that died without closing (kill -9) leaves its entry: it counts only while a process with
        its pid runs on this host (an entry from another host cannot be checked and counts as none).
        """
        conn = self._w if self._w is not None else self._reader()
        if conn.execute("SELECT name FROM sqlite_master WHERE name='meta'").fetchone() is None:
            return None
        row = conn.execute("SELECT value FROM meta WHERE key='writer'").fetchone()
        if row is None or row[0] == self._writer_tag:
            return None
        try:
            who = json.loads(row[0])
            pid = int(who["pid"])
        except (ValueError, TypeError, KeyError):
            return None
        if who.get("host") != socket.gethostname():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # alive, another user's
            pass
        return dict(who)

    @staticmethod
    def _signal_columns(conn: sqlite3.Connection) -> list[str]:
        have = {r[1] for r in conn.execute("PRAGMA table_info(samples)")}
        return [s for s in SIGNAL_NAMES if s in have]

    def _writer(self) -> sqlite3.Connection:
        self._check_open()
        if self._w is None:
            raise InputError(self.path, "store", "a store opened for writing", "opened read-only")
        return self._w

    # -- writing ---------------------------------------------------------------------------------
    def _device_id(self, d: DeviceInfo) -> int:
        dev_id = self._device_ids.get(d.uuid)
        if dev_id is None:
            cur = self._writer().execute(
                "INSERT INTO devices (uuid, name, idx, host, parent_uuid, extra) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(uuid) DO UPDATE SET name=excluded.name RETURNING id",
                (d.uuid, d.name, d.index, d.host, d.parent_uuid, json.dumps(dict(d.extra))),
            )
            dev_id = int(cur.fetchone()[0])
            self._device_ids[d.uuid] = dev_id
        return dev_id

    def ingest(self, batch: TickBatch) -> None:
        """Store one live tick (all devices, and its processes) in one transaction.

        A tick older than a device's newest sample is a clock step (an NTP step, a clock set back): see
        `_clock_step`. A tick at the same time as the newest replaces it, as a re-ingest does."""
        with self._write_lock:
            for d in batch.devices:
                dev_id = self._device_id(d)
                newest = self._newest_time(dev_id)
                if newest is not None and batch.time < newest:
                    self._clock_step(d, dev_id, newest, batch.time)
        self.ingest_many([batch])

    def _newest_time(self, dev_id: int) -> float | None:
        if dev_id not in self._newest:
            w = self._writer()
            hot = w.execute("SELECT max(time) FROM samples WHERE device_id = ?", (dev_id,)).fetchone()[0]
            sealed = w.execute("SELECT max(t1) FROM blocks WHERE device_id = ?", (dev_id,)).fetchone()[0]
            known = [float(x) for x in (hot, sealed) if x is not None]
            if not known:
                return None
            self._newest[dev_id] = max(known)
        return self._newest[dev_id]

    def _clock_step(self, d: DeviceInfo, dev_id: int, newest: float, now: float) -> None:
        """The device's clock went back: sorting the new samples into the earlier ones would mix two
        clocks in one timeline (and replace samples at equal times). As the file readers split a trace,
        the samples so far keep their order under `<uuid>/clock<k>` (k = 1 for the first clock), one
        renamed row in `devices`; the uuid itself goes on with the new clock, which is the one live."""
        w = self._writer()
        taken = {u for (u,) in w.execute("SELECT uuid FROM devices")}
        k = 1
        while f"{d.uuid}/clock{k}" in taken:
            k += 1
        with w:
            w.execute("UPDATE devices SET uuid = ? WHERE id = ?", (f"{d.uuid}/clock{k}", dev_id))
        del self._device_ids[d.uuid]
        self._newest.pop(dev_id, None)
        log.warning(
            "phasescope: warning: %s: device %s: time went back %.3f s (a clock step, from %.3f to %.3f): "
            "the samples before it are kept in order as device %s/clock%d, never re-sorted",
            self.path, d.uuid, newest - now, newest, now, d.uuid, k,
        )

    def ingest_many(self, batches: Iterable[TickBatch]) -> None:
        """Store many ticks in one transaction (bulk loads, replays)."""
        psql = (
            f"INSERT INTO processes (time, device_id, pid, name, {', '.join(map(_col, _PROC_FLOATS))}, "
            f"uses_torch) VALUES ({', '.join('?' * (5 + len(_PROC_FLOATS)))})"
        )
        with self._write_lock:
            w = self._writer()
            with w:
                ids: list[np.ndarray] = []
                times: list[np.ndarray] = []
                values: list[FloatArray] = []
                for batch in batches:
                    n = len(batch.devices)
                    ids.append(np.array([self._device_id(d) for d in batch.devices], dtype=np.int64))
                    times.append(np.full(n, float(batch.time)))
                    values.append(np.asarray(batch.values, dtype=np.float64).reshape(n, len(SIGNAL_NAMES)))
                    if batch.processes:
                        w.executemany(
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
                if not ids:
                    return
                dev = np.concatenate(ids)
                t = np.concatenate(times)
                v = np.concatenate(values)
                hot: list[tuple[float, ...]] = []
                for dev_id in np.unique(dev).tolist():
                    sel = dev == dev_id
                    hot.extend(self._write_device(w, int(dev_id), t[sel], v[sel]))
                    if dev_id in self._newest:
                        self._newest[dev_id] = max(self._newest[dev_id], float(t[sel].max()))
                if hot:
                    placeholders = ", ".join("?" * (2 + len(SIGNAL_NAMES)))
                    w.executemany(
                        f"INSERT OR REPLACE INTO samples (device_id, time, "
                        f"{', '.join(map(_col, SIGNAL_NAMES))}) VALUES ({placeholders})",
                        hot,
                    )
                newest = float(t.max()) if t.size else None
        if newest is not None and self.retention_s is not None:
            # On the ingested clock (an old recording loaded does not erase itself), never ahead of the wall
            # clock: one tick stamped days ahead (a clock set wrong, then stepped back) erased everything.
            newest = min(newest, time.time())
            if self._last_prune is None:
                self._last_prune = newest
            elif newest - self._last_prune >= self.prune_every_s:
                self.prune(self.retention_s, now=newest)

    def _write_device(
        self, w: sqlite3.Connection, dev_id: int, t: FloatArray, v: FloatArray
    ) -> list[tuple[float, ...]]:
        """New rows of one device: minutes before its newest are sealed into blocks; returns the hot rows."""
        current = np.floor(t.max() / self.block_s)
        bucket = np.floor(t / self.block_s)
        done = bucket < current
        hot_first = self._hot_first.get(dev_id)
        if hot_first is not None and np.floor(hot_first / self.block_s) < current:
            # The hot tier holds rows of a finished minute: take them out and seal them with the new.
            cutoff = current * self.block_s
            cols = ", ".join(_col(s) for s in SIGNAL_NAMES)
            rows = w.execute(
                f"SELECT time, {cols} FROM samples WHERE device_id = ? AND time < ? ORDER BY time",
                (dev_id, cutoff),
            ).fetchall()
            w.execute("DELETE FROM samples WHERE device_id = ? AND time < ?", (dev_id, cutoff))
            old = np.array(rows, dtype=np.float64).reshape(len(rows), 1 + len(SIGNAL_NAMES))
            left = w.execute("SELECT min(time) FROM samples WHERE device_id = ?", (dev_id,)).fetchone()[0]
            if left is None:
                self._hot_first.pop(dev_id, None)
            else:
                self._hot_first[dev_id] = float(left)
            # Old rows first, so a re-ingested sample (same time) keeps the newer values.
            self._seal(w, dev_id, np.concatenate([old[:, 0], t[done]]), np.vstack([old[:, 1:], v[done]]))
        elif done.any():
            self._seal(w, dev_id, t[done], v[done])
        if not (~done).any():
            return []
        hot_t, hot_v = t[~done], v[~done]
        first = float(hot_t.min())
        prev = self._hot_first.get(dev_id)
        self._hot_first[dev_id] = first if prev is None else min(prev, first)
        # NaN binds as NULL in SQLite; tolist() turns the whole matrix into floats at C speed.
        return [(dev_id, tt, *row) for tt, row in zip(hot_t.tolist(), hot_v.tolist(), strict=True)]

    def _seal(self, w: sqlite3.Connection, dev_id: int, t: FloatArray, v: FloatArray) -> None:
        """Write rows as one block per minute (`block_s`): float64 [time, signals...] per row."""
        if t.size == 0:
            return
        keep = _last_of_each_time(t)
        if keep is not None:
            t, v = t[keep], v[keep]
        bucket = np.floor(t / self.block_s)
        edges = np.flatnonzero(np.diff(bucket)) + 1
        names = ",".join(SIGNAL_NAMES)
        rows = []
        for lo, hi in zip(np.r_[0, edges].tolist(), np.r_[edges, t.size].tolist(), strict=True):
            mat = np.column_stack([t[lo:hi], v[lo:hi]]).astype(_BLOB, copy=False)
            rows.append((dev_id, float(t[lo]), float(t[hi - 1]), hi - lo, names, mat.tobytes()))
        w.executemany(
            "INSERT INTO blocks (device_id, t0, t1, n, signals, data) VALUES (?, ?, ?, ?, ?, ?)", rows
        )

    def prune(self, older_than_s: float, now: float | None = None) -> int:
        """Delete samples and processes older than `now - older_than_s`; returns samples deleted.

        `now` defaults to the newest sample in the store (not the wall clock), so loading an old
        recording does not erase itself. A block that straddles the cutoff is rewritten without its
        older rows, so retention is exact to the sample.
        """
        with self._write_lock:
            w = self._writer()
            if now is None:
                hot = w.execute("SELECT max(time) FROM samples").fetchone()[0]
                sealed = w.execute("SELECT max(t1) FROM blocks").fetchone()[0]
                known = [float(x) for x in (hot, sealed) if x is not None]
                if not known:
                    return 0
                now = max(known)
            cutoff = now - older_than_s
            deleted = 0
            with w:
                # per device (a clock step's earlier part too): uses the (device_id, time) key
                for (dev_id,) in w.execute("SELECT id FROM devices").fetchall():
                    deleted += w.execute(
                        "DELETE FROM samples WHERE device_id = ? AND time < ?", (dev_id, cutoff)
                    ).rowcount
                    row = w.execute(
                        "SELECT coalesce(sum(n), 0) FROM blocks WHERE device_id = ? AND t1 < ?",
                        (dev_id, cutoff),
                    ).fetchone()
                    deleted += int(row[0])
                    w.execute("DELETE FROM blocks WHERE device_id = ? AND t1 < ?", (dev_id, cutoff))
                    deleted += self._trim_blocks(w, dev_id, cutoff)
                    left = w.execute(
                        "SELECT min(time) FROM samples WHERE device_id = ?", (dev_id,)
                    ).fetchone()
                    if left[0] is None:
                        self._hot_first.pop(dev_id, None)
                    else:
                        self._hot_first[dev_id] = float(left[0])
                w.execute("DELETE FROM processes WHERE time < ?", (cutoff,))
            self._last_prune = now
            return deleted

    def _trim_blocks(self, w: sqlite3.Connection, dev_id: int, cutoff: float) -> int:
        deleted = 0
        straddling = w.execute(
            "SELECT id, n, signals, data FROM blocks WHERE device_id = ? AND t0 < ? AND t1 >= ?",
            (dev_id, cutoff, cutoff),
        ).fetchall()
        for block_id, n, names, data in straddling:
            mat = _decode(data, n, 1 + len(names.split(",")))
            keep = mat[mat[:, 0] >= cutoff]
            deleted += n - keep.shape[0]
            w.execute(
                "UPDATE blocks SET t0 = ?, n = ?, data = ? WHERE id = ?",
                (float(keep[0, 0]), keep.shape[0], keep.astype(_BLOB, copy=False).tobytes(), block_id),
            )
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
            try:
                return self._query(conn, wanted, device, start, end)
            except _BadBlock as exc:
                raise InputError(self.path, "blocks", str(exc), "a damaged block") from None

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
        hot_sql = (
            f"SELECT time{''.join(', ' + _col(s) for s in wanted)} FROM samples "
            "WHERE device_id = ? AND time >= ? AND time <= ? ORDER BY time"
        )
        # In index order (an SQL sort would copy every blob); write order is restored in Python.
        block_sql = "SELECT id, n, signals, data FROM blocks WHERE device_id = ? AND t1 >= ? AND t0 <= ?"
        sealed = _has_blocks(conn)
        out = []
        for d in devices:
            blocks = sorted(conn.execute(block_sql, (ids[d.uuid], lo, hi)).fetchall()) if sealed else []
            rows = conn.execute(hot_sql, (ids[d.uuid], lo, hi)).fetchall()
            # One (1 + signals) x n matrix, written once: each signal ends up a contiguous row.
            mat = np.empty((1 + len(wanted), sum(b[1] for b in blocks) + len(rows)))
            pos = _fill_from_blocks(mat, [b[1:] for b in blocks], wanted)
            if rows:  # None (SQL NULL) becomes NaN in a float array
                mat[:, pos:] = np.array(rows, dtype=np.float64).reshape(len(rows), 1 + len(wanted)).T
            inside = (mat[0] >= lo) & (mat[0] <= hi)  # blocks overlapping the range hold a few outside
            if not inside.all():
                mat = mat[:, inside]
            keep = _last_of_each_time(mat[0])
            if keep is not None:
                mat = mat[:, keep]
            if mat.shape[1] == 0:
                continue
            cols = {s: mat[j + 1] for j, s in enumerate(wanted)}
            out.append(Trace(d, mat[0], cols, {"source_path": str(self.path), "format": "store"}))
        return out

    def latest(self) -> list[Trace]:
        """The newest sample of every device, as one-row Traces."""
        cols = ", ".join(_col(s) for s in self._signals)
        with self._snapshot() as conn:
            try:
                return self._latest(conn, cols)
            except _BadBlock as exc:
                raise InputError(self.path, "blocks", str(exc), "a damaged block") from None

    def _latest(self, conn: sqlite3.Connection, cols: str) -> list[Trace]:
        ids = {r[0]: r[1] for r in conn.execute("SELECT uuid, id FROM devices")}
        sealed = _has_blocks(conn)
        out = []
        for d in self.devices():
            row = conn.execute(
                f"SELECT time, {cols} FROM samples WHERE device_id = ? ORDER BY time DESC LIMIT 1",
                (ids[d.uuid],),
            ).fetchone()
            block = conn.execute(
                "SELECT n, signals, data FROM blocks WHERE device_id = ? ORDER BY t1 DESC, id DESC LIMIT 1",
                (ids[d.uuid],),
            ).fetchall() if sealed else []
            arr = np.array(row, dtype=np.float64) if row is not None else None
            if block:
                mat = np.empty((1 + len(self._signals), block[0][0]))
                _fill_from_blocks(mat, block, self._signals)
                last = mat[:, int(np.argmax(mat[0]))]
                if arr is None or last[0] > arr[0]:
                    arr = last
            if arr is None:
                continue
            out.append(
                Trace(
                    d,
                    arr[:1].copy(),
                    {s: arr[j + 1 : j + 2].copy() for j, s in enumerate(self._signals)},
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
        """Samples held (hot rows plus sealed block rows)."""
        with self._snapshot() as conn:
            hot = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
            sealed = 0
            if _has_blocks(conn):
                sealed = conn.execute("SELECT coalesce(sum(n), 0) FROM blocks").fetchone()[0]
        return int(hot) + int(sealed)

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
            if self._w is not None:
                if self._writer_tag is not None:
                    try:
                        with self._w:
                            self._w.execute("DELETE FROM meta WHERE key='writer' AND value=?",
                                            (self._writer_tag,))
                    except sqlite3.Error:  # closing must not fail; a stale entry is checked by pid
                        pass
                self._w.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _BadBlock(ValueError):
    pass


def _has_blocks(conn: sqlite3.Connection) -> bool:
    """A version-1 store (an older phasescope's, opened read-only: only a writer adds the table) has none."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name='blocks'").fetchone() is not None


def _decode(data: bytes, n: int, width: int) -> FloatArray:
    """A block's matrix: n rows of `width` values [time, *signals] (float64, little-endian)."""
    if not isinstance(data, bytes) or len(data) != n * width * _BLOB.itemsize:
        raise _BadBlock(f"{n} rows x {width} float64 values")
    return np.frombuffer(data, dtype=_BLOB).reshape(n, width)


def _fill_from_blocks(
    out: FloatArray, blocks: Sequence[tuple[int, str, bytes]], wanted: Sequence[str]
) -> int:
    """Copy blocks (n, signals, data), in write order, into the columns of `out` ([time, *wanted] rows).

    Returns the number of columns filled. Each block costs one transposing copy; signals a block
    lacks (written by an older phasescope) read NaN.
    """
    pos = 0
    plans: dict[str, tuple[bool, int, list[int], list[int], list[int]]] = {}
    for n, names, data in blocks:
        plan = plans.get(names)
        if plan is None:
            layout = names.split(",")
            dst = [0] + [j + 1 for j, s in enumerate(wanted) if s in layout]
            src = [0] + [layout.index(s) + 1 for s in wanted if s in layout]
            absent = [j + 1 for j, s in enumerate(wanted) if s not in layout]
            plan = plans[names] = (layout == list(wanted), 1 + len(layout), dst, src, absent)
        same, width, dst, src, absent = plan
        mat = _decode(data, n, width)
        if same:
            out[:, pos : pos + n] = mat.T
        else:
            out[dst, pos : pos + n] = mat[:, src].T
            out[absent, pos : pos + n] = np.nan
        pos += n
    return pos


def _last_of_each_time(t: FloatArray) -> np.ndarray | None:
    """Order that sorts rows by time, keeping the last given of equal times; None if already sorted."""
    if t.size < 2 or bool(np.all(t[1:] > t[:-1])):
        return None
    order = np.argsort(t, kind="stable")
    ranked = t[order]
    return order[np.r_[ranked[1:] != ranked[:-1], True]]
