"""The dashboard's charts as a person reads them, in a real headless Chromium at a desktop (1280 px) and a
phone (420 px) width, over a real `phasescope serve`: units in the axis titles, fixed ranges (0-100 %,
0 to the power limit), one time range for both GPUs, the legend above the plot, no sideways scrolling, charts
that keep their height, a replay plotted on the trace's own clock, and a host with no power sensor saying
so instead of drawing an empty power axis. Screenshots land in the test's tmp_path (run with
PHASESCOPE_UPDATE_DOCS=1 and test_dashboard_browser.py to redraw the README's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phasescope.sources.replay import read
from tests.serve.conftest import CHROMIUM, MIGRATION_RUN, serve_process, system_tool
from tests.serve.test_dashboard_browser import sync_playwright_or_skip

MIN_CHART_PX = 220

_CHARTS = """() => [...document.querySelectorAll('section.device .chart')].map(c => {
  const L = c._fullLayout, plot = c.querySelector('.draglayer .nsewdrag').getBoundingClientRect();
  const legend = c.querySelector('.infolayer .legend');
  return {
    height: c.getBoundingClientRect().height, width: c.getBoundingClientRect().width,
    plot_height: plot.height, plot_top: plot.top,
    legend_bottom: legend ? legend.getBoundingClientRect().bottom : null,
    legend_y: L.legend.y, legend_anchor: L.legend.yanchor,
    y_title: L.yaxis.title.text, y_range: L.yaxis.range,
    y2_title: L.yaxis2 ? L.yaxis2.title.text : null, y2_range: L.yaxis2 ? L.yaxis2.range : null,
    x_type: L.xaxis.type, x_range: L.xaxis.range.map(String),
    x0: c.data[0].x.length ? new Date(c.data[0].x[0]).getTime() / 1000 : null,
    power: c.dataset.power, notes: (L.annotations || []).map(a => a.text),
  };
})"""
_OVERFLOW = """() => ({scroll: document.scrollingElement.scrollWidth, inner: innerWidth,
  header: document.querySelector('header').scrollWidth - document.querySelector('header').clientWidth})"""


def _at(page: Any, width: int, shot: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    page.set_viewport_size({"width": width, "height": 1000})
    page.wait_for_timeout(1200)  # a resize and one more update
    page.screenshot(path=str(shot), full_page=True)
    return page.evaluate(_CHARTS), page.evaluate(_OVERFLOW)


def _open(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "?token=pw-token")
    page.wait_for_function("() => [...document.querySelectorAll('section.device .chart')]"
                           ".some(c => Number(c.dataset.points) > 10)", timeout=60_000)
    page.errors = errors
    return page


@pytest.mark.slow
def test_dashboard_charts_read_at_desktop_and_phone_widths(shared_data: Path, tmp_path: Path) -> None:
    chromium = system_tool(CHROMIUM)
    sync_playwright = sync_playwright_or_skip()
    run = shared_data / MIGRATION_RUN
    recorded = read(run)
    # The recording's span in Unix time: SensorGuard's raw clock through the log's own UTC anchor.
    anchor = float(recorded[0].meta.get("utc_offset") or 0.0)
    start = min(float(t.time[0]) for t in recorded) + anchor
    end = max(float(t.time[-1]) for t in recorded) + anchor
    args = ["--source", f"replay:{run}?speed=5", "--token", "pw-token"]
    with serve_process(args, tmp_path) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = _open(browser, url)
            page.wait_for_function("() => [...document.querySelectorAll('section.device .chart')]"
                                   ".every(c => Number(c.dataset.points) > 10)", timeout=60_000)
            state = page.evaluate("async () => (await (await fetch('api/state')).json())")
            wide, wide_box = _at(page, 1280, tmp_path / "dashboard-1280.png")
            narrow, narrow_box = _at(page, 420, tmp_path / "dashboard-420.png")
            # The page's own power range: to the limit a device reports, else the peak rounded up.
            ranges = page.evaluate("() => [powerRange({power: [31, 38, null]}, 350), powerRange({power: "
                                   "[31, 38, 281]}, null), powerRange({power: [null]}, null)]")
            assert page.errors == []
        finally:
            browser.close()
    assert ranges == [[0, 350], [0, 300], None]
    # A replay's clock: the offset is in /api/state and every plotted time is the trace's own time.
    offset = state["clock_offset_s"]
    assert offset != 0
    assert start - 2 <= state["time"] + offset <= end + 2
    for charts, box in ((wide, wide_box), (narrow, narrow_box)):
        assert box["scroll"] <= box["inner"] and box["header"] <= 0, box  # no sideways scrolling
        assert len(charts) == 2
        for c in charts:
            assert c["height"] >= MIN_CHART_PX and c["plot_height"] >= MIN_CHART_PX / 2, c
            assert c["width"] >= 300 or box["inner"] > 1000, c
            assert c["y_title"] == "utilisation (%)" and c["y_range"] == [0, 100]
            assert c["y2_title"] == "power (W)" and c["power"] == "reading"
            assert c["y2_range"][0] == 0 and c["y2_range"][1] % 100 == 0  # no power limit in this log
            assert c["x_type"] == "date"
            assert start - 2 <= c["x0"] <= end + 2, (c["x0"], start, end)  # the trace's time, not wall time
            assert c["legend_y"] > 1 and c["legend_anchor"] == "bottom"
            assert c["legend_bottom"] <= c["plot_top"] + 1  # the legend never covers a line
        assert charts[0]["x_range"] == charts[1]["x_range"]  # both GPUs on one time axis
    for shot in ("dashboard-1280.png", "dashboard-420.png"):
        assert (tmp_path / shot).stat().st_size > 20_000


@pytest.mark.slow
def test_a_host_without_power_says_no_power_reading(tmp_path: Path) -> None:
    chromium = system_tool(CHROMIUM)
    sync_playwright = sync_playwright_or_skip()
    with serve_process(["--source", "host", "--token", "pw-token"], tmp_path) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = _open(browser, url)
            state = page.evaluate("async () => (await (await fetch('api/state')).json())")
            charts, box = _at(page, 420, tmp_path / "host-420.png")
            assert page.errors == []
        finally:
            browser.close()
    assert state["clock_offset_s"] == 0  # a live source: wall time as it is
    assert box["scroll"] <= box["inner"]
    (c,) = charts
    assert c["power"] == "none" and c["notes"] == ["no power reading"]
    assert c["y2_title"] is None and c["y_range"] == [0, 100]  # no empty 0-3.81 W axis
