from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.sources.replay import alibaba
from tests.sources.replay.conftest import expect_input_error

DUTY = "alibaba-gentd26/pod_gpu_duty_cycle_anon.csv"
MEM = "alibaba-gentd26/pod_gpu_memory_used_bytes_anon.csv"
IP = "23b8eba99c14e73d454503a55ae96989"  # first data row of both files, at 1662858720.0


def test_either_file_reads_the_joined_pair(shared_data: Path) -> None:
    a = alibaba.read(shared_data / DUTY)
    b = alibaba.read(shared_data / MEM)
    assert len(a) == len(b) == 80
    assert [t.device.uuid for t in a] == [t.device.uuid for t in b]
    by_ip = {t.meta["container_ip"]: t for t in a}
    t = by_ip[IP]
    i = int(np.flatnonzero(t.time == 1662858720.0)[0])
    assert t["gpu_util"][i] == 0.0
    assert t["mem_used"][i] == 33879490560.0  # bytes, as in the file
    assert t.meta["run"] == IP and "scaled" in t.meta["note"]
    assert all(np.all(np.diff(x.time) > 0) for x in a)
    # duty cycle is percent in the file (max ~98.8) -> ratio
    assert 0.9 < max(np.nanmax(x["gpu_util"]) for x in a) <= 1.0


def test_rows_are_all_kept(shared_data: Path) -> None:
    traces = alibaba.read(shared_data / DUTY)
    n_duty = sum(np.isfinite(t["gpu_util"]).sum() for t in traces)
    n_mem = sum(np.isfinite(t["mem_used"]).sum() for t in traces)
    assert n_duty == 90752 and n_mem == 93598  # data rows of each file (header excluded)


def test_alone_without_sibling(shared_data: Path, tmp_path: Path) -> None:
    lines = (shared_data / DUTY).read_text().splitlines()[:200]
    (tmp_path / "pod_gpu_duty_cycle_anon.csv").write_text("\n".join(lines) + "\n")
    traces = alibaba.read(tmp_path / "pod_gpu_duty_cycle_anon.csv")
    assert traces and all(not t.has("mem_used") for t in traces)


def test_garbage_value(shared_data: Path, tmp_path: Path) -> None:
    lines = (shared_data / DUTY).read_text().splitlines()[:50]
    lines[7] = "zero" + lines[7][lines[7].index(",") :]
    p = tmp_path / "pod_gpu_duty_cycle_anon.csv"
    p.write_text("\n".join(lines) + "\n")
    expect_input_error(alibaba.read, p, match=(str(p), "row 7", "'value'", "a number", "zero"))


def test_unknown_file_name(shared_data: Path, tmp_path: Path) -> None:
    p = tmp_path / "other.csv"
    p.write_text("value,timestamp_anon,container_ip\n1,2,x\n")
    assert alibaba.sniff(p)
    expect_input_error(alibaba.read, p, match=(str(p), "file name"))


@pytest.mark.parametrize("header", ["value,timestamp,container_ip", "value,timestamp_anon"])
def test_wrong_header(tmp_path: Path, header: str) -> None:
    p = tmp_path / "pod_gpu_duty_cycle_anon.csv"
    p.write_text(header + "\n1,2,x\n")
    expect_input_error(alibaba.read, p, match=(str(p), "header", "value, timestamp_anon, container_ip"))
