"""The recording format: real traces through writer and reader, manifest, crash leftovers, bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phasescope.errors import InputError
from phasescope.schema import (
    PAPER_SIGNALS,
    SIGNAL_COLUMN,
    SIGNAL_NAMES,
    DeviceInfo,
    ProcessSample,
    TickBatch,
    Trace,
)
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.store.recording import (
    META_KEY,
    RecordingWriter,
    finalize,
    manifest_path_for,
    partial_dir_for,
    read_manifest,
    read_processes,
    read_recording,
    sniff,
)

RUN = "sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv"
WALL0 = 1_780_000_000.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _replayed_ticks(traces: list[Trace]) -> list[tuple[float, TickBatch]]:
    """Play the real traces through ReplaySource, reading just after every device has its i-th sample."""
    clock = FakeClock()
    src = ReplaySource(traces, clock=clock, wall_clock=lambda: WALL0)
    n = min(len(t) for t in traces)
    t0 = src.t0
    out = []
    for i in range(n):
        pos = max(t.time[i] for t in traces) + 1e-3
        assert i + 1 == n or pos < min(t.time[i + 1] for t in traces)  # reads land between samples
        clock.now = pos - t0
        out.append((clock.now, src.read()))
    return out


@pytest.fixture(scope="module")
def real_traces(shared_data: Path) -> list[Trace]:
    traces = read(shared_data / RUN)
    assert len(traces) == 2
    return traces


def _write(
    path: Path,
    ticks: list[tuple[float, TickBatch]],
    segment_s: float = 60.0,
    close: bool = True,
    **kw: object,
) -> RecordingWriter:
    clock = FakeClock()
    w = RecordingWriter(path, segment_s=segment_s, clock=clock, host="testhost", **kw)  # type: ignore[arg-type]
    for elapsed, batch in ticks:
        clock.now = elapsed
        w.write(batch)
    if close:
        w.close()
    return w


def test_round_trip_of_a_real_trace_is_exact(tmp_path: Path, real_traces: list[Trace]) -> None:
    ticks = _replayed_ticks(real_traces)
    out = tmp_path / "rec.parquet"
    # 256 s at 1 Hz, 30 s segments: 9 closed Parquet segments merged on close.
    _write(out, ticks, segment_s=30.0, source_spec=f"replay:{RUN}", interval_s=1.0)
    assert not partial_dir_for(out).exists()
    back = read_recording(out)
    assert [t.device.uuid for t in back] == [t.device.uuid for t in real_traces]
    for orig, got in zip(real_traces, back, strict=True):
        n = len(got)
        assert n == min(len(t) for t in real_traces)
        for s in SIGNAL_NAMES:
            np.testing.assert_array_equal(got[s], orig[s][:n], err_msg=s)
        # recorded clock: same spacing as the reads, shifted onto WALL0
        np.testing.assert_allclose(got.time, WALL0 + np.array([e for e, _ in ticks]), rtol=0, atol=1e-6)
        assert got.meta["format"] == "phasescope" and got.meta["partial"] is False
    assert sniff(out)


def test_partial_dir_reads_the_same_as_the_closed_file(tmp_path: Path, real_traces: list[Trace]) -> None:
    ticks = _replayed_ticks(real_traces)[:100]
    out = tmp_path / "rec.parquet"
    w = _write(out, ticks, segment_s=30.0, close=False)
    pdir = partial_dir_for(out)
    names = sorted(p.name for p in pdir.iterdir())
    assert "seg-00001.parquet" in names and "seg-00004.arrows" in names  # closed segments + open tail
    assert sniff(pdir)
    from phasescope.sources.replay import detect

    assert detect(pdir) == "phasescope"  # the registry takes the directory too
    live = read_recording(pdir)
    assert live[0].meta["partial"] is True
    w.close()
    done = read_recording(out)
    for a, b in zip(live, done, strict=True):
        assert len(a) == len(b) == 100
        for s in SIGNAL_NAMES:
            np.testing.assert_array_equal(a[s], b[s])


def test_manifest_fields_and_missing_fraction(tmp_path: Path, real_traces: list[Trace]) -> None:
    ticks = _replayed_ticks(real_traces)[:50]
    # Blank gpu_util of the first device in 10 ticks: its missing fraction must read 10/50.
    for _, batch in ticks[:10]:
        batch.values[0, SIGNAL_COLUMN["gpu_util"]] = np.nan
    dev0 = ticks[0][1].devices[0]
    ticks[0][1].devices[0] = DeviceInfo(
        dev0.uuid, "NVIDIA GeForce RTX 3090", 0, "rig", extra={"driver_version": "550.54"}
    )
    out = tmp_path / "m.parquet"
    _write(out, ticks, source_spec="replay:x?speed=2", interval_s=1.0)
    m = json.loads(manifest_path_for(out).read_text())
    assert m == read_manifest(out)
    assert m["format"] == "phasescope-recording" and m["version"] == 1
    assert m["host"] == "testhost" and m["source"] == "replay:x?speed=2" and m["driver"] == "550.54"
    assert m["interval_s"] == 1.0 and m["rate_hz"] == pytest.approx(1.0, rel=0.01)
    assert m["start"] == pytest.approx(WALL0 + ticks[0][0]) and m["end"] == pytest.approx(
        WALL0 + ticks[-1][0]
    )
    assert m["start_utc"].startswith("2026-") and m["ticks"] == 50 and m["rows"] == 100
    assert m["phasescope_version"] and m["recovered"] is False
    assert [d["uuid"] for d in m["devices"]] == [t.device.uuid for t in real_traces]
    assert m["devices"][0]["name"] == "NVIDIA GeForce RTX 3090"
    assert m["devices"][0]["missing_fraction"]["gpu_util"] == pytest.approx(10 / 50)
    assert m["devices"][1]["missing_fraction"]["gpu_util"] == 0.0
    assert m["missing_fraction"]["gpu_util"] == pytest.approx(10 / 100)
    # The RTX 3090 log has the paper's 9 signals and nothing else.
    assert all(m["missing_fraction"][s] < 1.0 for s in PAPER_SIGNALS)
    assert set(m["missing_signals"]) == set(SIGNAL_NAMES) - set(PAPER_SIGNALS)
    # The Parquet file describes itself too.
    meta = json.loads(pq.read_schema(out).metadata[META_KEY])
    assert meta["devices"][0]["uuid"] == dev0.uuid and meta["rows"] == 100


def test_processes_are_recorded_beside_the_samples(tmp_path: Path, real_traces: list[Trace]) -> None:
    ticks = _replayed_ticks(real_traces)[:5]
    uuid = ticks[0][1].devices[0].uuid
    for i, (_, batch) in enumerate(ticks):
        batch.processes = [
            ProcessSample(batch.time, 4242, uuid, "python", gpu_mem_used=1e9 + i, rss=2e9, uses_torch=True)
        ]
    out = tmp_path / "p.parquet"
    _write(out, ticks)
    procs = read_processes(out)
    assert procs.num_rows == 5
    assert procs.column("pid").to_pylist() == [4242] * 5
    assert procs.column("gpu_mem_used").to_pylist() == [1e9 + i for i in range(5)]
    assert json.loads(manifest_path_for(out).read_text())["processes_file"] == "p.parquet.processes.parquet"


def test_torn_tail_is_read_up_to_the_last_complete_batch(tmp_path: Path, real_traces: list[Trace]) -> None:
    ticks = _replayed_ticks(real_traces)[:20]
    out = tmp_path / "t.parquet"
    _write(out, ticks, close=False)  # one open segment, one IPC batch per tick
    tail = partial_dir_for(out) / "seg-00001.arrows"
    data = tail.read_bytes()
    tail.write_bytes(data[:-7])  # a kill -9 in the middle of the last write
    traces = read_recording(partial_dir_for(out))
    assert [len(t) for t in traces] == [19, 19]
    manifest = finalize(partial_dir_for(out))
    assert manifest["recovered"] is True and manifest["torn_tail"] is True and manifest["ticks"] == 19
    assert [len(t) for t in read_recording(out)] == [19, 19]


def test_crash_between_roll_rename_and_tail_delete_does_not_duplicate(
    tmp_path: Path, real_traces: list[Trace]
) -> None:
    ticks = _replayed_ticks(real_traces)[:10]
    out = tmp_path / "d.parquet"
    w = _write(out, ticks, close=False)
    pdir = partial_dir_for(out)
    kept = (pdir / "seg-00001.arrows").read_bytes()
    w.roll()
    (pdir / "seg-00001.arrows").write_bytes(kept)  # as if killed before the tail was removed
    assert [len(t) for t in read_recording(pdir)] == [10, 10]


def _good_file(tmp_path: Path, real_traces: list[Trace]) -> Path:
    out = tmp_path / "good.parquet"
    _write(out, _replayed_ticks(real_traces)[:10])
    return out


def test_bad_inputs_give_one_input_error(tmp_path: Path, real_traces: list[Trace]) -> None:
    good = _good_file(tmp_path, real_traces)
    data = good.read_bytes()

    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"Parquet footer.*partial"):
        read_recording(truncated)
    assert not sniff(truncated)

    table = pq.read_table(good)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(table.replace_schema_metadata({}), foreign)
    with pytest.raises(InputError, match=r"schema metadata 'phasescope'.*no such key"):
        read_recording(foreign)
    assert not sniff(foreign)

    meta = json.loads(table.schema.metadata[META_KEY])
    future = tmp_path / "future.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps({**meta, "version": 99})}), future)
    with pytest.raises(InputError, match=r"version: expected an integer 1\.\.1, got 99"):
        read_recording(future)

    no_time = tmp_path / "no_time.parquet"
    pq.write_table(table.drop_columns(["time"]), no_time)
    with pytest.raises(InputError, match="column 'time'"):
        read_recording(no_time)

    nan_time = tmp_path / "nan_time.parquet"
    times = table.column("time").to_numpy().copy()
    times[3] = np.nan
    pq.write_table(table.set_column(0, pa.field("time", pa.float64()), pa.array(times)), nan_time)
    with pytest.raises(InputError, match="row 3, column 'time': expected a finite Unix time"):
        read_recording(nan_time)

    text_signal = tmp_path / "text_signal.parquet"
    idx = table.schema.get_field_index("power")
    pq.write_table(table.set_column(idx, "power", pa.array(["x"] * table.num_rows)), text_signal)
    with pytest.raises(InputError, match="column 'power': expected float64"):
        read_recording(text_signal)

    with pytest.raises(InputError, match="no such file"):
        read_recording(tmp_path / "absent.parquet")


def test_bad_partial_dirs(tmp_path: Path, real_traces: list[Trace]) -> None:
    empty = tmp_path / "e.parquet.partial"
    empty.mkdir()
    with pytest.raises(InputError, match="a partial phasescope recording"):
        read_recording(empty)
    assert not sniff(empty)

    out = tmp_path / "h.parquet"
    w = RecordingWriter(out)  # header written, no data yet
    with pytest.raises(InputError, match="at least one complete sample batch"):
        read_recording(w.partial_dir)
    (w.partial_dir / "header.json").write_text("{not json")
    with pytest.raises(InputError, match=r"header\.json: header: expected JSON"):
        read_recording(w.partial_dir)
    with pytest.raises(InputError, match="directory name"):
        finalize(tmp_path)
    shutil.rmtree(w.partial_dir)


def test_writer_refuses_to_overwrite_or_to_step_on_a_crashed_recording(
    tmp_path: Path, real_traces: list[Trace]
) -> None:
    good = _good_file(tmp_path, real_traces)
    with pytest.raises(InputError, match="expected a new file name"):
        RecordingWriter(good)
    crashed = tmp_path / "crashed.parquet"
    RecordingWriter(crashed)
    with pytest.raises(InputError, match="--recover"):
        RecordingWriter(crashed)


def test_phasescope_format_is_detected_and_read_through_the_registry(
    tmp_path: Path, real_traces: list[Trace]
) -> None:
    from phasescope.sources.replay import detect

    good = _good_file(tmp_path, real_traces)
    assert detect(good) == "phasescope"
    traces = read(good)
    assert [len(t) for t in traces] == [10, 10]
    assert traces[0].meta["host"] == "testhost"
