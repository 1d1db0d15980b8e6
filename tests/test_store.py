"""The live store: ingest of real ticks, queries, retention, readers during writes."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from phasescope.errors import InputError
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, ProcessSample, Trace
from phasescope.sources.base import TickBatch
from phasescope.sources.replay import read
from phasescope.store import Store

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
