"""The live views price a MIG GPU once, by the rule `cost` and `report` use (kpi/cost.py `mig_prices`):
one A100 in 2 MIG instances, watched for an hour at $2/GPU-hour, costs $2 of time plus its board energy
once, in `top` (LiveState) and in `serve` (the Agent's /api/state and its dashboard totals)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel
from phasescope.config import PriceConfig
from phasescope.kpi.cost import Prices, mig_shares
from phasescope.live.classify import LiveClassifier
from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState
from phasescope.schema import DeviceInfo, TickBatch, Trace
from phasescope.serve.agent import Agent
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.views import table
from phasescope.views.display import MISSING, fmt_usd
from tests.serve.conftest import feed

SPAR_RUN = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"
SG_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
KWH_USD = 0.1


@pytest.fixture
def mig_source(shared_data: Path, fake_nvml) -> NvmlSource:
    """The scripted fake NVML of tests/kpi/test_mig_cost.py: one A100 split into 2 MIG instances."""
    (spar,) = read(shared_data / SPAR_RUN)
    fake = fake_nvml([spar], mig={0: read(shared_data / SG_RUN)}, mem_total_bytes=40e9)
    src = NvmlSource()
    src.fake = fake  # type: ignore[attr-defined]
    return src


def _hour(src: NvmlSource, step_s: float) -> Iterator[TickBatch]:
    """One hour of ticks, `step_s` apart on the data clock (0..3600 s inclusive)."""
    fake = src.fake  # type: ignore[attr-defined]
    for i in range(round(3600 / step_s) + 1):
        yield replace(src.read(), time=1.7e9 + step_s * i)
        fake.advance()
    src.close()


def test_top_prices_the_mig_gpu_once_per_hour(mig_source: NvmlSource) -> None:
    state = LiveState("nvml", prices=Prices(2.0, KWH_USD))
    loop = TickLoop(mig_source, 1.0, state)
    for batch in _hour(mig_source, 1.0):  # the loop meters energy at its 1 s tick
        loop.on_tick(batch)
    joules, usd = state.energy_totals()
    assert joules > 0  # the board's power, read on the parent only
    # One physical GPU held for an hour: $2 of time and the board energy once (was $6: $2 per row).
    assert usd == pytest.approx(2.0 + joules / 3.6e6 * KWH_USD)
    assert fmt_usd(usd) in table.status_line(state)
    parent, *kids = table.rows(state)
    assert [r.cells["energy"] for r in kids] == [f"{MISSING} kWh · {fmt_usd(1.0)}"] * 2
    prices, notes = state.row_prices()
    assert "split equally" in notes[kids[0].key] and notes[parent.key].startswith("MIG parent")
    assert prices[kids[0].key] == Prices(1.0, None)


def test_serve_prices_the_mig_gpu_once_per_hour(mig_source: NvmlSource) -> None:
    agent = Agent(mig_source, 10.0, classifier=LiveClassifier(PhaseModel.load()),
                  prices=PriceConfig(usd_per_gpu_hour=2.0, usd_per_kwh=KWH_USD))
    feed(agent, _hour(mig_source, 10.0))
    snap = agent.snapshot()
    assert len(snap["devices"]) == 3
    costs = [p["cost"] for d in snap["devices"] for p in d["energy"]["phases"].values()]
    seconds = sum(p["seconds"] for d in snap["devices"] for p in d["energy"]["phases"].values())
    assert seconds == pytest.approx(3 * 3600.0)  # three rows, each held the whole hour
    board_kwh = sum(p["kwh"] for p in snap["devices"][0]["energy"]["phases"].values())
    assert board_kwh > 0
    assert sum(c["time_usd"] for c in costs) == pytest.approx(2.0)
    assert sum(c["energy_usd"] or 0.0 for c in costs) == pytest.approx(board_kwh * KWH_USD, rel=1e-4)
    # The dashboard's "all devices" table sums the same per-row costs.
    totals = sum(t["usd"] for t in snap["totals"].values())
    assert totals == pytest.approx(2.0 + board_kwh * KWH_USD, rel=1e-3)
    parent, *kids = snap["devices"]
    assert parent["price_note"].startswith("MIG parent")
    assert all("1/2 of the GPU-hour" in k["price_note"] for k in kids)


def _trace(uuid: str, name: str, parent: str | None = None) -> Trace:
    t = np.arange(0.0, 60.0, 1.0)
    return Trace(DeviceInfo(uuid, name, 0, parent_uuid=parent), t, {"power": np.full(t.size, 100.0)})


def test_a_replay_of_two_runs_keeps_each_instance_with_its_own_gpu() -> None:
    """Two runs of one MIG GPU in one file: the second run's rows are renamed "#2", parent_uuid too."""
    run = [_trace("GPU-a", "NVIDIA H100 80GB HBM3"),
           _trace("MIG-1", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "GPU-a"),
           _trace("MIG-2", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "GPU-a")]
    devices = ReplaySource(run + run, clock=lambda: 0.0, wall_clock=lambda: 0.0).devices()
    assert [(d.uuid, d.parent_uuid) for d in devices] == [
        ("GPU-a", None), ("MIG-1", "GPU-a"), ("MIG-2", "GPU-a"),
        ("GPU-a#2", None), ("MIG-1#2", "GPU-a#2"), ("MIG-2#2", "GPU-a#2"),
    ]
    shares = mig_shares(devices)
    for suffix in ("", "#2"):  # each run's GPU-hour is shared out over its own rows
        assert sum(shares[u + suffix].time for u in ("GPU-a", "MIG-1", "MIG-2")) == pytest.approx(1.0)
        assert shares["MIG-1" + suffix].time == pytest.approx(3 / 7)
