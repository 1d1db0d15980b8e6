"""The one formatter of telemetry-only KPIs (views/kpis.py), on `trace_kpis` of real shared traces and on the
shapes it must handle: no rhythm, too few samples, another phase, activity counters."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phasescope.kpi.rhythm import trace_kpis
from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay import read
from phasescope.views.display import MISSING
from phasescope.views.kpis import kpi_items, kpi_note, kpi_text
from tests.live_helpers import TRAINING_RUN


def _trace(util: np.ndarray, **extra: np.ndarray) -> Trace:
    t = np.arange(util.size, dtype=float)
    return Trace(DeviceInfo("GPU-x"), t, {"gpu_util": util, "power": 100 + 200 * util, **extra})


def test_training_line_has_step_period_rate_and_stall(shared_data: Path) -> None:
    trace = read(shared_data / TRAINING_RUN)[0]
    kpis = trace_kpis(trace.take(trace.time >= trace.time[0] + 150), "training")
    line = kpi_text(kpis)
    period = kpis["step_period_s"]["value"]
    assert period is not None
    assert line.startswith("step ") and " · steps/h " in line and " · stall " in line
    assert f"stall {kpis['stall_fraction']['value'] * 100:.0f}%" in line
    (step,) = (i for i in kpi_items(kpis) if i.key == "step_period_s")
    assert "autocorrelation" in kpi_note(step) and "confidence" in kpi_note(step)


def test_no_rhythm_says_step_missing_and_keeps_the_stall() -> None:
    kpis = trace_kpis(_trace(np.full(200, 0.97)), "training")  # steady work: no peak stands out
    assert kpis["step_period_s"]["value"] is None
    assert kpi_text(kpis) == f"step {MISSING} · stall 3%"  # steps/h would only repeat the missing mark
    (step,) = (i for i in kpi_items(kpis) if i.key == "step_period_s")
    assert kpi_note(step).endswith(f"no value: {kpis['step_period_s']['reason']}")


def test_inference_line_and_saturation() -> None:
    bursts = np.tile([0.0, 0.0, 0.9, 0.9, 0.0, 0.0], 40)
    kpis = trace_kpis(_trace(bursts), "inference")
    assert kpi_text(kpis) == f"busy 30% · bursts/min {40 / 240 * 60:.3g} · headroom"
    flat = trace_kpis(_trace(np.full(200, 1.0)), "inference")
    assert kpi_text(flat).endswith(" · saturated")


def test_nothing_to_show_is_the_missing_mark_and_activity_is_labelled() -> None:
    assert kpi_text(None) == kpi_text({}) == MISSING
    assert kpi_text(trace_kpis(_trace(np.zeros(100)), "idle")) == MISSING
    few = trace_kpis(_trace(np.full(5, 0.9)), "training")
    assert "reason" in few and kpi_text(few) == MISSING and kpi_items(few) == []
    sm = np.full(100, 0.45)
    kpis = trace_kpis(_trace(np.zeros(100), sm_active=sm), "other")
    assert kpi_text(kpis) == "SM 45%"
    (item,) = kpi_items(kpis)
    assert item.name == "SM activity (MFU proxy)" and "not MFU" in kpi_note(item)
