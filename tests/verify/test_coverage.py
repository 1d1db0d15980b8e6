from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.verify.coverage import coverage
from tests.verify._data import DUTY_SHAPING, labelled


def test_full_real_trace_is_covered(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    c = coverage(t, float(t.time[0]), float(t.time[-1]))
    assert c.samples == len(t) and c.gaps == 0 and c.covered_fraction == 1.0
    assert c.rate_hz == pytest.approx(1.0, rel=0.05)
    assert c.missing_signals == []


def test_a_cut_out_minute_is_a_named_gap(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    t0 = float(t.time[0])
    holed = t.take(~((t.time > t0 + 60) & (t.time < t0 + 120)))
    c = coverage(holed, t0, float(t.time[-1]))
    assert c.gaps == 1
    assert c.longest_gap_s == pytest.approx(60, abs=2.5)
    assert c.covered_fraction == pytest.approx(1 - 60 / (t.time[-1] - t0), abs=0.02)


def test_window_edges_without_samples_count_as_gaps(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    c = coverage(t, float(t.time[0]) - 100, float(t.time[-1]))
    assert c.gaps == 1 and c.gap_s == pytest.approx(100, abs=1.5)


def test_missing_signals_are_named(shared_data: Path) -> None:
    t = labelled(shared_data, DUTY_SHAPING).without("pcie_tx", "pcie_rx")
    c = coverage(t, float(t.time[0]), float(t.time[-1]))
    assert c.missing_signals == ["pcie_tx", "pcie_rx"]
    assert np.isfinite(c.rate_hz)


def test_ticks_without_any_reading_are_a_gap_not_coverage(shared_data: Path) -> None:
    """A lost GPU keeps its rows in a recording, all NaN ("its readings are NaN from now on"): that minute
    is a gap, as if the rows were not there, not covered time."""
    t = labelled(shared_data, DUTY_SHAPING)
    t0 = float(t.time[0])
    lost = (t.time > t0 + 60) & (t.time < t0 + 120)
    blank = t.with_columns(**{s: np.where(lost, np.nan, v) for s, v in t.columns.items()})
    c = coverage(blank, t0, float(t.time[-1]))
    assert c.samples == len(t) - int(lost.sum())
    assert c.gaps == 1 and c.longest_gap_s == pytest.approx(60, abs=2.5)
    assert c.covered_fraction == pytest.approx(1 - 60 / (t.time[-1] - t0), abs=0.02)
