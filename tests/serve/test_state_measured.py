"""/api/state's `energy.measured`: kpi/energy.py's one rule for "some energy was measured" (covered_s > 0),
carried to the dashboard so its JavaScript no longer decides it from `method` on its own."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel
from phasescope.config import PriceConfig
from phasescope.live.classify import LiveClassifier
from phasescope.schema import Trace
from phasescope.serve.agent import Agent
from phasescope.serve.app import build_app
from phasescope.serve.page import render
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from tests.http_helpers import TestClient
from tests.live_helpers import ticks
from tests.serve.conftest import CHROMIUM, MIGRATION_RUN, feed, system_tool
from tests.serve.test_dashboard_browser import sync_playwright_or_skip


def _state(traces: list[Trace], stop: int) -> dict:
    a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()),
              prices=PriceConfig(usd_per_kwh=0.12))
    feed(a, ticks(traces, stop=stop))
    return TestClient(build_app(a)).get("/api/state").json()


def test_measured_follows_covered_seconds_not_the_method_name(shared_data: Path) -> None:
    """A powered GPU is measured; one with neither power nor a counter is not (its phases' joules are null);
    a GPU whose first 40 samples fall in a power dropout is measured, while its dark phase stays null."""
    powered = read(shared_data / MIGRATION_RUN)[0]
    blind = powered.without("power", "energy")
    blind = Trace(replace(blind.device, uuid="GPU-no-power-sensor"), blind.time, blind.columns, blind.meta)
    cols = dict(powered.columns)
    for sig in ("power", "energy"):
        if sig in cols:
            cols[sig] = np.array(cols[sig], dtype=np.float64)
            cols[sig][:40] = np.nan
    dropout = Trace(replace(powered.device, uuid="GPU-dropout"), powered.time, cols, powered.meta)
    state = _state([powered, blind, dropout], stop=90)
    by_uuid = {d["uuid"]: d["energy"] for d in state["devices"]}
    for uuid, energy in by_uuid.items():
        covered = sum(e["covered_s"] for e in energy["phases"].values())
        assert energy["measured"] is (covered > 0), uuid  # the rule, whatever the method says
        assert energy["measured"] is (energy["method"] != "none"), uuid  # and the old field still agrees
    assert by_uuid[powered.device.uuid]["measured"] is True
    assert by_uuid["GPU-no-power-sensor"]["measured"] is False
    assert all(e["joules"] is None for e in by_uuid["GPU-no-power-sensor"]["phases"].values())
    dark = by_uuid["GPU-dropout"]
    assert dark["measured"] is True
    assert any(e["covered_s"] == 0 and e["joules"] is None for e in dark["phases"].values())


def test_a_device_before_its_second_tick_is_unmeasured(shared_data: Path) -> None:
    """One tick: no interval yet, so nothing covered; `measured` is false (a bool, not missing)."""
    traces = read(shared_data / MIGRATION_RUN)[:1]
    dev = _state(traces, stop=1)["devices"][0]
    assert dev["energy"]["measured"] is False and dev["energy"]["method"] == "none"


def test_the_page_reads_measured_not_the_method_name() -> None:
    """The dashboard's JavaScript takes "has energy" from `energy.measured`, never from comparing the method
    with "none" (a second copy of the rule)."""
    page = render("phasescope", "plotly.js", {})
    assert not re.search(r"""method\s*!==?\s*["']none["']""", page)
    assert "const metered = dev.energy.measured;" in page  # a device's card
    assert "s.devices.some(d => d.energy.measured)" in page  # the totals table


@pytest.mark.slow
def test_the_page_draws_unmeasured_from_the_field_in_chromium(shared_data: Path) -> None:
    """The page's own drawing code, in headless Chromium, on a real /api/state: the device without power reads
    "energy unmeasured" and "– kWh", the powered one its method and kJ. With `method` made to disagree with
    `measured`, the page follows `measured` (it compared `method` with "none" before)."""
    chromium = system_tool(CHROMIUM)
    sync_playwright = sync_playwright_or_skip()
    powered = read(shared_data / MIGRATION_RUN)[0]
    blind = powered.without("power", "energy")
    blind = Trace(replace(blind.device, uuid="GPU-no-power-sensor"), blind.time, blind.columns, blind.meta)
    state = _state([powered, blind], stop=30)
    lying = copy.deepcopy(state)
    for dev in lying["devices"]:
        dev["energy"]["method"] = "counter"  # the method alone would say both are metered
    # refresh_ms: the page's own polling (which fails on a blank page) stays out of the way.
    page_html = render("phasescope", "plotly.js", {"signals": [], "max_points": 10, "refresh_ms": 600_000,
                                                  "pricing": ""})
    draw = """s => { for (const d of s.devices) drawDevice(d, s.time); drawTotals(s);
      return Object.fromEntries(s.devices.map(d => {
        const el = document.querySelector(`section.device[data-uuid="${d.uuid}"]`);
        return [d.uuid, [el.querySelector(".method").textContent,
                         el.querySelector(".energy tbody").textContent]];
      })); }"""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            # From a stand-in origin: the page's stream and poll get 404s, which it takes in its stride.
            page.route("http://phasescope.test/**", lambda route: route.fulfill(
                status=200, content_type="text/html", body=page_html)
                if route.request.url == "http://phasescope.test/" else route.fulfill(status=404))
            page.goto("http://phasescope.test/")
            for s in (state, lying):
                drawn = page.evaluate(draw, s)
                method, table = drawn["GPU-no-power-sensor"]
                assert method.startswith("energy unmeasured (no power reading)") and "– kWh" in table
                method, table = drawn[powered.device.uuid]
                assert method.startswith("energy from") and "kJ" in table and "– kWh" not in table
            assert not errors, errors
        finally:
            browser.close()
