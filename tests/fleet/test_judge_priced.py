"""With prices set, a fleet without held-idle time wastes $0.00 (not "unpriced"), the hint names the fleet's
own price flags, and a held-idle GPU without a power reading has an unknown energy cost, not $0."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from phasescope.classify.model import PhaseModel
from phasescope.fleet.judge import HELD_IDLE, judge
from phasescope.fleet.summary import render, summary
from phasescope.kpi.cost import Prices
from phasescope.schema import Trace


def _rendered(verdicts: list) -> str:
    buf = io.StringIO()
    render(verdicts, Console(file=buf, width=200), show_devices=False)
    return buf.getvalue()


def test_priced_fleet_without_held_idle_wastes_zero(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    prices = Prices(usd_per_gpu_hour=2.5, usd_per_kwh=0.1)
    vs = [judge(fleet_traces[k], model, prices) for k in ("training", "inference")]
    assert all(v.seconds.get(HELD_IDLE, 0.0) == 0 for v in vs)
    assert [v.held_idle_cost.total_usd for v in vs] == [0.0, 0.0]
    assert summary(vs)["waste"]["held_idle_usd"] == 0.0
    assert "held-idle: 0.00 GPU-hours, 0.00 kWh, $0.00" in _rendered(vs)


def test_unpriced_hint_names_the_fleet_flags(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    out = _rendered([judge(fleet_traces["training"], model)])
    assert "--price-gpu-hour / --price-kwh" in out and "--usd-per" not in out


def test_held_idle_without_power_has_unknown_energy_cost(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    idle = fleet_traces["idle"].without("power")
    v = judge(idle, model, Prices(usd_per_gpu_hour=3.0, usd_per_kwh=0.1), held_mem_bytes=256 * 1024**2)
    assert v.label == HELD_IDLE
    assert v.held_idle_cost.energy_usd is None
    assert v.held_idle_cost.time_usd == pytest.approx(v.seconds[HELD_IDLE] / 3600 * 3.0)
