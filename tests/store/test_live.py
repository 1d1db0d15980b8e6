"""The live store: ingest of real ticks, queries, retention, readers during writes."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from phasescope.errors import InputError
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, ProcessSample, TickBatch, Trace
from phasescope.sources.replay import read
from phasescope.store.live import Store

RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
T0 = 1_780_000_000.0


@pytest.fixture(scope="module")
def real(shared_data: Path) -> list[Trace]:
    return read(shared_data / RUN)


def _ticks(traces: list[Trace], n: int | None = None, t0: float = T0) -> list[TickBatch]:
    """The real samples as ticks: tick i holds every device's i-th sample, stamped t0 + i."""
    n = min(len(t) for t in traces) if n is None else n
    devices = [t.device for t in traces]
    return [
        TickBatch(t0 + i, devices, np.array([[t[s][i] for s in SIGNAL_NAMES] for t in traces]))
        for i in range(n)
    ]


def test_ingest_and_query_round_trip_real_values(tmp_path: Path, real: list[Trace]) -> None:
    store = Store(tmp_path / "s.sqlite")
    ticks = _ticks(real)
    store.ingest_many(ticks[:100])
    for batch in ticks[100:]:
        store.ingest(batch)
    n = len(ticks)
    assert [d.uuid for d in store.devices()] == [t.device.uuid for t in real]
    got = store.query()
    assert [len(t) for t in got] == [n] * len(real)
    for orig, back in zip(real, got, strict=True):
        np.testing.assert_array_equal(back.time, T0 + np.arange(n))
        for s in SIGNAL_NAMES:  # NaN (absent signals) comes back as NaN
            np.testing.assert_array_equal(back[s], orig[s][:n], err_msg=s)
    one = store.query(device=real[1].device.uuid, start=T0 + 10, end=T0 + 19, signals=["power", "gpu_util"])
    assert len(one) == 1 and one[0].device.uuid == real[1].device.uuid
    np.testing.assert_array_equal(one[0].time, T0 + np.arange(10, 20))
    np.testing.assert_array_equal(one[0]["power"], real[1]["power"][10:20])
    assert sorted(one[0].columns) == ["gpu_util", "power"]
    latest = store.latest()
    assert [float(t.time[0]) for t in latest] == [T0 + n - 1] * len(real)
    assert latest[0]["mem_used"][0] == real[0]["mem_used"][n - 1]
    with pytest.raises(InputError, match="query signals"):
        store.query(signals=["bogus"])
    store.close()
    # Data survives a reopen.
    with Store(tmp_path / "s.sqlite") as again:
        assert again.count() == n * len(real)


def test_processes_round_trip(tmp_path: Path, real: list[Trace]) -> None:
    batch = _ticks(real, 1)[0]
    uuid = real[0].device.uuid
    batch.processes = [
        ProcessSample(batch.time, 99, uuid, "python", gpu_mem_used=5e8, cpu_util=0.5, uses_torch=True),
        ProcessSample(batch.time, 7, None, "bash", rss=1e6),
    ]
    with Store(tmp_path / "p.sqlite") as store:
        store.ingest(batch)
        procs = store.query_processes()
        assert procs["pid"].tolist() == [99, 7]
        assert procs["device"] == [uuid, None]
        assert procs["gpu_mem_used"][0] == 5e8 and np.isnan(procs["gpu_mem_used"][1])
        assert procs["uses_torch"].tolist() == [True, False]
        assert store.query_processes(device=uuid)["pid"].tolist() == [99]


def test_prune_and_automatic_retention(tmp_path: Path, real: list[Trace]) -> None:
    ticks = _ticks(real, 200)
    with Store(tmp_path / "r.sqlite", retention_s=None) as store:
        store.ingest_many(ticks)
        deleted = store.prune(50.0)  # relative to the newest sample, T0 + 199
        assert deleted == 149 * len(real)
        assert store.query()[0].time[0] == T0 + 149
    # Automatic: keep 30 s, prune every 20 s of ingested time.
    with Store(tmp_path / "a.sqlite", retention_s=30.0, prune_every_s=20.0) as store:
        for batch in ticks:
            store.ingest(batch)
        first = store.query()[0].time[0]
        assert T0 + 199 - 30 - 20 <= first <= T0 + 199 - 30
    with Store(tmp_path / "k.sqlite", retention_s=None) as store:  # retention off keeps everything
        for batch in ticks:
            store.ingest(batch)
        assert store.count() == 200 * len(real)


