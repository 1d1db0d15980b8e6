"""`phasescope record`: replayed real traces end to end, clean stops, and a real recorder killed with -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from phasescope.cli import main
from phasescope.schema import SIGNAL_NAMES
from phasescope.sources.replay import read
from phasescope.store.recording import manifest_path_for, partial_dir_for, read_recording

RUN = "sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv"


def _recorder(tmp_path: Path, out: Path, source: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "phasescope", "record", "-o", str(out), "--source", source, *extra],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_for(pred: object, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the recorder")


def test_record_a_replayed_real_trace_to_its_end(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = shared_data / RUN
    out = tmp_path / "r.parquet"
    # speed 200: the 256 s run plays in ~1.3 s, one sample per 0.1 s (20 recorded seconds).
    assert main(["record", "-o", str(out), "--source", f"replay:{src}?speed=200"]) == 0
    err = capsys.readouterr().err
    assert "recorded" in err and "classifier signals never seen: none" in err
    assert not partial_dir_for(out).exists()
    m = json.loads(manifest_path_for(out).read_text())
    assert m["source"] == f"replay:{src}?speed=200" and m["interval_s"] == 0.1
    assert m["recovered"] is False and m["ticks"] >= 8
    assert m["duration_s"] > 150  # the whole run, on the recorded clock
    orig = read(src)
    got = read_recording(out)
    assert [t.device.uuid for t in got] == [t.device.uuid for t in orig]
    for o, g in zip(orig, got, strict=True):
        # every recorded row is one of the device's real samples (sample-and-hold, no invented values)
        real_rows = {
            tuple(np.nan_to_num(np.array([o[s][i] for s in SIGNAL_NAMES]), nan=-1.0)) for i in range(len(o))
        }
        for i in range(len(g)):
            row = tuple(np.nan_to_num(np.array([g[s][i] for s in SIGNAL_NAMES]), nan=-1.0))
            assert row in real_rows or all(v == -1.0 for v in row)


def test_quiet_says_only_warnings_and_errors(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quiet used to leave out only the progress line (never drawn off a terminal anyway): the start and
    summary lines were still printed. Now a clean run says nothing; an error is still one line."""
    spec = f"replay:{shared_data / RUN}?speed=200"
    assert main(["record", "-o", str(tmp_path / "a.parquet"), "--source", spec]) == 0
    err = capsys.readouterr().err
    assert "phasescope: recording to" in err and "phasescope: recorded" in err  # without --quiet
    # --interval given: at speed=200 the replay's own rate is past the sampler's limit, which is a warning
    # (`live_interval`), said even with --quiet.
    quiet = ["record", "-o", str(tmp_path / "q.parquet"), "--source", spec, "--interval", "0.1", "--quiet"]
    assert main(quiet) == 0
    assert capsys.readouterr().err == ""
    assert manifest_path_for(tmp_path / "q.parquet").exists()
    assert main(quiet) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "q.parquet" in err  # it is there already: refused, in one line


def test_sigterm_finishes_the_recording_cleanly(tmp_path: Path, shared_data: Path) -> None:
    out = tmp_path / "t.parquet"
    proc = _recorder(tmp_path, out, f"replay:{shared_data / RUN}?loop=1", "--interval", "0.2")
    _wait_for(lambda: (partial_dir_for(out) / "seg-00001.arrows").exists())
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    assert out.exists() and manifest_path_for(out).exists() and not partial_dir_for(out).exists()
    assert b"Traceback" not in err
    assert all(len(t) >= 2 for t in read_recording(out))


