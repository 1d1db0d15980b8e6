"""The report in a real headless Chromium with the network cut off: it must render from the file alone."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from phasescope.classify.model import PhaseModel
from phasescope.report import build, render
from phasescope.schema import PHASES
from phasescope.sources.replay import read
from phasescope.views.palette import PALETTE, look
from tests.live_helpers import TRAINING_RUN

CHROMIUM = "/usr/bin/chromium"


def _rgb(hex_colour: str) -> str:
    """A hex colour as getComputedStyle writes it."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _chromium() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path is None:
        if os.environ.get("PHASESCOPE_REQUIRE_SYSTEM_TOOLS"):
            pytest.fail("chromium is required (PHASESCOPE_REQUIRE_SYSTEM_TOOLS is set) but not installed")
        pytest.skip("no chromium on this machine")
    return path


def test_report_renders_offline_in_chromium(shared_data: Path, tmp_path: Path) -> None:
    exe = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    path = str(shared_data / TRAINING_RUN)
    data = build([(path, read(path))], model=PhaseModel.load())
    out = tmp_path / "report.html"
    out.write_text(render(data), encoding="utf-8")

    blocked: list[str] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page()

            def route(r: object) -> None:
                url = r.request.url  # type: ignore[attr-defined]
                if url.startswith("file://"):
                    r.continue_()  # type: ignore[attr-defined]
                else:
                    blocked.append(url)
                    r.abort()  # type: ignore[attr-defined]

            page.route("**/*", route)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(out.as_uri(), wait_until="load", timeout=60_000)
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot').length === {len(data.devices)}", timeout=60_000
            )
            traces = page.evaluate("document.getElementById('fig0').data.length")
            points = page.evaluate("document.getElementById('fig0')._fullData[0].y.length")
            shapes = page.evaluate("(document.getElementById('fig0').layout.shapes || []).length")
            drawn = page.evaluate("document.querySelectorAll('#fig0 .main-svg').length")
            badges = page.evaluate("[...document.querySelectorAll('h2 .badge')].map(b => b.textContent)")
            # what the browser draws for each phase: badges, bands and probability lines
            painted = page.evaluate("[...document.querySelectorAll('.badge')].map(b => [b.dataset.phase, "
                                    "getComputedStyle(b).backgroundColor, getComputedStyle(b).color])")
            bands = page.evaluate("document.getElementById('fig0').layout.shapes.map(s => s.fillcolor)")
            lines = page.evaluate("document.getElementById('fig0').data.filter(t => t.name.startsWith('P('))"
                                  ".map(t => [t.name, t.line.color])")
        finally:
            browser.close()
    assert blocked == [] and errors == []
    assert traces >= 5 and points > 100 and drawn > 0
    assert shapes == len(data.devices[0].segments) > 0  # one band per phase segment
    assert badges == [d.label for d in data.devices] == ["training", "idle"]
    # The palette's colours (views/palette.py) are what the report draws, as every other view does.
    assert painted and all(bg == _rgb(look(ph).fill) and fg == _rgb(look(ph).ink) for ph, bg, fg in painted)
    assert bands == [look(s.label).fill for s in data.devices[0].segments]
    assert lines == [[f"P({ph})", PALETTE[ph].fill] for ph in PHASES]


def test_many_devices_all_draw_their_timelines(shared_data: Path, tmp_path: Path) -> None:
    """A report of 20 pods: as WebGL figures (2-3 contexts each) Chromium kept only its last 16 contexts and
    the first devices' timelines came out blank ("Too many active WebGL contexts. Oldest context will be
    lost."). Beyond a few devices the lines are SVG, and every figure draws."""
    exe = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    path = str(shared_data / "alibaba-gentd26" / "pod_gpu_duty_cycle_anon.csv")
    data = build([(path, read(path)[:20])], model=None)
    out = tmp_path / "report.html"
    out.write_text(render(data), encoding="utf-8")
    console: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: console.append(m.text))
            page.goto(out.as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 20",
                                   timeout=60_000)
            drawn = page.evaluate(
                "[...document.querySelectorAll('.js-plotly-plot')]"
                ".map(p => p.querySelectorAll('.scatterlayer .trace path.js-line').length)"
            )
        finally:
            browser.close()
    assert not [m for m in console if "Too many active WebGL contexts" in m]
    assert len(drawn) == 20 and all(n > 0 for n in drawn), drawn
