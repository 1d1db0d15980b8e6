"""The report's charts as a person reads them, in a real headless Chromium at a desktop (1280 px) and a phone
(420 px) width: dates on the time axis, one time range for every device, units in every axis title, ranges
from the signal's physical range, legends outside the plot area, no sideways scrolling, and a trace too
short for a probability timeline saying so. Screenshots land in the test's tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel
from phasescope.report import build, render
from phasescope.report.page import _figure
from phasescope.sources.replay import read
from tests.live_helpers import TRAINING_RUN
from tests.report.test_browser import _chromium

MIN_PLOT_PX = 120  # a panel's plot area at its smallest that still reads

# Per figure: axis layout as plotly resolved it, and where its legend and plot areas were drawn.
_FIGURES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(f => {
  const axes = Object.entries(f._fullLayout).filter(([k]) => /^[xy]axis\\d*$/.test(k));
  const plots = [...f.querySelectorAll('.draglayer .nsewdrag')].map(r => r.getBoundingClientRect());
  const legend = f.querySelector('.infolayer .legend');
  return {
    id: f.id,
    titles: Object.fromEntries(axes.map(([k, a]) => [k, a.title && a.title.text])),
    types: Object.fromEntries(axes.map(([k, a]) => [k, a.type])),
    ranges: Object.fromEntries(axes.map(([k, a]) => [k, a.range])),
    legend_y: f._fullLayout.legend.y, legend_anchor: f._fullLayout.legend.yanchor,
    legend_bottom: legend ? legend.getBoundingClientRect().bottom : null,
    plots_top: Math.min(...plots.map(r => r.top)),
    plot_heights: plots.map(r => r.height),
    plot_width: Math.min(...plots.map(r => r.width)),
    names: f.data.map(t => t.name),
  };
})"""


def _look(page: Any, width: int, shot: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    page.set_viewport_size({"width": width, "height": 1000})
    page.wait_for_timeout(600)  # plotly's responsive resize runs on the window's resize event
    page.screenshot(path=str(shot), full_page=True)
    sizes = page.evaluate("() => ({scroll: document.scrollingElement.scrollWidth, inner: innerWidth})")
    return page.evaluate(_FIGURES), sizes


def test_report_charts_read_at_desktop_and_phone_widths(shared_data: Path, tmp_path: Path) -> None:
    exe = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    path = str(shared_data / TRAINING_RUN)
    traces = read(path)
    assert len(traces) == 2 and traces[0].meta["clock"] == "monotonic_raw"  # raw clock, anchored to UTC
    short = traces[0].slice_time(float(traces[0].time[0]) + 200, float(traces[0].time[0]) + 231)  # 31 s
    data = build([(path, [*traces, short])], model=PhaseModel.load())
    out = tmp_path / "report.html"
    out.write_text(render(data), encoding="utf-8")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(out.as_uri(), wait_until="load", timeout=60_000)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3",
                                   timeout=60_000)
            wide, wide_sizes = _look(page, 1280, tmp_path / "report-1280.png")
            narrow, narrow_sizes = _look(page, 420, tmp_path / "report-420.png")
            too_short = page.locator("[data-testid=too-short]").all_text_contents()
        finally:
            browser.close()
    assert errors == []
    for figs, sizes in ((wide, wide_sizes), (narrow, narrow_sizes)):
        assert sizes["scroll"] <= sizes["inner"], sizes  # nothing scrolls sideways
        assert len(figs) == 3
        for f in figs:
            # Real dates (the log's raw clock plus its UTC anchor), not "16.1k ... 16.8k".
            assert f["types"]["xaxis"] == "date"
            assert str(f["ranges"]["xaxis"][0]).startswith("2026-08-25"), f["ranges"]["xaxis"]
            # Every axis title carries its unit.
            ytitles = [t for k, t in f["titles"].items() if k.startswith("y")]
            assert ytitles and all(t and "(" in t and t.endswith(")") for t in ytitles), ytitles
            assert f["titles"]["yaxis"] == "utilisation (%)" and f["ranges"]["yaxis"] == [0, 100]
            assert f["titles"]["yaxis2"] == "power (W)" and f["ranges"]["yaxis2"][0] == 0
            # The legend is above the panels: its box ends before the first plot area begins.
            assert f["legend_y"] >= 1 and f["legend_anchor"] == "bottom"
            assert f["legend_bottom"] is not None and f["legend_bottom"] <= f["plots_top"] + 1
            assert min(f["plot_heights"]) >= MIN_PLOT_PX and f["plot_width"] >= 250
            # Two-line panels name both lines.
            assert {"GPU util", "memory util", "SM clock", "memory clock"} <= set(f["names"])
        # One time range for every device, so the timelines line up.
        assert len({tuple(map(str, f["ranges"]["xaxis"])) for f in figs}) == 1
    # The 31 s slice has one classifier window: no empty probability panel, a sentence instead.
    assert [n for n in wide[2]["names"] if n.startswith("P(")] == []
    assert len(too_short) == 1 and "Too short to classify" in too_short[0]
    assert all(n.startswith("P(") for n in wide[0]["names"][-4:])
    for shot in ("report-1280.png", "report-420.png"):
        assert (tmp_path / shot).stat().st_size > 20_000


def test_the_power_axis_runs_to_the_power_limit(shared_data: Path) -> None:
    """Not from the data's spread: with the board's limit known (an RTX 3090's 350 W) the axis is 0-350 W,
    so 35 W of idle sits at the bottom; without it, the peak rounded up to 100 W."""
    path = str(shared_data / TRAINING_RUN)
    trace = read(path)[1]  # the idle GPU: about 20-40 W
    assert float(np.nanmax(trace["power"])) < 100
    limited = trace.with_columns(power_limit=np.full(len(trace), 350.0))
    for tr, top in ((limited, 350.0), (trace, 100.0)):
        fig = _figure(build([(path, [tr])], model=None).devices[0], webgl=False)
        assert fig.layout.yaxis2.title.text == "power (W)"
        assert list(fig.layout.yaxis2.range) == [0.0, top]
