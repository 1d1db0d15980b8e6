"""The helpers the readers share (_common): each reader relies on their exact behaviour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from phasescope.errors import InputError
from phasescope.sources.replay._common import arrow_all, dictionary_codes, head_lines, require_finite


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
