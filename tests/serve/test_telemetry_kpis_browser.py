"""The dashboard shows the telemetry-only KPIs line of a served GPU (headless Chromium, a real
`phasescope serve` on a replayed vLLM server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.live.test_telemetry_kpis import SERVING_RUN
from tests.serve.conftest import CHROMIUM, serve_process, system_tool
from tests.serve.test_dashboard_browser import sync_playwright_or_skip

LINE = "[data-testid=telemetry-kpis]"


@pytest.mark.slow
def test_the_page_shows_busy_fraction_and_bursts_with_their_methods(shared_data: Path,
                                                                   tmp_path: Path) -> None:
    chromium = system_tool(CHROMIUM)
    sync_playwright = sync_playwright_or_skip()
    args = ["--source", f"replay:{shared_data / SERVING_RUN}?speed=2", "--token", "pw-token"]
    with serve_process(args, tmp_path) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "?token=pw-token")
            text_of = f"(document.querySelector('{LINE}')?.textContent || '')"
            shown = f"() => {text_of}.startsWith('from telemetry: busy ')"
            page.wait_for_function(shown, timeout=90_000)
            text = page.locator(LINE).text_content() or ""
            assert "bursts/min " in text and ("headroom" in text or "saturated" in text)
            title = page.locator(LINE).get_attribute("title") or ""
            assert "busy fraction: mean gpu_util" in title and "bursts per minute: " in title
            assert errors == []
        finally:
            browser.close()
