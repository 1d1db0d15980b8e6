"""The helpers the readers share (_common): each reader relies on their exact behaviour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from phasescope.errors import InputError
from phasescope.sources.replay import read
from phasescope.sources.replay._common import (
    arrow_all,
    dictionary_codes,
    drop_cut_last_line,
    head_lines,
    require_finite,
)
from tests.sources.replay.conftest import expect_input_error


def test_require_finite_names_first_bad_row_one_based() -> None:
    require_finite(np.array([1.0, 2.0]), "f.csv", "t", "a number", "empty")  # all finite: no error
    with pytest.raises(InputError) as info:
        require_finite(np.array([1.0, np.nan, np.inf]), "f.csv", "t", "a number", "empty")
    assert str(info.value) == "f.csv: row 2, field 't': expected a number, got 'empty'"


def test_require_finite_maps_through_file_rows() -> None:
    rows = np.array([3, 7, 9])
    with pytest.raises(InputError, match=r"row 8, field 'ts'"):
        require_finite(np.array([0.0, np.nan, np.nan]), "f.csv", "ts", "a number", "empty", rows=rows)


def test_dictionary_codes_first_seen_order_over_chunks_and_nulls() -> None:
    col = pa.chunked_array([["b", "a", None], ["a", "c", "b"]], pa.string())
    codes, values = dictionary_codes(col)
    assert values == ["b", "a", "", "c"]
    assert codes.dtype == np.int64
    assert [values[c] for c in codes] == ["b", "a", "", "a", "c", "b"]


def test_arrow_all_reads_null_as_false_and_empty_as_true() -> None:
    assert arrow_all(pa.array([True, True]))
    assert not arrow_all(pa.array([True, None]))
    assert not arrow_all(pa.array([True, False]))
    assert arrow_all(pa.array([], pa.bool_()))


def test_head_lines_drops_bom_and_reads_only_the_head(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_bytes(b"\xef\xbb\xbfa,b\r\n1,2\r\n" + b"3,4\n" * 100)
    assert head_lines(p, 12) == ["a,b", "1,2"]
    assert len(head_lines(p)) == 102


# An nvidia-smi log as energy-inference's: `nvidia-smi --query-gpu=... --format=csv -lms 100 -f log.csv`.
SMI_HEADER = "timestamp, power.draw [W], utilization.gpu [%], utilization.memory [%]"
SMI_ROWS = [
    "2024/03/29 11:16:49.355, 24.53 W, 0 %, 0 %",
    "2024/03/29 11:16:49.455, 60.10 W, 35 %, 12 %",
    "2024/03/29 11:16:49.555, 61.20 W, 36 %, 13 %",
]


def _log(tmp_path: Path, name: str, lines: list[str], tail: str = "", newline: str = "\n") -> Path:
    p = tmp_path / name
    p.write_bytes((newline.join([SMI_HEADER, *lines]) + newline + tail).encode())
    return p


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_log_cut_mid_line_loses_only_that_line(tmp_path: Path, newline: str) -> None:
    """A logger killed mid-write leaves a last line without its line break and short of fields: that line
    goes, every complete row stays; a complete last line without a line break is a row like any other."""
    for i, tail in enumerate(("20", "2024/03/29 11:16:49.6", "2024/03/29 11:16:49.655, 62.0 W, 3")):
        (trace,) = read(_log(tmp_path, f"cut{i}.csv", SMI_ROWS, tail, newline))
        assert trace["power"].tolist() == [24.53, 60.10, 61.20], tail
        assert trace["gpu_util"].tolist() == pytest.approx([0.0, 0.35, 0.36]), tail
    whole = tmp_path / "whole.csv"
    whole.write_bytes(newline.join([SMI_HEADER, *SMI_ROWS]).encode())  # no line break after the last row
    (trace,) = read(whole)
    assert trace["power"].tolist() == [24.53, 60.10, 61.20] and trace["mem_util"][-1] == pytest.approx(0.13)


def test_a_short_line_inside_a_log_is_dropped_naming_its_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A logger killed and started again (`>>`) leaves a cut line inside the log: it goes, with one line that
    # names line 4 (a piece of every line before it, so not the first line it is found in). Many such lines
    # are no longer damage but another layout: an error naming the first.
    rows = [*SMI_ROWS[:2], "2024/03/29 11:16", SMI_ROWS[2]]
    for tail in ("", "2024/03/29 11:16:49.6"):
        p = _log(tmp_path, "middle.csv", rows, tail)
        caplog.clear()
        with caplog.at_level("WARNING", logger="phasescope.sources.replay"):
            (trace,) = read(p)
        assert trace["power"].tolist() == [24.53, 60.10, 61.20]
        (said,) = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
        assert str(p) in said and "line 4 (1 fields)" in said and "\n" not in said
    p = _log(tmp_path, "ragged.csv", [SMI_ROWS[0], "2024/03/29 11:16", "1, 2", SMI_ROWS[1]])
    expect_input_error(read, p, match=(str(p), "line 3", "2 of 4 rows malformed"))


def test_drop_cut_last_line_bytes() -> None:
    assert drop_cut_last_line(b"a,b\n1,2\n3", ",", 2) == b"a,b\n1,2\n"
    assert drop_cut_last_line(b"a,b\n1,2\n3,4", ",", 2) == b"a,b\n1,2\n3,4"  # complete: kept
    assert drop_cut_last_line(b"a,b\n1,2\n", ",", 2) == b"a,b\n1,2\n"
    assert drop_cut_last_line(b"a,b", ",", 3) == b"a,b"  # one line only: nothing to fall back on
    assert drop_cut_last_line(b"", ",", 2) == b""


def test_a_long_digit_run_is_told_from_a_number_in_linear_time() -> None:
    # `\d+\.?\d*` let Python's re try every split of a digit run: 43 s for 20000 digits and a letter.
    import time

    from phasescope.sources.replay._common import is_number

    t0 = time.perf_counter()
    assert not is_number("9" * 20_000 + "x")
    assert time.perf_counter() - t0 < 1.0
    assert [is_number(x) for x in ("1", "1.", "1.5", ".5", "-1e5", "+.5E2", "1..5", ".", "e5", "1e")] == [
        True, True, True, True, True, True, False, False, False, False,
    ]
