"""The plain `nvidia-smi` table printed over and over into one file (`nvidia-smi -l 1 > log`, a shell loop,
`watch nvidia-smi`). Inputs follow the layouts nvidia-smi prints: the wide one of drivers 530+ and the
narrow one before it."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MIB
from phasescope.sources.replay import detect, read
from phasescope.sources.replay import nvidia_smi_table as table
from tests.sources.replay.conftest import expect_input_error


def padded(text: str) -> str:
    """nvidia-smi pads its blank lines and date line with spaces; the literals here mark them '<pad>'."""
    return text.replace("<pad>", " " * 89)


WIDE_HEAD = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
"""
WIDE_BORDER = "+-----------------------------------------+------------------------+----------------------+\n"
PROCESSES = padded("""\
<pad>
+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|    0   N/A  N/A     41234      C   python                                       9000MiB |
+-----------------------------------------------------------------------------------------+
""")


def wide_gpu(i: int, temp: str, power: str, used: str, util: str, fan: str = "N/A") -> str:
    bus = ["00000000:07:00.0", "00000000:0F:00.0"][i]
    return (
        f"|   {i}  NVIDIA A100-SXM4-40GB          On  |   {bus} Off |                    0 |\n"
        f"| {fan:>3}   {temp:>3}    P0           {power:>5} /  400W |  {used:>9} /  40960MiB |"
        f"     {util:>3}      Default |\n"
        "|                                         |                        |             Disabled |\n"
        + WIDE_BORDER
    )


def wide_block(date: str | None, gpus: list[str], processes: bool = True) -> str:
    head = f"{date}       \n" if date else ""
    return head + WIDE_HEAD + "".join(gpus) + (PROCESSES if processes else "\n")


def two_gpu_log(n: int) -> str:
    blocks = []
    for k in range(n):
        blocks.append(
            wide_block(
                f"Mon Dec  7 10:00:{k:02d} 2026",
                [wide_gpu(0, f"{45 + k}C", f"{62 + 50 * k}W", f"{1234 + k}MiB", f"{35 + k}%"),
                 wide_gpu(1, "38C", "N/A", "4MiB", "0%")],
            )
        )
    return "".join(blocks)


def utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def test_repeated_wide_tables_two_gpus(write) -> None:  # type: ignore[no-untyped-def]
    p = write("smi.log", two_gpu_log(3))
    assert detect(p) == "nvidia-smi-table"
    g0, g1 = read(p)
    assert g0.device.index == 0 and g0.device.name == "NVIDIA A100-SXM4-40GB"
    assert g0.device.extra["pci_bus_id"] == "00000000:07:00.0" and g1.device.index == 1
    assert g0.time.tolist() == [utc("2026-12-07 10:00:00") + k for k in range(3)]
    assert g0.meta["clock"] == "unix" and g0.meta["format"] == "nvidia-smi-table"
    assert g0["temperature"].tolist() == [45, 46, 47]
    assert g0["power"].tolist() == [62, 112, 162] and g0["power_limit"].tolist() == [400] * 3
    assert g0["mem_used"].tolist() == [(1234 + k) * MIB for k in range(3)]
    assert g0["mem_total"][0] == 40960 * MIB
    assert g0["gpu_util"].tolist() == pytest.approx([0.35, 0.36, 0.37])
    assert np.isnan(g1["power"]).all()  # N/A: missing, never 0
    assert g1["gpu_util"].tolist() == [0, 0, 0]


def test_narrow_layout_windows_names_and_na(write) -> None:  # type: ignore[no-untyped-def]
    text = padded("""\
Tue Mar  2 09:15:01 2021<pad>
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 460.89       Driver Version: 460.89       CUDA Version: 11.2     |
|-------------------------------+----------------------+----------------------+
| GPU  Name            TCC/WDDM | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|                               |                      |               MIG M. |
|===============================+======================+======================|
|   0  GeForce RTX 208... WDDM  | 00000000:01:00.0  On |                  N/A |
| 41%   52C    P2    N/A /  N/A |   7012MiB / 11016MiB |     63%      Default |
|                               |                      |                  N/A |
+-------------------------------+----------------------+----------------------+
|   1  Tesla V100-PCIE...  TCC  | 00000000:3B:00.0 Off |                    0 |
| N/A   40C    P0    36W / 250W |  30884MiB / 32480MiB |      0%   E. Process |
+-------------------------------+----------------------+----------------------+
<pad>
+-----------------------------------------------------------------------------+
| Processes:                                                                  |
|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |
|        ID   ID                                                   Usage      |
|=============================================================================|
|  No running processes found                                                 |
+-----------------------------------------------------------------------------+
""")
    g0, g1 = read(write("win.txt", text))
    assert g0.device.name == "GeForce RTX 208..." and g1.device.name == "Tesla V100-PCIE..."
    assert np.isnan(g0["power"][0]) and np.isnan(g0["power_limit"][0])
    assert g0["mem_used"][0] == 7012 * MIB and g0["gpu_util"][0] == pytest.approx(0.63)
    assert g1["power"][0] == 36 and g1["power_limit"][0] == 250 and g1["temperature"][0] == 40


