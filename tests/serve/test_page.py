"""The dashboard page takes its phase names and colours from the palette, handed in as JSON, never copied."""

from __future__ import annotations

import json
import re

from phasescope.serve.page import _TEMPLATE, render
from phasescope.views.palette import HELD_IDLE, PALETTE, as_json


def _config(page: str) -> dict[str, object]:
    m = re.search(r"const CONFIG = (\{.*?\});\n", page)
    assert m, "the page inlines no CONFIG"
    out: dict[str, object] = json.loads(m.group(1))
    return out


def test_the_palette_is_inlined_as_json_and_the_script_keeps_no_colour_of_its_own() -> None:
    page = render("host", "/static/plotly.min.js", {"signals": ["gpu_util"], "max_points": 10})
    cfg = _config(page)
    assert cfg["palette"] == as_json() and cfg["signals"] == ["gpu_util"]
    # No phase colour in the template: the script reads every one from CONFIG.palette.
    fills = {p.fill.lower() for p in PALETTE.values()}
    assert not fills & {h.lower() for h in re.findall(r"#[0-9a-fA-F]{6}\b", _TEMPLATE)}
    # ... and the old per-page table is gone for good.
    assert "COLOURS" not in _TEMPLATE
    # "idle but held" is written in held idle's colour, under its one name.
    assert f".held {{ color: {PALETTE[HELD_IDLE].fill};" in page
    assert "PALETTE.held_idle.name" in page and f'"{HELD_IDLE}"' in json.dumps(cfg["palette"])


def test_a_value_cannot_close_the_script() -> None:
    page = render("host", "/static/plotly.min.js", {"pricing": "</script><b>x</b>"})
    assert "</script><b>" not in page and _config(page)["pricing"] == "</script><b>x</b>"
