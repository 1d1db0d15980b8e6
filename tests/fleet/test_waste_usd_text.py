"""The held-idle cost line of `phasescope fleet` (text and the --serve page) says why a cost is unknown: with
only a $/kWh price, held-idle time without a power reading is unmeasured energy, not "no price set", and
--price-kwh (already set) cannot price it; a sum that leaves GPUs out says so."""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import pytest
from rich.console import Console

from phasescope.classify.model import PhaseModel
from phasescope.fleet.collect import FetchStats
from phasescope.fleet.judge import HELD_IDLE, DeviceVerdict, judge
from phasescope.fleet.scan import ScanOptions, ScanResult
from phasescope.fleet.service import FleetService
from phasescope.fleet.summary import render
from phasescope.kpi.cost import Prices
from phasescope.schema import Trace
from phasescope.serve.fleet_app import page_html

KWH_ONLY = Prices(usd_per_kwh=0.1)
HELD = 256 * 1024**2  # the idle trace holds more than this: its idle time counts as held


def _rendered(verdicts: list[DeviceVerdict]) -> str:
    """The held-idle line of the text output."""
    buf = io.StringIO()
    render(verdicts, Console(file=buf, width=250), show_devices=False)
    return next(line for line in buf.getvalue().splitlines() if line.startswith("held-idle:"))


def _blind(trace: Trace, uuid: str) -> Trace:
    t = trace.without("power", "energy")
    return Trace(replace(t.device, uuid=uuid), t.time, t.columns, t.meta)


def test_a_kwh_price_and_unmeasured_held_idle_is_not_told_to_set_a_price(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    v = judge(_blind(fleet_traces["idle"], "GPU-blind"), model, KWH_ONLY, held_mem_bytes=HELD)
    assert v.label == HELD_IDLE and v.seconds[HELD_IDLE] > 0
    assert v.held_idle_cost.total_usd is None  # energy unmeasured, and no $/GPU-hour for the time part
    out = _rendered([v])
    assert "--price-kwh" not in out  # it is set: asking for it again misleads
    assert "cost unknown: held-idle energy unmeasured (no power reading)" in out
    assert "set --price-gpu-hour to price its time" in out


def test_unpriced_still_asks_for_either_price(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    v = judge(_blind(fleet_traces["idle"], "GPU-blind"), model, None, held_mem_bytes=HELD)
    assert v.label == HELD_IDLE
    out = _rendered([v])
    assert "(set --price-gpu-hour / --price-kwh to price it)" in out and "unmeasured" not in out


def test_a_sum_that_leaves_a_gpu_out_says_so(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    """One held-idle GPU with power (priced by kWh) and one without: the $ is the first's alone, and the line
    says a GPU of unknown cost is not in it (it read as the whole fleet's waste)."""
    idle = fleet_traces["idle"]
    metered = judge(idle, model, KWH_ONLY, held_mem_bytes=HELD)
    blind = judge(_blind(idle, "GPU-blind"), model, KWH_ONLY, held_mem_bytes=HELD)
    usd = metered.held_idle_cost.total_usd
    assert usd is not None and usd > 0 and blind.held_idle_cost.total_usd is None
    out = _rendered([metered, blind])
    assert f", ${usd:,.2f} plus 1 GPU(s) of unknown cost (held-idle energy unmeasured" in out
    assert f"${usd:,.2f}" in _rendered([metered]) and "unknown" not in _rendered([metered])


def test_the_serve_page_says_the_same(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    vs = [judge(_blind(fleet_traces["idle"], "GPU-blind"), model, KWH_ONLY, held_mem_bytes=HELD)]
    result = ScanResult(
        0.0, 1.0, vs, FetchStats(devices=1), 0.1, 0.1, model.version, "", wall_s=0.2, workers=1
    )

    def fake_scan(opts: ScanOptions, **kw: Any) -> ScanResult:
        return result

    svc = FleetService(ScanOptions(url="http://p:9090"), 60, model=model, scan_fn=fake_scan)
    svc.run_once()
    page = page_html(svc)
    assert "no prices set" not in page
    assert "cost unknown: held-idle energy unmeasured (no power reading)" in page


@pytest.mark.parametrize(
    "prices", [Prices(usd_per_gpu_hour=3.0), Prices(usd_per_gpu_hour=3.0, usd_per_kwh=0.1)]
)
def test_an_hour_price_prices_unmeasured_held_idle(
    fleet_traces: dict[str, Trace], model: PhaseModel, prices: Prices
) -> None:
    v = judge(_blind(fleet_traces["idle"], "GPU-blind"), model, prices, held_mem_bytes=HELD)
    usd = v.held_idle_cost.total_usd
    assert usd == pytest.approx(v.seconds[HELD_IDLE] / 3600 * 3.0)
    out = _rendered([v])
    assert f", ${usd:,.2f}" in out and "unknown" not in out and "set --price" not in out