def test_readers_see_consistent_snapshots_while_the_writer_ingests(tmp_path: Path, real: list[Trace]) -> None:
    ticks = _ticks(real)
    store = Store(tmp_path / "c.sqlite")
    store.ingest(ticks[0])
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[list[int]] = []

    def reader() -> None:
        mine: list[int] = []
        seen.append(mine)
        try:
            while not done.is_set():
                traces = store.query()
                lens = [len(t) for t in traces]
                # a tick is one transaction: every device has the same number of rows in a snapshot
                assert len(set(lens)) == 1, lens
                assert all(np.all(np.diff(t.time) > 0) for t in traces)
                mine.append(lens[0])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for batch in ticks[1:]:
        store.ingest(batch)
    done.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[0]
    for mine in seen:  # each reader saw the store only grow, and saw it while it grew
        assert mine and mine == sorted(mine)
    assert any(len(set(mine)) > 1 for mine in seen)
    assert store.query()[0].time.size == len(ticks)
    store.close()


def test_device_identity_and_unknown_devices(tmp_path: Path) -> None:
    devs = [
        DeviceInfo("GPU-x", "H100", 3, "node1", extra={"driver_version": "550"}),
        DeviceInfo("MIG-y", "H100 MIG 1g.10gb", 0, "node1", parent_uuid="GPU-x"),
    ]
    with Store(tmp_path / "d.sqlite") as store:
        store.ingest(TickBatch.empty(T0, devs))
        got = store.devices()
        assert got == devs
        assert store.query(device="GPU-absent") == []


def test_a_file_that_is_not_a_store_is_an_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(InputError, match=r"bad\.sqlite: store: expected a phasescope SQLite store"):
        Store(bad)


def test_one_tick_stamped_in_the_future_does_not_erase_the_history(tmp_path: Path, real: list[Trace]) -> None:
    """Retention runs on the newest ingested time: a clock set 30 days ahead for one tick (then stepped back
    by NTP) pruned the whole week of history, and then no more pruning happened for 30 days."""
    import time

    now = time.time()
    ticks = _ticks(real, 120, t0=now - 120)  # the last two minutes
    future = TickBatch(now + 30 * 86400, ticks[0].devices, ticks[0].values)
    with Store(tmp_path / "f.sqlite", retention_s=7 * 86400, prune_every_s=60) as store:
        store.ingest_many(ticks[:60])
        store.ingest(future)
        for t in ticks[60:]:
            store.ingest(t)  # each one can trigger the automatic prune
        kept = {tr.device.uuid: len(tr) for tr in store.query(end=now + 60)}
    # The step back from the future tick splits the clocks (the earlier one under <uuid>/clock1): all kept.
    assert kept == {u: 60 for t in real for u in (t.device.uuid, f"{t.device.uuid}/clock1")}


def _tier_counts(path: Path) -> tuple[int, int]:
    import sqlite3

    with sqlite3.connect(path) as conn:
        hot = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
        blocks = conn.execute("SELECT count(*) FROM blocks").fetchone()[0]
    return int(hot), int(blocks)


def test_finished_minutes_are_sealed_into_blocks_and_read_back_exactly(
    tmp_path: Path, real: list[Trace]
) -> None:
    t0 = 60.0 * 29_000_000  # minute-aligned, so the minutes are easy to count
    ticks = _ticks(real, 185, t0=t0)  # 3 full minutes + 5 s of a fourth
    with Store(tmp_path / "b.sqlite", retention_s=None) as store:
        for batch in ticks:  # live: one transaction per tick
            store.ingest(batch)
        hot, blocks = _tier_counts(store.path)
        assert hot == 5 * len(real) and blocks == 3 * len(real)  # one block per device per minute
        got = store.query()
        for orig, back in zip(real, got, strict=True):
            np.testing.assert_array_equal(back.time, t0 + np.arange(185))
            for s in SIGNAL_NAMES:
                np.testing.assert_array_equal(back[s], orig[s][:185], err_msg=s)
        # A range that cuts blocks, and the latest sample (in the hot tier).
        part = store.query(device=real[0].device.uuid, start=t0 + 59.5, end=t0 + 121, signals=["power"])
        np.testing.assert_array_equal(part[0].time, t0 + np.arange(60, 122))
        np.testing.assert_array_equal(part[0]["power"], real[0]["power"][60:122])
        assert float(store.latest()[0].time[0]) == t0 + 184
        assert store.count() == 185 * len(real)
    # Bulk ingest seals the same way as live ingest.
    with Store(tmp_path / "bulk.sqlite", retention_s=None) as store:
        store.ingest_many(ticks)
        assert _tier_counts(store.path) == (5 * len(real), 3 * len(real))
        np.testing.assert_array_equal(store.query()[1]["gpu_util"], real[1]["gpu_util"][:185])


