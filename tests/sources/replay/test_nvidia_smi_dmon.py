from __future__ import annotations

import warnings
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MIB
from phasescope.sources.replay import nvidia_smi_dmon as dmon
from phasescope.sources.replay import read
from tests.sources.replay.conftest import expect_input_error

D = "formats/nvidia-smi-dmon"


def test_pucvmet_four_gpus(shared_data: Path) -> None:
    traces = dmon.read(shared_data / D / "mozilla__DeepSpeech__issue-178_dmon-pucvmet.txt")
    assert [t.device.index for t in traces] == [0, 1, 2, 3]
    g3 = traces[3]
    # row: "3  86  70  18  6  0  0  4513  1784  0  0  11660  2  -  -  0  62  5" (columns as in the header)
    assert g3["power"][0] == 86 and g3["temperature"][0] == 70
    assert g3["gpu_util"][0] == pytest.approx(0.18) and g3["mem_util"][0] == pytest.approx(0.06)
    assert g3["mem_clock"][0] == 4513e6 and g3["sm_clock"][0] == 1784e6
    assert g3["mem_used"][0] == 11660 * MIB
    assert g3["pcie_rx"][0] == 62e6 and g3["pcie_tx"][0] == 5e6
    assert g3.meta["clock"] == "sweep"


def test_noise_lines_and_dash_values(shared_data: Path) -> None:
    (t,) = dmon.read(shared_data / D / "iamwavecut__OrbitQuant__rtx-pro-6000-kernel-bench_dmon-15s.txt")
    assert len(t) == 10 and t.meta["skipped_lines"] == 1  # the "loop_count=..." line
    assert t["power"].tolist()[:3] == [158, 406, 408]
    assert t["mem_used"][0] == 3783 * MIB
    assert t.time.tolist() == list(np.arange(10.0))  # dmon's 1 s default delay
    (h,) = read(
        shared_data / D / "iamwavecut__OrbitQuant__rtx-pro-6000-kernel-bench_dmon-hotloop.txt",
        "nvidia-smi-dmon:interval=2",
    )
    assert h.meta["skipped_lines"] == 1 and h.time[-1] == 10.0


def test_date_time_columns(shared_data: Path) -> None:
    (t,) = dmon.read(
        shared_data / D / "XueSongTap__XueSongTap.github.io__2024-01-04-nvidia-smi-more_dmon-mutc-TD.txt"
    )
    assert len(t) == 6
    assert t.time[0] == datetime(2024, 1, 4, 13, 54, 35, tzinfo=UTC).timestamp()
    assert np.all(np.diff(t.time) == 1.0)
    assert t["mem_used"][0] == 239 * MIB and t["pcie_tx"][1] == 677e6 and t["sm_clock"][0] == 1695e6
    assert not t.has("power")  # -s mutc has no power column


def test_dmon_rows_as_csv(shared_data: Path) -> None:
    p = (
        shared_data
        / "formats/other"
        / "FerranAgulloLopez__vLLMBatchingMemoryGap__metrics_gpu_device_nvidia_smi_dom_0_server_0.csv"
    )
    (t,) = read(p)
    assert t.meta["format"] == "nvidia-smi-dmon" and len(t) == 330
    assert t.time[0] == pytest.approx(0.12326220609247684)
    assert t["power"][2] == 636 and t["gpu_util"][2] == pytest.approx(0.92) and t["pcie_rx"][2] == 27e6


def test_single_snapshot(shared_data: Path) -> None:
    traces = dmon.read(shared_data / D / "sugarcraft__candy-top__skynet2_dmon-c1-pucm.txt")
    assert (
        len(traces) == 4
        and traces[2]["mem_used"][0] == 48243 * MIB
        and np.isnan(traces[0]["mem_util"][0]) is np.False_
    )


HEAD = "# gpu    pwr  gtemp     sm\n# Idx      W      C      %\n"


def test_garbage_value(write) -> None:  # type: ignore[no-untyped-def]
    p = write("d.txt", HEAD + "    0    100     40     50\n    0    1O0     40     50\n")
    expect_input_error(dmon.read, p, match=(str(p), "line 4", "'pwr'", "a number or '-'", "1O0"))


def test_truncated_row(write) -> None:  # type: ignore[no-untyped-def]
    p = write("d.txt", HEAD + "    0    100     40     50\n    0    100")
    expect_input_error(dmon.read, p, match=(str(p), "line 4", "4 whitespace-separated fields"))


def test_unknown_unit(write) -> None:  # type: ignore[no-untyped-def]
    p = write("d.txt", "# gpu    pwr\n# Idx     kW\n    0      1\n")
    expect_input_error(dmon.read, p, match=(str(p), "'pwr'", "one of W"))


def test_header_only(write) -> None:  # type: ignore[no-untyped-def]
    p = write("d.txt", HEAD)
    expect_input_error(dmon.read, p, match=(str(p), "at least one dmon data row"))



FERRAN = (
    "formats/other/FerranAgulloLopez__vLLMBatchingMemoryGap__"
    "metrics_gpu_device_nvidia_smi_dom_0_server_0.csv"
)


def _edited(shared_data: Path, tmp_path: Path, row: int, column: str, value: str) -> Path:
    """The first rows of a real CSV dmon log with one field replaced (found by tests/test_fuzz_inputs)."""
    lines = (shared_data / FERRAN).read_text().splitlines()[:12]
    fields = lines[2 + row].split(",")
    fields[lines[0].split(",").index(column)] = value
    lines[2 + row] = ",".join(fields)
    p = tmp_path / "dmon.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_clock_too_big_to_scale_is_dropped_without_warnings(shared_data: Path, tmp_path: Path) -> None:
    # 1e308 MHz scaled to hertz overflowed to inf with a RuntimeWarning on the user's screen.
    p = _edited(shared_data, tmp_path, 0, "pclk", "1e308")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        (t,) = read(p)
    assert np.isnan(t["sm_clock"][0]) and t["sm_clock"][1] == 1965e6


def test_a_gpu_index_past_int64_is_refused_in_one_line(shared_data: Path, tmp_path: Path) -> None:
    # A whole, finite, huge index passed the check and failed its int64 cast (a RuntimeWarning, then junk).
    p = _edited(shared_data, tmp_path, 1, "gpu", "1e308")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        expect_input_error(read, p, match=("line 4, field 'gpu'", "expected a GPU index", "1e308"))