def test_mig_box_is_skipped_and_counted(write) -> None:  # type: ignore[no-untyped-def]
    mig = padded("""\
<pad>
+-----------------------------------------------------------------------------------------+
| MIG devices:                                                                            |
+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |                     Memory-Usage |        Vol|        Shared         |
|      ID  ID  Dev |                       BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |
|                  |                                  |        ECC|                       |
|==================+==================================+===========+=======================|
|  0    1   0   0  |              13MiB / 19968MiB    | 42      0 |  3   0    2    0    0 |
|                  |                 0MiB / 32767MiB  |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
|  0    2   0   1  |              13MiB / 19968MiB    | 42      0 |  3   0    2    0    0 |
|                  |                 0MiB / 32767MiB  |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
""")
    gpu = wide_gpu(0, "33C", "43W", "26MiB", "N/A").replace("Disabled", " Enabled")
    text = "".join(
        f"Mon Dec  7 10:00:0{k} 2026\n" + WIDE_HEAD + gpu + mig + PROCESSES for k in range(2)
    )
    (g0,) = read(write("mig.txt", text))  # the MIG rows are not GPUs
    assert len(g0) == 2 and g0.meta["mig_rows_ignored"] == 4
    assert np.isnan(g0["gpu_util"]).all()  # 'N/A' under MIG
    assert g0["mem_used"][0] == 26 * MIB


def test_cut_last_block_is_dropped_with_one_line(write, caplog) -> None:  # type: ignore[no-untyped-def]
    full = two_gpu_log(3)
    cut_at = full.index("| N/A   47C")  # the third table, GPU 0's second row, cut mid-line
    p = write("cut.log", full[: cut_at + 12])
    with caplog.at_level(logging.WARNING, logger="phasescope.sources.replay"):
        g0, g1 = read(p)
    assert len(g0) == len(g1) == 2
    third = two_gpu_log(2).count("\n") + 1  # the third table's date line
    said = [r.getMessage() for r in caplog.records if "cut off" in r.getMessage()]
    assert len(said) == 1 and f"from line {third}" in said[0] and "2 complete" in said[0]


def test_block_cut_between_gpus_is_dropped(write, caplog) -> None:  # type: ignore[no-untyped-def]
    full = two_gpu_log(2)
    cut = full[: full.rindex("|   1  NVIDIA")]  # second table ends after GPU 0's border
    with caplog.at_level(logging.WARNING, logger="phasescope.sources.replay"):
        g0, g1 = read(write("cut2.log", cut))
    assert len(g0) == 1 and len(g1) == 1
    assert any("cut off" in r.getMessage() for r in caplog.records)


def test_watch_header_gives_interval_and_time(write) -> None:  # type: ignore[no-untyped-def]
    gpu = [wide_gpu(0, "45C", "62W", "1234MiB", "35%")]
    text = "".join(
        f"Every 2.0s: nvidia-smi                          node7: Mon Dec  7 10:00:{2 * k:02d} 2026\n\n"
        + wide_block(None, gpu)
        for k in range(3)
    )
    (g0,) = read(write("watch.txt", text))
    assert g0.time.tolist() == [utc("2026-12-07 10:00:00") + 2 * k for k in range(3)]
    # Without any date the blocks are spaced by watch's 'Every Ns', or by interval=.
    bare = "".join("Every 2.0s: nvidia-smi\n\n" + wide_block(None, gpu) for _ in range(3))
    (s,) = read(write("bare.txt", bare))
    assert s.meta["clock"] == "sweep" and s.time.tolist() == [0, 2, 4]
    (s5,) = read(write("bare2.txt", wide_block(None, gpu) * 3), "nvidia-smi-table:interval=5")
    assert s5.time.tolist() == [0, 5, 10]


def test_bad_input_is_one_line_with_its_line(write) -> None:  # type: ignore[no-untyped-def]
    good = two_gpu_log(2)
    p = write("temp.log", good.replace("| N/A   45C", "| N/A   45F", 1))
    expect_input_error(read, p, match=("line 10", "'Temp'", "45F"))
    broken = good.replace("| N/A   45C", "| N/A  45C  P0  62W", 1)
    expect_input_error(read, write("row.log", broken), match=("line 10", "second row"))
    undated = good.replace("Mon Dec  7 10:00:01 2026", "", 1)
    expect_input_error(read, write("undated.log", undated), match=("date line before every table",))
    expect_input_error(
        table.read, write("none.txt", "no tables here\n"), match=("at least one nvidia-smi table",)
    )
    expect_input_error(read, write("opt.log", good), "nvidia-smi-table:gpus=2", match=("option 'gpus'",))
    # A file holding only a cut-off table has nothing to keep: an error, not a warning and no data.
    expect_input_error(read, write("only.log", good[:300]), match=("line 1", "one complete nvidia-smi table"))


def test_sniff_leaves_other_logs_alone(shared_data: Path) -> None:
    for f in sorted((shared_data / "formats").rglob("*")):
        if f.is_file():
            assert not table.sniff(f), f