def test_reingested_samples_replace_sealed_ones(tmp_path: Path, real: list[Trace]) -> None:
    ticks = _ticks(real, 150)
    again = _ticks(real[::-1], 30)  # the same times with the devices' values swapped
    again = [TickBatch(b.time, ticks[0].devices, b.values) for b in again]
    with Store(tmp_path / "re.sqlite", retention_s=None) as store:
        store.ingest_many(ticks)
        store.ingest_many(again)  # minutes already sealed: later values win, no duplicate rows
        got = store.query()
        np.testing.assert_array_equal(got[0].time, T0 + np.arange(150))
        np.testing.assert_array_equal(got[0]["power"][:30], real[-1]["power"][:30])
        np.testing.assert_array_equal(got[0]["power"][30:], real[0]["power"][30:150])


def test_read_only_store_reads_while_another_writes(tmp_path: Path, real: list[Trace]) -> None:
    path = tmp_path / "ro.sqlite"
    with pytest.raises(InputError, match=r"ro\.sqlite: store: expected an existing phasescope store"):
        Store(path, read_only=True)
    ticks = _ticks(real, 130)
    writer = Store(path)
    writer.ingest_many(ticks[:100])
    reader = Store(path, read_only=True)
    assert len(reader.query()[0]) == 100
    writer.ingest_many(ticks[100:])
    assert len(reader.query()[0]) == 130  # a fresh snapshot per query
    with pytest.raises(InputError, match="opened read-only"):
        reader.ingest(ticks[0])
    reader.close()
    writer.close()


def test_version_1_store_opens_and_its_rows_get_sealed(tmp_path: Path, real: list[Trace]) -> None:
    import sqlite3

    path = tmp_path / "v1.sqlite"
    ticks = _ticks(real, 150)
    with Store(path, retention_s=None) as store:
        store.ingest_many(ticks[:1])
    with sqlite3.connect(path) as conn:  # make it what phasescope 1 wrote: rows only, no blocks
        conn.execute("DROP TABLE blocks")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        cols = ", ".join(f'"{s}"' for s in SIGNAL_NAMES)
        marks = ", ".join("?" * (2 + len(SIGNAL_NAMES)))
        conn.executemany(
            f"INSERT OR REPLACE INTO samples (device_id, time, {cols}) VALUES ({marks})",
            [(i + 1, b.time, *b.values[i].tolist()) for b in ticks[:149] for i in range(len(real))],
        )
    with Store(path, retention_s=None) as store:
        assert len(store.query()[0]) == 149
        store.ingest(ticks[149])
        hot, blocks = _tier_counts(path)
        assert blocks > 0 and hot < 60 * len(real)
        np.testing.assert_array_equal(store.query()[0]["power"], real[0]["power"][:150])


def test_a_version_1_store_reads_read_only(tmp_path: Path, real: list[Trace]) -> None:
    """An older phasescope's store has no `blocks` table; opened read-only (`verify --since`, `top --store`
    while that older agent still writes it) every query failed with "no such table: blocks"."""
    import sqlite3

    path = tmp_path / "v1.sqlite"
    ticks = _ticks(real, 30, t0=T0 - T0 % 60)  # within one minute: all in the hot tier, as version 1 kept it
    with Store(path, retention_s=None) as store:
        store.ingest_many(ticks)
    with sqlite3.connect(path) as conn:  # what phasescope 1 wrote: rows only, no blocks
        conn.execute("DROP TABLE blocks")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with Store(path, read_only=True) as store:
        got = store.query()
        assert [len(t) for t in got] == [30] * len(real) and store.count() == 30 * len(real)
        np.testing.assert_array_equal(got[0]["power"], real[0]["power"][:30])
        assert [t.time[0] for t in store.latest()] == [ticks[-1].time] * len(real)


def test_a_damaged_block_is_an_input_error(tmp_path: Path, real: list[Trace]) -> None:
    import sqlite3

    path = tmp_path / "dmg.sqlite"
    with Store(path, retention_s=None) as store:
        store.ingest_many(_ticks(real, 130))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE blocks SET data = substr(data, 1, 100) WHERE id = 1")
    with (
        Store(path, read_only=True) as store,
        pytest.raises(InputError, match=r"dmg\.sqlite: blocks: expected"),
    ):
        store.query()


