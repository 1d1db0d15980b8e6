from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.errors import InputError
from phasescope.verify.inputs import parse_time


def test_time_forms() -> None:
    now = 1_800_000_000.0
    assert parse_time("10m", "--since", now) == now - 600
    assert parse_time("-2h", "--since", now) == now - 7200
    assert parse_time("1d", "--since", now) == now - 86400
    assert parse_time("1700000000.5", "--since", now) == 1_700_000_000.5
    assert parse_time("2023-11-14T22:13:20Z", "--since", now) == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20", "--since", now) == 1_700_000_000.0  # no zone: UTC
    with pytest.raises(InputError, match="--until: time: expected Unix s"):
        parse_time("soon", "--until", now)


SPAR = "spar-a100/bert_sst2_amp_NVIDIA_A100_SXM4_40GB_90abf7ca_20260309_182528.parquet"  # 27 s at 1 Hz


def test_watching_a_replay_stops_at_its_end(shared_data: Path) -> None:
    """`verify --source replay:F --duration D` longer than the replay: the verdict rests on the replayed
    samples, not on a tail of empty ticks after the end (those read as covered time with no data)."""
    from phasescope.sources.replay_live import ReplaySource
    from phasescope.verify.inputs import sample_live

    src = ReplaySource.from_path(shared_data / SPAR, speed=25)  # plays in about 1 s
    (trace,) = sample_live(src, duration_s=3.0, interval_s=0.1)
    assert len(trace) >= 3
    assert np.isfinite(trace["power"]).all()


def test_logs_without_gpu_uuids_from_two_files_are_not_joined(shared_data: Path, tmp_path: Path) -> None:
    """Two hosts' dmon logs with the same file name both call their GPU 0 "file:dmon#0", and overlap in time:
    two devices, not one recording in two parts (joined, the second host's samples at the first's times
    vanished without a word). Daily logs of one device (spans in sequence) are still joined (test_verify.py
    test_one_device_in_several_inputs_is_one_timeline)."""
    from phasescope.verify.inputs import read_inputs

    dmon = shared_data / "formats/nvidia-smi-dmon"
    paths = []
    for host, name in (("h1", "iamwavecut__OrbitQuant__rtx-pro-6000-kernel-bench_dmon-15s.txt"),
                       ("h2", "sugarcraft__candy-top__skynet2_dmon-c1-pucm.txt")):
        (tmp_path / host).mkdir()
        (tmp_path / host / "dmon.txt").write_bytes((dmon / name).read_bytes())
        paths.append(str(tmp_path / host / "dmon.txt"))
    with pytest.raises(InputError, match=r"h1/dmon.txt: device file:dmon#0: expected a span after .*h2/dmon"):
        read_inputs(paths)
    # The same file given twice is still one trace, each sample once.
    (alone,) = [t for t in read_inputs([paths[0]])[0] if t.device.uuid == "file:dmon#0"]
    again = str(tmp_path / "h2" / ".." / "h1" / "dmon.txt")
    (twice,) = [t for t in read_inputs([paths[0], again])[0] if t.device.uuid == "file:dmon#0"]
    assert len(twice) == len(alone) == 10
