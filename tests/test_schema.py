"""Trace bookkeeping the classifier and reports rely on: which signals are missing, and how much of each."""

from __future__ import annotations

import numpy as np
import pytest

from phasescope.schema import PAPER_SIGNALS, DeviceInfo, Trace


def test_an_all_nan_column_is_missing_not_present() -> None:
    t = Trace(DeviceInfo("GPU-x"), np.arange(4.0), {"power": np.full(4, np.nan), "gpu_util": [0.1] * 4})
    assert not t.has("power") and t.has("gpu_util")
    assert t.present_signals() == ["gpu_util"]
    assert t.missing_signals() == [s for s in PAPER_SIGNALS if s != "gpu_util"]


def test_missing_fraction_counts_nan_samples() -> None:
    cols = {"power": [1.0, np.nan, np.nan, 2.0], "gpu_util": [0.1] * 4}
    t = Trace(DeviceInfo("GPU-x"), np.arange(4.0), cols)
    frac = t.missing_fraction()
    assert frac["power"] == pytest.approx(0.5) and frac["gpu_util"] == 0.0 and frac["temperature"] == 1.0


def test_rate_ignores_repeated_timestamps() -> None:
    t = Trace(DeviceInfo("GPU-x"), [0.0, 0.0, 1.0, 1.0, 2.0, 2.0], {"power": [1.0] * 6})
    assert t.rate_hz() == 1.0


def test_slice_is_inclusive_and_concat_is_in_time_order() -> None:
    dev = DeviceInfo("GPU-x")
    t = Trace(dev, np.arange(5.0), {"power": np.arange(5.0) * 10})
    assert t.slice_time(1.0, 3.0).time.tolist() == [1.0, 2.0, 3.0]
    joined = Trace.concat([t.slice_time(3.0, 4.0), t.slice_time(0.0, 2.0)])
    assert joined.time.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert joined["power"].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_rows_with_data_are_those_with_any_finite_signal() -> None:
    t = Trace(DeviceInfo("GPU-x"), [0.0, 1.0, 2.0, 3.0],
              {"power": [1.0, np.nan, np.nan, 2.0], "gpu_util": [np.nan, np.nan, 0.5, np.nan]})
    assert t.rows_with_data().tolist() == [True, False, True, True]
    assert Trace(DeviceInfo("GPU-x"), [0.0, 1.0]).rows_with_data().tolist() == [False, False]
