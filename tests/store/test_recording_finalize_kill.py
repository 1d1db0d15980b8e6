"""finalize() killed with -9 while it deletes the partial dir: `record --recover` never shrinks the recording.

It used to write the merged file, then `shutil.rmtree` the partial dir; a kill during the delete left the
header and some segments, and `--recover` rebuilt the final file from them (142 -> 82 samples, exit 0)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from phasescope.cli import main
from phasescope.schema import Trace
from phasescope.sources.replay import read
from phasescope.store.recording import finalize, manifest_path_for, partial_dir_for

from .test_recording import RUN, _replayed_ticks, _write

# Runs finalize(PDIR) in a fresh process that SIGKILLs itself at the KILL_AT-th os.unlink/os.rmdir: a real
# kill at an exact step of the delete (both shutil.rmtree and Path.unlink/rmdir go through these two).
_KILL_AT_DELETE = """
import os, signal, sys
from pathlib import Path
from phasescope.store.recording import finalize
kill_at, calls = int(sys.argv[2]), [0]
def killing(fn):
    def wrapped(*args, **kwargs):
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return fn(*args, **kwargs)
    return wrapped
os.unlink, os.rmdir = killing(os.unlink), killing(os.rmdir)
finalize(Path(sys.argv[1]))
print(calls[0])
"""


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> tuple[Path, int]:
    """A partial dir of a real run (256 ticks, 30 s segments: 9 Parquet segments + header), and its rows."""
    traces: list[Trace] = read(shared_data / RUN)
    out = tmp_path_factory.mktemp("template") / "rec.parquet"
    _write(out, _replayed_ticks(traces), segment_s=30.0, close=False, interval_s=1.0).roll()
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in partial_dir_for(out).glob("seg-*.parquet"))
    assert len(list(partial_dir_for(out).glob("seg-*.parquet"))) >= 8
    return partial_dir_for(out), rows


def _copy(template: Path, dest: Path) -> Path:
    dest.mkdir()
    pdir = dest / template.name
    shutil.copytree(template, pdir)
    return pdir


def test_a_kill_at_any_step_of_the_delete_never_shrinks_the_recording(
    tmp_path: Path, unfinished: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    template, rows = unfinished
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    kill_at, finished = 0, False
    while not finished:
        pdir = _copy(template, tmp_path / f"k{kill_at}")
        final = pdir.with_name("rec.parquet")
        proc = subprocess.run([sys.executable, "-c", _KILL_AT_DELETE, str(pdir), str(kill_at)],
                              capture_output=True, text=True, timeout=120, env=env)
        finished = proc.returncode == 0  # the kill point lies past the last delete: the sweep is complete
        if not finished:
            assert proc.returncode == -signal.SIGKILL, proc.stderr
            assert pq.ParquetFile(final).metadata.num_rows == rows  # the final file was durable first
        if pdir.exists():
            assert main(["record", "--recover", str(pdir)]) == 0, capsys.readouterr().err
            assert "recorded" in capsys.readouterr().err
        assert not pdir.exists(), f"kill at delete {kill_at}"
        assert pq.ParquetFile(final).metadata.num_rows == rows, f"kill at delete {kill_at}"
        assert json.loads(manifest_path_for(final).read_text())["rows"] == rows
        kill_at += 1
    assert kill_at >= 11  # every segment, the header, the marker and the directory itself


def test_recover_refuses_to_replace_a_complete_recording_with_fewer_samples(
    tmp_path: Path, unfinished: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    """The state a kill during the old `shutil.rmtree` left: a complete final file and no marker beside a
    partial dir that lost some segments. Recovering from it is refused in one line; nothing changes."""
    template, rows = unfinished
    pdir = _copy(template, tmp_path / "old")
    final = pdir.with_name("rec.parquet")
    finalize(pdir)
    shutil.copytree(template, pdir)
    for seg in sorted(pdir.glob("seg-*.parquet"))[:4]:
        seg.unlink()
    before = final.read_bytes()
    assert main(["record", "--recover", str(pdir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{final}: existing recording: expected at most the " in err
    assert f"got 'a complete recording of {rows} samples'" in err
    assert final.read_bytes() == before and pdir.is_dir()


def test_a_finished_marker_with_a_damaged_final_file_is_refused(
    tmp_path: Path, unfinished: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    """Marked finished, some segments gone, and the final file cut short since: no rebuild from the rest."""
    template, rows = unfinished
    pdir = _copy(template, tmp_path / "cut")
    final = pdir.with_name("rec.parquet")
    (pdir / "finished.json").write_text(json.dumps({"file": final.name, "rows": rows}))
    final.write_bytes(b"PAR1")
    assert main(["record", "--recover", str(pdir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{final}: finalised recording: expected a complete recording of " in err
    assert final.read_bytes() == b"PAR1" and pdir.is_dir()
