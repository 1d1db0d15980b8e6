"""The dashboard in a real headless Chromium (Debian's), driven by Playwright, over a replayed real trace.

The trace is a real RTX 3090 run in which GPU 4 idles for ~50 s and then the training run migrates onto it.
Replayed at 3x, the page must load, GPU 4's phase badge must go from idle to training, and its chart must
hold data with phase bands, all of it pushed over the live stream (Server-Sent Events); the same page
still updates by polling when told to (the fallback where a stream cannot open). The screenshot is kept
under docs/img/ when PHASESCOPE_UPDATE_DOCS=1.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from phasescope.views.palette import PALETTE, as_json, look
from tests.serve.conftest import CHROMIUM, MIGRATION_RUN, serve_process, system_tool

REPO = Path(__file__).resolve().parents[2]
BADGE = 'section.device[data-index="4"] [data-testid="phase-badge"]'
CHART = 'section.device[data-index="4"] .chart'


def _rgb(hex_colour: str) -> str:
    """A hex colour as getComputedStyle writes it."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def sync_playwright_or_skip() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("PHASESCOPE_REQUIRE_SYSTEM_TOOLS"):
            pytest.fail("the playwright package is required (dev extra) but not installed")
        pytest.skip("playwright not installed")
    return sync_playwright


@pytest.mark.slow
def test_badge_goes_idle_to_training_and_chart_has_data(shared_data: Path, tmp_path: Path) -> None:
    chromium = system_tool(CHROMIUM)
    sync_playwright = sync_playwright_or_skip()
    src = f"replay:{shared_data / MIGRATION_RUN}?speed=3"
    args = ["--source", src, "--token", "pw-token", "--usd-per-gpu-hour", "2.5", "--usd-per-kwh", "0.12"]
    with serve_process(args, tmp_path) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            response = page.goto(url + "?token=pw-token")
            assert response is not None and response.status == 200
            assert page.title().startswith("phasescope")
            page.wait_for_function("() => typeof Plotly !== 'undefined'", timeout=20_000)
            # Updates come over the stream (EventSource, with the token's cookie), not by polling.
            page.wait_for_function("() => document.body.dataset.transport === 'sse'", timeout=20_000)
            polls: list[str] = []
            page.on("request", lambda r: polls.append(r.url) if "/api/update" in r.url else None)
            # Idle first (the GPU sits unused while the run starts on GPU 3) ...
            page.wait_for_function(f"() => document.querySelector('{BADGE}')?.textContent === 'idle'",
                                   timeout=30_000)
            # ... then training, once the run migrates onto it.
            page.wait_for_function(f"() => document.querySelector('{BADGE}')?.textContent === 'training'",
                                   timeout=45_000)
            badge = page.locator(BADGE)
            assert badge.get_attribute("data-phase") == "training"
            # The chart is a plotly graph with data and coloured phase bands (idle, then training).
            page.wait_for_function(f"() => Number(document.querySelector('{CHART}').dataset.points) > 20")
            points = page.evaluate(f"() => document.querySelector('{CHART}').data[0].x.length")
            assert points > 20
            fills = f"() => document.querySelector('{CHART}').layout.shapes.map(s => s.fillcolor)"
            bands = page.evaluate(fills)
            assert PALETTE["idle"].fill in bands and PALETTE["training"].fill in bands
            assert set(bands) <= {p.fill for p in PALETTE.values()}  # every band in a palette colour
            # The badge is drawn in the palette's colours (views/palette.py), as every other view draws it.
            drawn = badge.evaluate("b => [getComputedStyle(b).backgroundColor, getComputedStyle(b).color]")
            assert drawn == [_rgb(PALETTE["training"].fill), _rgb(PALETTE["training"].ink)]
            assert page.evaluate("() => CONFIG.palette") == as_json()  # handed in as JSON, not copied
            for label in ("training+inference", "warming-up", "held_idle"):  # the page's look() is palette's
                want = look(label)
                assert page.evaluate(f"() => look({label!r})") == {"name": want.name, "fill": want.fill,
                                                                    "ink": want.ink}
            assert page.locator(f"{CHART} .main-svg").count() >= 1
            assert page.locator("#totals tbody tr").count() >= 2  # energy and cost per phase
            assert "$" in page.locator("#totals").inner_text()
            assert not errors, errors
            assert polls == []  # every update above came over the stream
            assert page.evaluate("() => document.body.dataset.transport") == "sse"
            shot = tmp_path / "dashboard.png"
            page.wait_for_timeout(1500)  # let one more update land so the picture is settled
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
            if os.environ.get("PHASESCOPE_UPDATE_DOCS") == "1":
                shutil.copyfile(shot, REPO / "docs" / "img" / "dashboard.png")
            # The fallback: the same page, polling, still goes live.
            polled = browser.new_page()
            polled.goto(url + "?token=pw-token&transport=poll")
            polled.wait_for_function("() => Number(document.body.dataset.updates || 0) >= 2", timeout=20_000)
            assert polled.evaluate("() => document.body.dataset.transport") == "poll"
            assert polled.locator(BADGE).text_content() in {p.name for p in PALETTE.values()}
        finally:
            browser.close()
