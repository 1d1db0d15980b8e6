"""`dcgmi dmon` output (`dcgmi dmon -e 155,203,252,100,150,1002,1003,1004,1005 -d 500 > log`), in the
layout DCGM prints: '#Entity' header with the fields' short names, an 'ID' line, 'GPU <id>' rows."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MHZ, MIB
from phasescope.sources.replay import dcgmi_dmon as dcgmi
from phasescope.sources.replay import detect, read
from tests.conftest import shared_data_dir
from tests.sources.replay.conftest import expect_input_error

HEADER = (
    "#Entity   POWER        GPUTL  FBUSD        SMCLK  TMPTR  SMACT        SMOCC        TENSO        DRAMA\n"
    "ID\n"
)


def rows(k: int) -> str:
    return (
        f"GPU 0     {62.5 + k:<12.3f} {35 + k:<6d} {1234 + k:<12d} 1410   45     0.{50 + k}0        "
        "0.310        0.120        0.200\n"
        "GPU 1     55.000       0      4            210    38     "
        "N/A          N/A          N/A          N/A\n"
    )


def log_text(n: int, header_every: int = 20) -> str:
    return "".join((HEADER if k % header_every == 0 else "") + rows(k) for k in range(n))


def test_two_gpus_fields_and_units(write, caplog) -> None:  # type: ignore[no-untyped-def]
    p = write("dmon.txt", log_text(4, header_every=2))  # the header comes back now and then
    assert detect(p) == "dcgmi-dmon"
    with caplog.at_level(logging.INFO, logger="phasescope.sources.replay"):
        g0, g1 = read(p, "dcgmi-dmon:interval=0.5")
    assert g0.device.index == 0 and g1.device.index == 1 and len(g0) == len(g1) == 4
    assert g0.time.tolist() == [0, 0.5, 1.0, 1.5] and g0.meta["clock"] == "sweep"
    assert g0["power"].tolist() == [62.5, 63.5, 64.5, 65.5]
    assert g0["gpu_util"].tolist() == pytest.approx([0.35, 0.36, 0.37, 0.38])
    assert g0["mem_used"][0] == 1234 * MIB and g0["sm_clock"][0] == 1410 * MHZ and g0["temperature"][0] == 45
    assert g0["sm_active"][0] == pytest.approx(0.5) and g0["tensor_active"][0] == pytest.approx(0.12)
    assert g0["dram_active"][0] == pytest.approx(0.2)
    assert np.isnan(g1["sm_active"]).all()  # N/A
    assert g0.meta["ignored_fields"] == ["SMOCC"]
    said = [r.getMessage() for r in caplog.records if "fields read" in r.getMessage()]
    assert len(said) == 1 and "POWER->power" in said[0] and "ignored (no phasescope signal): SMOCC" in said[0]


def test_old_layout_and_other_entities(write) -> None:  # type: ignore[no-untyped-def]
    text = (
        "# Entity  GRACT  TENSO  DRAMA\n"
        "      Id\n"
        "    GPU 0  0.812  0.402  0.330\n"
        "  GPU-I 1  0.400  0.200  0.100\n"
        "    GPU 0  0.790  0.398  0.310\n"
    )
    (g,) = read(write("old.txt", text))
    assert g["tensor_active"].tolist() == [0.402, 0.398] and g.meta["other_entity_rows"] == 1
    assert g.time.tolist() == [0, 1]  # dcgmi's default -d 1000


def test_cut_last_row_is_dropped_with_one_line(write, caplog) -> None:  # type: ignore[no-untyped-def]
    full = log_text(3)
    text = full[: full.rindex("GPU 1") + 12]  # the logger was killed mid-row
    with caplog.at_level(logging.WARNING, logger="phasescope.sources.replay"):
        g0, g1 = read(write("cut.txt", text))
    assert len(g0) == 3 and len(g1) == 2
    said = [r.getMessage() for r in caplog.records if "cut off" in r.getMessage()]
    assert len(said) == 1 and f"from line {full.count(chr(10))}" in said[0]


def test_bad_input_is_one_line_with_its_line(write) -> None:  # type: ignore[no-untyped-def]
    good = log_text(3)
    short = good.replace("0.310        0.120        0.200\n", "0.310\n", 1)
    expect_input_error(read, write("short.txt", short), match=("line 3", "9 values", "7 values"))
    bad = good.replace("1410 ", "fast ", 1)
    expect_input_error(read, write("bad.txt", bad), match=("line 3", "'SMCLK'", "fast"))
    changed = good + HEADER.replace("SMOCC", "PCITX")
    expect_input_error(read, write("changed.txt", changed), match=("line 9", "same fields"))
    expect_input_error(dcgmi.read, write("empty.txt", HEADER), match=("at least one 'GPU <id> ...' row",))
    expect_input_error(dcgmi.read, write("none.txt", "GPU 0 1 2\n"), match=("'#Entity", "header"))


def test_error_capture_is_still_refused() -> None:
    p = shared_data_dir() / "formats/dcgmi-dmon/NVIDIA__DCGM__issue-3_dmon-error.txt"
    if not p.is_file():
        pytest.skip("shared data not present")
    expect_input_error(read, p, match=("error line", "Error setting watches"))
    expect_input_error(read, p, "dcgmi-dmon", match=("line 3", "entity row"))


def test_sniff_leaves_other_logs_alone(shared_data: Path) -> None:
    for f in sorted((shared_data / "formats").rglob("*")):
        if f.is_file() and "dcgmi-dmon" not in f.parts:
            assert not dcgmi.sniff(f), f