def test_kill_9_loses_at_most_2_s_and_recover_finalises(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k.parquet"
    pdir = partial_dir_for(out)
    # speed 1: the recorded clock runs with the wall clock, so "lost seconds" is measurable.
    # 1 s segments: the kill lands on closed Parquet segments plus an open IPC tail.
    proc = _recorder(
        tmp_path, out, f"replay:{shared_data / RUN}?speed=1&loop=1", "--interval", "0.2", "--segment", "1"
    )
    _wait_for(lambda: len(list(pdir.glob("seg-*.parquet"))) >= 2)
    time.sleep(0.7)
    killed_at = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert pdir.is_dir() and not out.exists()

    traces = read_recording(pdir)  # a kill -9 leaves something readable
    assert len(traces) == 2
    for t in traces:
        assert t.time[-1] >= killed_at - 2.0, f"lost {killed_at - t.time[-1]:.2f} s"
        assert np.all(np.diff(t.time) > 0) and np.max(np.diff(t.time)) < 1.0  # no hole between segments
        assert np.isfinite(t["power"]).all()
    rows = [len(t) for t in traces]

    assert main(["record", "--recover", str(pdir)]) == 0
    assert "recorded" in capsys.readouterr().err
    assert not pdir.exists()
    m = json.loads(manifest_path_for(out).read_text())
    assert m["recovered"] is True and m["rows"] == sum(rows)
    assert [len(t) for t in read_recording(out)] == rows


def test_bad_arguments_give_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--source", "gpu0", "-o", str(tmp_path / "x.parquet")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--source: spec: expected auto, nvml, host or replay:PATH" in err
    assert main(["record", "--recover", str(tmp_path / "none.parquet.partial")]) != 0
    err = capsys.readouterr().err
    assert "expected a partial phasescope recording" in err and "Traceback" not in err
    assert main(["record", "--interval", "0.01", "--source", "host"]) != 0
    assert "--interval" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_output_or_store_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-o` in a folder that does not exist under a file (or read-only) used to end in a NotADirectoryError
    traceback from making FILE.partial/, `--store` there in a FileExistsError one (`serve --store` said it
    in one line already)."""
    (tmp_path / "file").write_text("x")
    assert main(["record", "-o", str(tmp_path / "file" / "r.parquet"), "--source", "host", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "r.parquet: --output: expected a path where a new recording can be written" in err
    out = tmp_path / "r.parquet"
    store = tmp_path / "file" / "s.sqlite"
    assert main(["record", "-o", str(out), "--source", "host", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "s.sqlite: --store: expected a store file that can be created" in err
    assert not out.exists() and not partial_dir_for(out).exists()


def test_default_output_name(tmp_path: Path) -> None:
    from phasescope.cli.record import default_output

    name = default_output(0.0).name
    assert name.startswith("phasescope-") and name.endswith("-19700101T000000Z.parquet")


def test_store_keeps_the_same_samples_as_the_recording(tmp_path: Path, shared_data: Path) -> None:
    from phasescope.store.live import Store

    out, db = tmp_path / "r.parquet", tmp_path / "live.sqlite"
    src = shared_data / RUN
    assert main(["record", "-o", str(out), "--source", f"replay:{src}?speed=200", "--quiet",
                 "--store", str(db)]) == 0
    rec = {t.device.uuid: t for t in read_recording(out)}
    stored = {t.device.uuid: t for t in Store(db, read_only=True).query()}
    assert set(stored) == set(rec)
    for uuid, t in rec.items():
        np.testing.assert_array_equal(stored[uuid].time, t.time)
        np.testing.assert_array_equal(stored[uuid]["power"], t["power"])


def test_a_store_another_process_writes_is_refused(tmp_path: Path, shared_data: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Two writers would interleave one device's samples: `record --store` says who writes it, and stops
    before making a recording."""
    import socket

    from phasescope.store.live import Store

    db, out = tmp_path / "live.sqlite", tmp_path / "r.parquet"
    spec = f"replay:{shared_data / RUN}?speed=200"
    with Store(db):  # a live writer (this process; active_writer checks the pid is running)
        assert main(["record", "-o", str(out), "--source", spec, "--quiet", "--store", str(db)]) != 0
        err = capsys.readouterr().err
        assert f"live.sqlite: process {os.getpid()} on {socket.gethostname()} is writing this store" in err
        assert "stop that process, or use a different --store path" in err and "Traceback" not in err
        assert not out.exists()
    # Once that writer has closed, the same command writes the store.
    assert main(["record", "-o", str(out), "--source", spec, "--quiet", "--store", str(db)]) == 0
    with Store(db, read_only=True) as store:
        assert store.count() > 0


def test_a_command_that_ends_before_the_first_sample_keeps_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`record -- CMD` exits with CMD's code; a CMD that fails at once (before the first tick) used to turn
    into "nothing recorded" and exit 2, hiding its own code."""
    from phasescope.cli.record import _record_command
    from phasescope.sources.host import HostSource
    from phasescope.store.recording import RecordingWriter

    class NoTicks:  # the child's exit wins the race with the first tick
        interval_s = 1.0

        def run(self, on_tick: object, duration: float | None = None, stop: object = None) -> None:
            assert stop is not None and stop.wait(10)  # type: ignore[attr-defined]

    out = tmp_path / "r.parquet"
    source = HostSource()
    try:
        writer = RecordingWriter(out, source_spec="host", interval_s=1.0)
        code = _record_command(["sh", "-c", "exit 5"], source, NoTicks(), writer, None, False, out, False, "")
    finally:
        source.close()
    assert code == 5
    err = capsys.readouterr().err
    assert "nothing recorded: stopped before the first sample" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # the empty recording is not left behind


def _file_size_limit(limit_bytes: int) -> object:
    """preexec_fn: a real 'file too large' on write past `limit_bytes` (Python ignores SIGXFSZ), as a full
    disk would answer."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def test_a_full_disk_is_one_line_and_keeps_what_was_recorded(tmp_path: Path, shared_data: Path) -> None:
    """A write that failed (disk full) used to end in two tracebacks (the failed tick, then close() failing
    again on the same pending rows); the partial directory stays and `--recover` finishes it."""
    out = tmp_path / "r.parquet"
    proc = subprocess.run(
        [sys.executable, "-m", "phasescope", "record", "-o", str(out), "--quiet", "--duration", "30",
         "--source", f"replay:{shared_data / RUN}?speed=10"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        preexec_fn=_file_size_limit(12_000),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    partial = partial_dir_for(out)
    assert last.startswith(f"phasescope: {partial}: writing the recording: expected room to write")
    assert f"'phasescope record --recover {partial}'" in last
    assert last.endswith("got 'File too large'")
    assert main(["record", "--recover", str(partial)]) == 0
    assert min(len(t) for t in read_recording(out)) >= 5  # the ticks written before the disk filled


def test_a_store_that_cannot_be_written_stops_the_store_not_the_recording(
    tmp_path: Path, shared_data: Path
) -> None:
    """`record --store` on a full disk used to stop the recording with a traceback (sqlite3 disk I/O
    error); the recording is what was asked for: it goes on, the store keeps what it had."""
    from phasescope.store.live import Store

    out, db = tmp_path / "r.parquet", tmp_path / "live.sqlite"
    proc = subprocess.run(
        [sys.executable, "-m", "phasescope", "record", "-o", str(out), "--quiet", "--duration", "4",
         "--source", f"replay:{shared_data / RUN}?speed=10", "--store", str(db)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        preexec_fn=_file_size_limit(100_000),
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "new samples are not stored; the recording goes on" in proc.stderr
    recorded = sum(len(t) for t in read_recording(out))
    with Store(db, read_only=True) as store:
        assert 0 < store.count() < recorded


@pytest.mark.parametrize("limit_bytes", [0, 600, 2_000])
def test_a_disk_full_before_any_sample_is_kept_leaves_nothing_and_promises_nothing(
    tmp_path: Path, shared_data: Path, limit_bytes: int
) -> None:
    """Disk full from the start: the header (0 B), the first tick's header (600 B) or the first batch
    (2 kB) could not be written. That used to leave an empty FILE.partial/ that the next run refused
    ("an existing partial recording") and --recover refused too (0 B), to say "nothing recorded: stopped
    before the first sample" (600 B), or to promise a --recover that then found no sample (2 kB)."""
    out = tmp_path / "r.parquet"
    cmd = [sys.executable, "-m", "phasescope", "record", "-o", str(out), "--quiet", "--duration", "3",
           "--source", f"replay:{shared_data / RUN}?speed=10"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=_file_size_limit(limit_bytes))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"phasescope: {out}: ") and last.endswith("got 'File too large'")
    assert "--recover" not in last and "nothing recorded" not in last
    assert not list(tmp_path.iterdir())  # nothing left in the way of the next run
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
