"""CSV logs people write with their own scripts (format `csv`), and the forms of time, device and unit that
nvidia-smi-csv now shares with them: each log is hand-written here in the form people keep."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MIB
from phasescope.sources.replay import detect, read
from phasescope.sources.replay import generic_csv as gen
from tests.sources.replay.conftest import expect_input_error

LOGGER = "phasescope.sources.replay"
T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC).timestamp()

# A pynvml loop's log: own names with unit suffixes, ISO 8601 with Z, two GPUs, a column we do not read.
OWN = (
    "timestamp,gpu_index,utilization_gpu_percent,power_W,temperature_C,mem_used_mb,notes\n"
    "2024-05-01T10:00:00Z,0,35,120.5,45,1024,warmup\n"
    "2024-05-01T10:00:00Z,1,0,60.0,38,512,\n"
    "2024-05-01T10:00:01Z,0,40,130.0,46,2048,\n"
    "2024-05-01T10:00:01Z,1,1,61.0,38,512,\n"
)


def _said(caplog: pytest.LogCaptureFixture, word: str) -> str:
    (line,) = [r.getMessage() for r in caplog.records if word in r.getMessage()]
    assert "\n" not in line
    return line


def test_own_names_units_iso_z_and_a_device_column(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    p = write("gpu_log.csv", OWN)
    assert detect(p) == "csv"
    with caplog.at_level("WARNING", logger=LOGGER):
        a, b = read(p)
    assert (a.device.index, b.device.index) == (0, 1) and a.meta["format"] == "csv"
    assert a.time.tolist() == [T0, T0 + 1] and a.meta["clock"] == "unix"
    assert a["gpu_util"].tolist() == pytest.approx([0.35, 0.40]) and a["power"].tolist() == [120.5, 130.0]
    assert a["temperature"].tolist() == [45, 46] and a["mem_used"].tolist() == [1024 * MIB, 2048 * MIB]
    assert b["gpu_util"].tolist() == pytest.approx([0.0, 0.01]) and b["power"][1] == 61.0
    said = _said(caplog, "read as a CSV log")
    for part in ("time 'timestamp' (ISO 8601 with a UTC offset)", "index 'gpu_index'",
                 "gpu_util 'utilization_gpu_percent'", "power 'power_W'", "mem_used 'mem_used_mb'",
                 "ignored: 'notes'"):
        assert part in said, (part, said)


@pytest.mark.parametrize(
    "stamps",
    [
        ["2024-05-01T12:00:00+02:00", "2024-05-01T12:00:01.5+02:00"],  # offset with colon
        ["2024-05-01 12:00:00+0200", "2024-05-01 12:00:01.500+0200"],  # space, offset without colon
        ["2024-05-01T05:00:00-05", "2024-05-01T05:00:01.5-05"],  # hours only
        ["2024-05-01T10:00:00.000000000Z", "2024-05-01T10:00:01.500000000Z"],  # nanoseconds
        ["2024-05-01 10:00:00", "2024-05-01 10:00:01.5"],  # no zone: read as UTC
        ["2024/05/01 10:00:00.000", "2024/05/01 10:00:01.500"],  # nvidia-smi's own
    ],
)
def test_iso_8601_forms(write, stamps: list[str]) -> None:  # type: ignore[no-untyped-def]
    p = write("t.csv", "time,gpu_util,power\n" + "".join(f"{s},5,70\n" for s in stamps))
    (t,) = read(p)
    assert t.time.tolist() == [T0, T0 + 1.5]


def test_date_and_time_columns_are_one_stamp(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    p = write("dt.csv", "Date,Time,GPU Util (%),Power (W),Fan\n2024-05-01,10:00:00,5,70,30\n"
                        "2024-05-01,10:00:01.5,6,71,30\n")
    with caplog.at_level("WARNING", logger=LOGGER):
        (t,) = read(p)
    assert t.time.tolist() == [T0, T0 + 1.5] and t.meta["timezone"] == "UTC (assumed: no zone in the file)"
    said = _said(caplog, "read as a CSV log")
    assert "time 'Date+Time' (ISO 8601 without a zone, read as UTC)" in said and "ignored: 'Fan'" in said


def test_iso_offsets_in_an_nvidia_smi_header_file(write) -> None:  # type: ignore[no-untyped-def]
    """`nvidia-smi --query-gpu` fields, timestamps rewritten by a wrapper script into ISO with an offset."""
    p = write(
        "q.csv",
        "timestamp, index, power.draw [W], utilization.gpu [%]\n"
        "2024-05-01T12:00:00+02:00, 0, 100.5 W, 5 %\n"
        "2024-05-01T12:00:01+02:00, 0, 101.0 W, 6 %\n",
    )
    assert detect(p) == "nvidia-smi-csv"
    (t,) = read(p)
    assert t.time.tolist() == [T0, T0 + 1] and t.meta["timezone"] == "from the file (UTC offsets)"


@pytest.mark.parametrize(
    ("header", "values", "form"),
    [
        ("epoch", [T0, T0 + 0.5], "Unix time in s"),
        ("epoch", [T0 * 1e3, T0 * 1e3 + 500], "Unix time in ms"),
        ("timestamp", [T0 * 1e6, T0 * 1e6 + 5e5], "Unix time in us"),
        ("ts", [T0 * 1e9, T0 * 1e9 + 5e8], "Unix time in ns"),
        ("time_ms", [T0 * 1e3, T0 * 1e3 + 500], "Unix time in ms"),
    ],
)
def test_epoch_seconds_ms_us_ns(write, caplog: pytest.LogCaptureFixture, header: str, values: list[float],  # type: ignore[no-untyped-def]
                                form: str) -> None:
    p = write("e.csv", f"{header},gpu_util,power_W\n" + "".join(f"{v:.1f},5,70\n" for v in values))
    with caplog.at_level("WARNING", logger=LOGGER):
        (t,) = read(p)
    assert t.time.tolist() == pytest.approx([T0, T0 + 0.5], abs=1e-6) and t.meta["clock"] == "unix"
    assert f"({form})" in _said(caplog, "read as a CSV log")


@pytest.mark.parametrize(("header", "step"), [("elapsed", 0.5), ("elapsed_ms", 500), ("time_s", 0.5)])
def test_relative_seconds(write, header: str, step: float) -> None:  # type: ignore[no-untyped-def]
    p = write("r.csv", f"{header},gpu_util,power\n" + "".join(f"{k * step},{k},70\n" for k in range(4)))
    (t,) = read(p)
    assert t.time.tolist() == [0.0, 0.5, 1.0, 1.5] and t.meta["clock"] == "relative"


def test_units_in_brackets_parentheses_and_values(write) -> None:  # type: ignore[no-untyped-def]
    p = write(
        "u.csv",
        "Time,GPU Util [%],Power (mW),Mem Used (GiB),SM Clock (GHz),gpu_temp\n"
        "0,41%,250000,2,1.41,70 C\n"
        "1,42 %,251000,2.5,1.395,71 C\n",
    )
    (t,) = read(p)
    assert t["gpu_util"].tolist() == pytest.approx([0.41, 0.42]) and t["power"].tolist() == [250.0, 251.0]
    assert t["mem_used"].tolist() == [2 * 1024**3, 2.5 * 1024**3]
    assert t["sm_clock"].tolist() == pytest.approx([1.41e9, 1.395e9]) and t["temperature"][1] == 71


def test_unit_only_in_the_values(write) -> None:  # type: ignore[no-untyped-def]
    # 'memory used' says no unit; its values say GiB, not the MiB nvidia-smi would print.
    p = write("v.csv", "time,gpu_util,memory used\n0,5,1.5 GiB\n1,6,2 GiB\n")
    (t,) = read(p)
    assert t["mem_used"].tolist() == [1.5 * 1024**3, 2 * 1024**3]


@pytest.mark.parametrize(("delimiter", "name"), [("\t", "tab.tsv"), (";", "semi.csv")])
def test_tab_and_semicolon(write, delimiter: str, name: str) -> None:  # type: ignore[no-untyped-def]
    rows = [["time", "gpu", "gpu_util", "power_W"], ["0", "0", "10", "70.5"], ["0", "1", "20", "80"],
            ["1", "0", "30", "90"], ["1", "1", "40", "100"]]
    p = write(name, "".join(delimiter.join(r) + "\n" for r in rows))
    a, b = read(p)
    assert a["power"].tolist() == [70.5, 90.0] and b["gpu_util"].tolist() == pytest.approx([0.2, 0.4])


@pytest.mark.parametrize(
    ("column", "values", "index", "uuid"),
    [
        ("gpu_id", ["GPU-1a2b3c4d-0000", "GPU-1a2b3c4d-0000"], None, "GPU-1a2b3c4d-0000"),
        ("device", ["cuda:3", "cuda:3"], 3, "file:d#3"),
        ("gpu", ["GPU 2", "GPU 2"], 2, "file:d#2"),
        ("uuid", ["GPU-ffff-1", "GPU-ffff-1"], 0, "GPU-ffff-1"),
        ("bus_id", ["00000000:81:00.0", "00000000:81:00.0"], 0, "file:d#0"),
    ],
)
def test_device_columns(write, column: str, values: list[str], index: int | None, uuid: str) -> None:  # type: ignore[no-untyped-def]
    p = write("d.csv", f"time,{column},gpu_util\n" + "".join(f"{k},{v},5\n" for k, v in enumerate(values)))
    (t,) = read(p)
    assert (t.device.index, t.device.uuid, len(t)) == (index, uuid, 2)


def test_no_device_column_interleaved_gpus_by_sweep(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    rows = []
    for k in range(30):  # 3 GPUs a few ms apart, a sweep every second
        rows += [f"{1714557600 + k + g * 0.002:.3f},{g * 10},{100 + g}" for g in range(3)]
    p = write("i.csv", "unix_time,gpu_util,power\n" + "\n".join(rows) + "\n")
    with caplog.at_level("WARNING", logger=LOGGER):
        traces = read(p)
    assert [t["power"][0] for t in traces] == [100, 101, 102] and {len(t) for t in traces} == {30}
    assert "no device column: 3 GPUs, row by row" in _said(caplog, "read as a CSV log")


def test_wide_log_one_column_per_gpu(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    p = write(
        "wide.csv",
        "time,gpu0_util,gpu0_power_W,GPU 1 Util (%),GPU 1 Power (W),power_w_gpu2,total_power\n"
        "0,10,100,20,200,50,350\n"
        "1,11,101,,201,51,353\n",
    )
    with caplog.at_level("WARNING", logger=LOGGER):
        g0, g1, g2 = read(p)
    assert [t.device.index for t in (g0, g1, g2)] == [0, 1, 2] and g0.time.tolist() == [0.0, 1.0]
    assert g0["gpu_util"].tolist() == pytest.approx([0.10, 0.11]) and g0["power"].tolist() == [100, 101]
    assert g1["gpu_util"][0] == pytest.approx(0.2) and np.isnan(g1["gpu_util"][1]) and g1["power"][1] == 201
    assert g2["power"].tolist() == [50, 51] and not g2.has("gpu_util")
    said = _said(caplog, "read as a CSV log")
    assert "power 'gpu0_power_W, GPU 1 Power (W), power_w_gpu2'" in said and "ignored: 'total_power'" in said


def test_wide_log_with_two_units_for_one_signal(write) -> None:  # type: ignore[no-untyped-def]
    p = write("wide.csv", "time,gpu0_power [W],gpu1_power [mW]\n0,100,200000\n")
    expect_input_error(read, p, match=(str(p), "'gpu0_power [W]' and 'gpu1_power [mW]'",
                                       "one unit for power on every GPU"))


def test_pandas_index_column_is_ignored(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    p = write("pd.csv", ",time,gpu_util,power\n0,0.0,5,70\n1,1.0,6,71\n")
    with caplog.at_level("WARNING", logger=LOGGER):
        (t,) = read(p)
    assert t["power"].tolist() == [70, 71]
    assert "ignored: (unnamed)" in _said(caplog, "read as a CSV log")


def test_the_table_prefers_average_power_and_the_first_of_two_synonyms(write) -> None:  # type: ignore[no-untyped-def]
    p = write("two.csv", "time,gpu_power,power_draw,util\n0,10,20,5\n")
    (t,) = read(p)
    assert t["power"][0] == 10  # file order between two synonyms


def test_cut_last_line_keeps_every_complete_row(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    p = write("cut.csv", OWN + "2024-05-01T10:00:0")
    with caplog.at_level("WARNING", logger=LOGGER):
        a, b = read(p)
    assert len(a) == len(b) == 2
    said = _said(caplog, "not read")
    assert f"{p}: 1 row(s) cut off or malformed, not read (4 read): line 6 (the last, cut off" in said


def test_cut_inside_the_last_value(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """Every field is there but the last lost its unit ('41 %' cut to '4'): cut, not 4 %."""
    text = "time, power [W], util [%]\n0, 100 W, 41 %\n1, 101 W, 42 %\n2, 102 W, 4"
    with caplog.at_level("WARNING", logger=LOGGER):
        (t,) = read(write("v.csv", text))
    assert t["gpu_util"].tolist() == pytest.approx([0.41, 0.42])
    assert "the last line (data row 3), cut off inside its last value ' 4'" in _said(caplog, "not read")
    (whole,) = read(write("w.csv", text + " %"))  # no line break, but whole: read
    assert whole["gpu_util"][-1] == pytest.approx(0.04)


def test_restarted_logger_repeats_its_header(write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    head, *rows = OWN.splitlines(keepends=True)
    with caplog.at_level("WARNING", logger=LOGGER):
        a, _b = read(write("again.csv", head + rows[0] + rows[1] + head + rows[2] + rows[3]))
    assert a["power"].tolist() == [120.5, 130.0]
    assert "data row 3 (the header again)" in _said(caplog, "not read")


def test_many_malformed_rows_are_refused(write) -> None:  # type: ignore[no-untyped-def]
    p = write("bad.csv", "time,gpu_util,power\n0,1,2\n1,2\n2,3,4,5\n3,4,5\n")
    expect_input_error(read, p, match=(str(p), "line 3 (2 fields)", "2 of 4 rows malformed"))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("time,power [MiB]\n0,1\n", ("header field 'power'", "a unit among w, watts", "got 'mib'")),
        ("time,gpu_util\n2024-05-01T10:00:00Z,5\nyesterday,6\n",
         ("row 2, field 'time'", "an ISO 8601 time with a zone", "yesterday")),
        ("time,gpu_util\n2024-05-01T10:00:00,5\n2024-05-01T10:00:01,6\n2024-05-01T10:00:0x,7\n",
         ("row 3, field 'time'", "a timestamp like", "2024-05-01T10:00:0x")),
        ("time,gpu_util\n0,5\n1,\n2,six\n", ("row 3, field 'gpu_util'", "a number", "six")),
        ("time,gpu_id,gpu_util\n0,0,5\n1,A100 #2,5\n", ("row 2, field 'gpu_id'", "a GPU index", "A100 #2")),
        ("time,gpu_util\n0,5\n1.5x,6\n", ("row 2, field 'time'", "a number", "1.5x")),
    ],
)
def test_bad_input_is_one_line(write, text: str, match: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    p = write("bad.csv", text)
    expect_input_error(read, p, match=(str(p), *match))


@pytest.mark.parametrize(
    "text",
    [
        "date,open,high,low,close,volume\n2024-01-02,187.15,188.44,183.89,185.64,82488700\n",
        "time,temperature,humidity\n2024-01-02T00:00:00,12.5,80\n",  # a weather station, not a GPU
        "Timestamp,Phase,Runtime (s),GPU Energy (uJ),Batch Size\n1712155974.4,tokenizer,0.3,9235000,32\n",
        "Dear diary, today the GPU was warm.\nIt drew power, I think.\n",
    ],
)
def test_not_telemetry_is_refused_in_one_line(write, text: str) -> None:  # type: ignore[no-untyped-def]
    p = write("other.csv", text)
    expect_input_error(detect, p, match=(str(p), "format", "unrecognised content"))
    assert not gen.sniff(p)


def test_the_name_csv_forces_it_and_takes_the_options(write) -> None:  # type: ignore[no-untyped-def]
    p = write("o.csv", "gpu_util,power_W\n5,70\n6,71\n")  # no time column: interval gives it
    (t,) = read(p, "csv:interval=2")
    assert t.time.tolist() == [0.0, 2.0] and t.meta["clock"] == "sweep"
    expect_input_error(read, p, "csv:speed=2", match=("option 'speed'", "columns, gpus, interval"))


def test_real_nvidia_smi_log_reads_the_same_as_csv(shared_data: Path) -> None:
    """The same file by either name: one parser."""
    p = shared_data / "nvidia-smi-h100-training/ckpt1.csv"
    by_smi, by_csv = read(p), read(p, "csv")
    assert len(by_smi) == len(by_csv) == 8
    assert all(np.array_equal(a.time, b.time) and np.array_equal(a["power"], b["power"])
               for a, b in zip(by_smi, by_csv, strict=True))
