"""The HTML page: self-contained (no network), and it says what the data says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel
from phasescope.kpi.cost import Prices
from phasescope.report import build, render
from phasescope.report.page import decimate
from phasescope.sources.replay import read
from phasescope.views.palette import FAVICON
from tests.live_helpers import TRAINING_RUN

# Real files of four formats: SensorGuard CSV, 8x H100 nvidia-smi at 10 Hz, SPAR Parquet, nvidia-smi dmon.
FILES = (
    TRAINING_RUN,
    "nvidia-smi-h100-training/ckpt100.csv",
    "spar-a100/blender_bmw_NVIDIA_A100_SXM4_40GB_6f9cd9b4_20260309_183828.parquet",
    "formats/nvidia-smi-dmon/iamwavecut__OrbitQuant__rtx-pro-6000-kernel-bench_dmon-15s.txt",
)
REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", re.IGNORECASE)
REMOTE_ANY = re.compile(r"<(link|img|iframe)[^>]*\b(href|src)\s*=\s*[\"']?(https?:)?//", re.IGNORECASE)


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


@pytest.mark.parametrize("rel", FILES)
def test_page_is_self_contained_and_shows_the_phases(shared_data: Path, model: PhaseModel, rel: str) -> None:
    path = str(shared_data / rel)
    data = build([(path, read(path))], model=model, prices=Prices(usd_per_gpu_hour=2.5))
    page = render(data)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert not REMOTE_SCRIPT.search(page) and not REMOTE_ANY.search(page)
    assert "Plotly.newPlot" in page and "plotly.js" in page[:200_000]  # the library itself is inline
    assert FAVICON in page.split("</head>")[0]
    for d in data.devices:
        assert f"data-phase='{d.label}'" in page  # every device's phase is on the page as a badge
    for i in range(len(data.devices)):
        assert f"id='dev{i}'" in page and f'id="fig{i}"' in page
    labels = {s.label for d in data.devices for s in d.segments}
    assert labels and all(f"data-phase='{lab}'" in page for lab in labels)
    assert "Energy and cost per phase" in page and "$" in page


def test_decimate_keeps_spikes_gaps_and_bounds_the_size(shared_data: Path) -> None:
    trace = read(shared_data / FILES[1])[0]  # 6,804 samples at 10 Hz
    t, v = trace.time, trace["power"].copy()
    v[1000:1500] = np.nan  # a gap must stay a gap
    td, vd = decimate(t, v, max_points=1000)
    assert len(td) <= 1000 and np.all(np.diff(td) > 0)
    assert np.nanmax(vd) == np.nanmax(v) and np.nanmin(vd) == np.nanmin(v)
    assert np.isnan(vd[(td >= t[1000]) & (td < t[1500])]).all()
    t2, v2 = decimate(t[:500], v[:500], max_points=1000)  # short enough: unchanged
    assert np.array_equal(t2, t[:500]) and np.array_equal(v2, v[:500], equal_nan=True)


def test_unknown_segments_say_why(shared_data: Path, model: PhaseModel) -> None:
    """Alibaba's production pods are sampled once a minute, coarser than the model is validated for: the
    report says unknown, and why, instead of guessing."""
    path = str(shared_data / "alibaba-gentd26" / "pod_gpu_duty_cycle_anon.csv")
    data = build([(path, read(path)[:2])], model=model)
    assert all(d.label == "unknown" for d in data.devices)
    page = render(data)
    reason = data.devices[0].pred.reasons[0]  # type: ignore[union-attr]
    assert "data-phase='unknown'" in page and reason.startswith("sample interval") and reason in page


def test_phase_totals_average_power_over_measured_time_only(shared_data: Path) -> None:
    """A device without a power reading adds held time to the fleet's phase totals, not "0 W": the mean
    power is the measured energy over the measured seconds, and kWh with nothing measured is a dash."""
    from dataclasses import replace

    from phasescope.report.page import _phase_totals
    from phasescope.schema import Trace

    path = str(shared_data / FILES[2])
    (powered,) = read(path)
    blind = powered.without("power", "energy")
    blind = Trace(replace(blind.device, uuid="GPU-no-power-sensor"), blind.time, blind.columns, blind.meta)
    both = build([(path, [powered, blind])], model=None)
    mean_w = both.devices[0].energy.mean_power_w
    # Without a model no segment claims the time: it is "unknown", the one word every view uses for time not
    # judged (views/palette.py; it read "unsegmented" here while the dashboard said "unknown").
    row = re.search(r"unknown</span></td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>",
                    _phase_totals(both))
    assert row is not None and row.group(3) == f"{mean_w:,.0f} W"  # not half of it
    only_blind = build([(path, [blind])], model=None)
    row = re.search(r"unknown</span></td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>",
                    _phase_totals(only_blind))
    assert row is not None and row.group(2) == "–" and row.group(3) == "–"


def test_a_trace_without_power_shows_no_made_up_zero_kwh(shared_data: Path) -> None:
    """A trace with neither power nor an energy counter has unknown energy: every table says "–", not
    "0.0000 kWh" (the summary, the device's KPIs and its per-phase table, as the fleet totals already did)."""
    from phasescope.report.page import _kpis, _phase_table, _summary

    path = str(shared_data / FILES[2])
    blind = read(path)[0].without("power", "energy")
    data = build([(path, [blind])], model=None)
    for html in (_summary(data), _kpis(data.devices[0]), _phase_table(data.devices[0])):
        assert "0.0000 kWh" not in html and "– kWh" in html


def test_a_phase_without_power_on_a_metered_gpu_has_no_made_up_energy_cost(shared_data: Path) -> None:
    import numpy as np

    from phasescope.kpi.cost import Prices
    from phasescope.report.data import device_report, load_model
    from phasescope.schema import Trace
    from phasescope.sources.replay import read

    path = shared_data / "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"
    (tr,) = read(path)
    model, _ = load_model()
    prices = Prices(usd_per_gpu_hour=None, usd_per_kwh=0.12)
    (seg,) = [s for s in device_report(tr, "x", model, prices).segments if s.label == "training"]
    cols = dict(tr.columns)
    dark = (tr.time >= seg.start - 1) & (tr.time <= seg.end + 1)
    for sig in ("power", "energy"):
        if sig in cols:
            cols[sig] = np.where(dark, np.nan, np.asarray(cols[sig], dtype=np.float64))
    d = device_report(Trace(tr.device, tr.time, cols, tr.meta), "x", model, prices)
    assert d.energy.method != "none" and d.energy.phases["training"].covered_s == 0
    assert d.phase_cost["training"].energy_usd is None  # was 0.0