def test_a_store_from_a_newer_phasescope_is_an_input_error_read_only_too(
    tmp_path: Path, real: list[Trace]
) -> None:
    import sqlite3

    path = tmp_path / "newer.sqlite"
    with Store(path, retention_s=None) as store:
        store.ingest_many(_ticks(real, 5))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for read_only in (True, False):
        with pytest.raises(InputError, match=r"newer\.sqlite: meta\.schema_version: expected <= 2, got '99'"):
            Store(path, read_only=read_only)


def test_the_writer_announces_itself_until_it_closes(tmp_path: Path, real: list[Trace]) -> None:
    import os

    path = tmp_path / "w.sqlite"
    with Store(path, retention_s=None) as writer:
        writer.ingest_many(_ticks(real, 3))
        assert writer.active_writer() is None  # itself is not "another" writer
        with Store(path, read_only=True) as reader:
            who = reader.active_writer()
            assert who is not None and who["pid"] == os.getpid()
    with Store(path, read_only=True) as reader:
        assert reader.active_writer() is None
        assert reader.count() == 3 * len(real)


def test_a_block_without_a_signal_reads_it_as_nan() -> None:
    """Blocks an older phasescope sealed lack newer signals: those read NaN, never 0."""
    from phasescope.store.live import _fill_from_blocks

    data = np.array([[1.0, 0.5], [2.0, 0.6]], dtype="<f8").tobytes()  # rows of (time, gpu_util)
    out = np.empty((3, 2))
    assert _fill_from_blocks(out, [(2, "gpu_util", data)], ("gpu_util", "power")) == 2
    assert out[0].tolist() == [1.0, 2.0] and out[1].tolist() == [0.5, 0.6]
    assert np.isnan(out[2]).all()


def test_a_clock_stepped_back_keeps_both_clocks_in_order_and_says_so(
    tmp_path: Path, real: list[Trace], caplog: pytest.LogCaptureFixture
) -> None:
    """An NTP step back of 5 s after 70 live ticks (past a sealed minute): the new ticks are neither sorted
    into the earlier ones nor written over the five at equal times; the earlier clock keeps its order under
    <uuid>/clock1, the uuid goes on with the new clock, and one line per device says where."""
    before = _ticks(real, 70)
    after = _ticks(real[::-1], 20, t0=T0 + 65)  # other values, so a sample written over shows
    after = [TickBatch(b.time, before[0].devices, b.values) for b in after]
    uuid = real[0].device.uuid
    path = tmp_path / "step.sqlite"
    with Store(path, retention_s=None) as store:
        for b in before + after:
            store.ingest(b)
        got = {t.device.uuid: t for t in store.query()}
        assert sorted(got) == sorted(u for t in real for u in (t.device.uuid, f"{t.device.uuid}/clock1"))
        np.testing.assert_array_equal(got[f"{uuid}/clock1"].time, T0 + np.arange(70))
        np.testing.assert_array_equal(got[f"{uuid}/clock1"]["power"], real[0]["power"][:70])
        np.testing.assert_array_equal(got[uuid].time, T0 + 65 + np.arange(20))
        np.testing.assert_array_equal(got[uuid]["power"], real[1]["power"][:20])
        assert store.count() == 90 * len(real)
        assert float(store.latest()[-1].time[0]) == T0 + 84
    steps = [r.getMessage() for r in caplog.records if "clock step" in r.getMessage()]
    assert len(steps) == len(real)
    assert f"device {uuid}: time went back 4.000 s" in steps[0]
    assert f"as device {uuid}/clock1, never re-sorted" in steps[0]
    # A writer opened later sees a step against what is stored, and numbers the next clock on.
    with Store(path, retention_s=None) as store:
        store.ingest(TickBatch(T0, before[0].devices, before[0].values))
        store.ingest(TickBatch(T0 + 84, before[0].devices, before[0].values))  # forward again: no step
        uuids = [d.uuid for d in store.devices()]
        assert f"{uuid}/clock2" in uuids and f"{uuid}/clock3" not in uuids
        assert len(store.query(device=uuid)[0]) == 2


def test_a_tick_at_the_newest_time_replaces_it_without_a_step(
    tmp_path: Path, real: list[Trace], caplog: pytest.LogCaptureFixture
) -> None:
    ticks = _ticks(real, 5)
    with Store(tmp_path / "same.sqlite", retention_s=None) as store:
        for b in ticks:
            store.ingest(b)
        store.ingest(TickBatch(ticks[-1].time, ticks[0].devices, ticks[0].values))
        assert [d.uuid for d in store.devices()] == [t.device.uuid for t in real]
        assert store.count() == 5 * len(real)
        assert store.query()[0]["power"][-1] == real[0]["power"][0]
    assert not [r for r in caplog.records if "clock step" in r.getMessage()]
