"""A process's user, start time and command line are live-only (schema.ProcessSample): a recording and the
live store keep the columns they always had, and nothing of the command line (which can hold a secret)
reaches their files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phasescope.schema import SIGNAL_NAMES, DeviceInfo, ProcessSample, TickBatch
from phasescope.store.live import Store
from phasescope.store.recording import PROCESS_SCHEMA, RecordingWriter, processes_path_for, read_processes

SECRET = "hf_0123456789abcdefSECRET"


def _ticks() -> list[TickBatch]:
    gpu = DeviceInfo("GPU-1", "NVIDIA A100", 0)
    out = []
    for t in (100.0, 101.0):
        p = ProcessSample(time=t, pid=321, device_uuid=gpu.uuid, name="python", rss=2**30, user="alice",
                          start_time=50.0, cmdline=f"python serve.py --token {SECRET}")
        out.append(TickBatch(t, [gpu], np.full((1, len(SIGNAL_NAMES)), 1.0), processes=[p]))
    return out


def test_recording_keeps_its_process_columns(tmp_path: Path) -> None:
    path = tmp_path / "run.parquet"
    with RecordingWriter(path, flush_s=0) as writer:
        for batch in _ticks():
            writer.write(batch)
    table = read_processes(path)
    assert table.column_names == PROCESS_SCHEMA.names  # the file format is unchanged
    assert table.column("pid").to_pylist() == [321, 321]
    assert table.column("name").to_pylist() == ["python"] * 2
    assert processes_path_for(path).exists()
    for f in tmp_path.rglob("*"):
        assert f.is_dir() or SECRET.encode() not in f.read_bytes(), f


def test_store_keeps_its_process_columns(tmp_path: Path) -> None:
    store = Store(tmp_path / "live.sqlite", retention_s=None)
    try:
        store.ingest_many(_ticks())
        got = store.query_processes()
        assert list(got["pid"]) == [321, 321] and got["name"] == ["python", "python"]
        assert not {"user", "cmdline", "start_time"} & set(got)
        for f in tmp_path.iterdir():  # the database and its write-ahead log
            assert SECRET.encode() not in f.read_bytes(), f
    finally:
        store.close()
