"""The event log on disk: chunks written while running are read back whole; bad files give one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from phasescope.errors import InputError
from phasescope.instrument import events as ev
from phasescope.instrument.hooks import Recorder


def test_chunks_round_trip_with_wall_clock(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_s=0)
    rec.install()
    try:
        model = nn.Linear(4, 2)
        with torch.no_grad():
            model(torch.randn(3, 4))
            rec.flush()
            model(torch.randn(3, 4))
    finally:
        rec.uninstall()  # writes the second chunk
    (pe,) = ev.load_events(tmp_path)
    assert len(list(tmp_path.glob("events-*.npz"))) == 2
    assert pe.rows.shape == (2, ev.ROW)  # one row per forward, written when it ends
    assert len(rec.buffer) == 0  # flushed rows leave memory
    kind, t0, root, idx, batch, seq, flags, t1 = pe.rows.T
    assert (kind == ev.FWD).all() and (t0 < t1).all() and t1[0] <= t0[1]
    assert root.tolist() == [0, 0] and idx.tolist() == [0, 1] and batch.tolist() == [3, 3]
    assert seq.tolist() == [0, 0] and flags.tolist() == [ev.MODULE_TRAINING] * 2  # no_grad, train() mode
    wall = pe.rows[:, 7] + pe.wall_offset
    import time

    assert abs(wall[-1] - time.time()) < 5.0
    assert pe.device.startswith("host:") and pe.meta["roots"][0]["name"] == "Linear"


def test_nothing_written_for_a_process_without_events(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_s=0)
    rec.install()
    rec.uninstall()
    assert list(tmp_path.iterdir()) == []


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory"):
        ev.load_events(tmp_path / "nope")


def test_corrupt_chunk_is_one_line(tmp_path: Path) -> None:
    ev.write_chunk(tmp_path, 7, 0, np.zeros((1, ev.ROW)), {})
    (tmp_path / "events-7-000001.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError) as info:
        ev.load_events(tmp_path)
    assert "events-7-000001.npz" in str(info.value) and "\n" not in str(info.value)


def test_wrong_shape_and_format(tmp_path: Path) -> None:
    ev.write_chunk(tmp_path, 8, 0, np.zeros((2, 3)), {})
    with pytest.raises(InputError, match=r"shape \(n, 8\)"):
        ev.load_events(tmp_path)
    other = tmp_path / "b"
    other.mkdir()
    (other / "meta-9.json").write_text(json.dumps({"format": "something-else", "pid": 9}))
    with pytest.raises(InputError, match="phasescope-hook-events"):
        ev.load_events(other)
