"""The phase palette is colour-blind safe and readable, and it names every label the data carries.

Colour vision deficiency is simulated with Machado, Oliveira & Fernandes (2009), "A Physiologically-based
Model for Simulation of Color Vision Deficiency", IEEE TVCG 15(6):1291-1298, severity 1.0 (dichromacy)
matrices, applied to linear sRGB. Differences are CIEDE2000 (Sharma, Wu & Dalal 2005, "The CIEDE2000
color-difference formula: implementation notes, supplementary test data, and mathematical observations",
Color Res. Appl. 30(1)); the implementation is checked against that paper's test pairs first. Contrast is
WCAG 2.1's ratio of relative luminances.
"""

from __future__ import annotations

import itertools
import math
import re
import urllib.parse
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from phasescope.classify.decide import UNKNOWN
from phasescope.schema import PHASES
from phasescope.views.palette import FAVICON, HELD_IDLE, ORDER, PALETTE, as_json, look

MACHADO_2009 = {  # linear RGB -> simulated linear RGB, severity 1.0 (Machado et al. 2009, table/supplement)
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
                   (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                     (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602),
                   (0.004733, 0.691367, 0.303900)),
}
# Two colours read as two categories at a glance, not only side by side: ten CIEDE2000 units, about four
# times the just-noticeable difference (~2.3).
MIN_DELTA_E = 10.0
# WCAG 2.1 SC 1.4.11 (non-text contrast, 3:1): a band, bar, line or badge against the page behind it.
MIN_FILL_CONTRAST = 3.0
# WCAG 2.1 SC 1.4.3 (text contrast, 4.5:1): a badge's word on its fill.
MIN_INK_CONTRAST = 4.5
# The backgrounds the fills are drawn on: the report, run report, fleet page and the dashboard's panels are
# white; the dashboard's page behind its panels is #f5f6f8 (serve/page.py). The terminal draws a badge as
# text on its own fill, so there the ink contrast is the one that counts.
BACKGROUNDS = ("#ffffff", "#f5f6f8")


def _linear(hex_colour: str) -> np.ndarray:
    c = np.array([int(hex_colour[i:i + 2], 16) / 255.0 for i in (1, 3, 5)])
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear_rgb: np.ndarray) -> tuple[float, float, float]:
    """CIELAB (D65) of a linear sRGB colour (clipped to the gamut, as a screen shows it)."""
    m = np.array([[0.4124564, 0.3575761, 0.1804375],
                  [0.2126729, 0.7151522, 0.0721750],
                  [0.0193339, 0.1191920, 0.9503041]])
    t = (m @ np.clip(linear_rgb, 0.0, 1.0)) / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def ciede2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """CIEDE2000 with kL = kC = kH = 1, following Sharma et al. (2005) step by step."""
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    c_bar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_bar**7 / (c_bar**7 + 25**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dh = 0.0
    if c1p * c2p:
        dh = h2p - h1p
        dh = dh - 360 if dh > 180 else dh + 360 if dh < -180 else dh
    d_l, d_c = l2 - l1, c2p - c1p
    d_h = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    l_bar, cp_bar = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_bar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_bar = (h1p + h2p) / 2
    else:
        h_bar = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(h_bar - 30)) + 0.24 * math.cos(math.radians(2 * h_bar))
         + 0.32 * math.cos(math.radians(3 * h_bar + 6)) - 0.20 * math.cos(math.radians(4 * h_bar - 63)))
    d_theta = 30 * math.exp(-(((h_bar - 275) / 25) ** 2))
    r_c = 2 * math.sqrt(cp_bar**7 / (cp_bar**7 + 25**7))
    s_l = 1 + 0.015 * (l_bar - 50) ** 2 / math.sqrt(20 + (l_bar - 50) ** 2)
    s_c, s_h = 1 + 0.045 * cp_bar, 1 + 0.015 * cp_bar * t
    r_t = -math.sin(math.radians(2 * d_theta)) * r_c
    return math.sqrt((d_l / s_l) ** 2 + (d_c / s_c) ** 2 + (d_h / s_h) ** 2 + r_t * (d_c / s_c) * (d_h / s_h))


def contrast(a: str, b: str) -> float:
    la, lb = (float(np.dot((0.2126, 0.7152, 0.0722), _linear(x))) for x in (a, b))
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


@pytest.mark.parametrize(("lab1", "lab2", "expected"), [
    # Sharma et al. (2005), Table 1, pairs 1, 7, 13, 17, 25 and 34 (hue wrap, neutral, large difference).
    ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
    ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
    ((50.0, 2.49, -0.001), (50.0, -2.49, 0.0011), 7.2195),
    ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
    ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
    ((2.0776, 0.0795, -1.135), (0.9033, -0.0636, -0.5514), 0.9082),
])
def test_ciede2000_matches_the_published_test_data(lab1: tuple[float, float, float],
                                                   lab2: tuple[float, float, float], expected: float) -> None:
    assert ciede2000(lab1, lab2) == pytest.approx(expected, abs=5e-4)


def test_the_simulations_do_lose_colour() -> None:
    """The matrices are the dichromat ones, not a no-op: red and green collapse for the red-green blind,
    and blue and green draw together for tritanopes; white stays white."""
    def seen(hex_colour: str, vision: str) -> tuple[float, float, float]:
        return _lab(np.array(MACHADO_2009[vision]) @ _linear(hex_colour))

    red, green = "#cc3311", "#557700"
    assert ciede2000(_lab(_linear(red)), _lab(_linear(green))) > 30
    for vision in ("protanopia", "deuteranopia"):
        assert ciede2000(seen(red, vision), seen(green, vision)) < 15
    assert ciede2000(seen("#0077bb", "tritanopia"), seen("#009988", "tritanopia")) < 10
    for vision in MACHADO_2009:
        assert ciede2000(seen("#ffffff", vision), _lab(_linear("#ffffff"))) < 0.5


@pytest.mark.parametrize("vision", [None, *MACHADO_2009])
def test_every_pair_of_phase_colours_stays_apart(vision: str | None) -> None:
    m = np.eye(3) if vision is None else np.array(MACHADO_2009[vision])
    seen = {k: _lab(m @ _linear(PALETTE[k].fill)) for k in ORDER}
    close = [(a, b, round(ciede2000(seen[a], seen[b]), 1)) for a, b in itertools.combinations(ORDER, 2)
             if ciede2000(seen[a], seen[b]) < MIN_DELTA_E]
    assert not close, f"{vision or 'normal vision'}: phase colours too close (CIEDE2000): {close}"


@pytest.mark.parametrize("label", ORDER)
def test_every_fill_stands_out_and_its_word_reads(label: str) -> None:
    p = PALETTE[label]
    for bg in BACKGROUNDS:
        assert contrast(p.fill, bg) >= MIN_FILL_CONTRAST, f"{label} {p.fill} on {bg}"
    assert contrast(p.ink, p.fill) >= MIN_INK_CONTRAST, f"{label}: {p.ink} text on {p.fill}"
    # the ink is the better of black and white, not merely a passing one
    assert contrast(p.ink, p.fill) == max(contrast("#000000", p.fill), contrast("#ffffff", p.fill))


def test_one_word_for_every_label_the_data_carries() -> None:
    from phasescope.fleet.judge import HELD_IDLE as FLEET_HELD_IDLE
    from phasescope.kpi.energy import UNSEGMENTED

    assert FLEET_HELD_IDLE == HELD_IDLE
    assert UNSEGMENTED == UNKNOWN  # time no segment claims is "unknown", as on the dashboard
    assert set(ORDER) == {*PHASES, HELD_IDLE, UNKNOWN} == set(PALETTE)
    assert [PALETTE[p].name for p in PHASES] == list(PHASES)
    assert PALETTE[UNKNOWN].name == "unknown" and PALETTE[HELD_IDLE].name == "idle (held)"
    assert len({p.fill for p in PALETTE.values()}) == len(PALETTE)


def test_look_of_a_hooks_label_and_of_a_stray_one() -> None:
    both = look("training+inference")
    assert both.name == "training+inference" and both.fill == PALETTE["training"].fill
    stray = look("warming-up")
    assert stray.name == "warming-up" and stray.fill == PALETTE[UNKNOWN].fill


def test_the_web_and_terminal_forms_carry_the_same_colours() -> None:
    doc = as_json()
    assert list(doc) == list(ORDER)
    for k in ORDER:
        assert doc[k] == {"name": PALETTE[k].name, "fill": PALETTE[k].fill, "ink": PALETTE[k].ink}
        assert PALETTE[k].css() == f"background:{PALETTE[k].fill};color:{PALETTE[k].ink}"
        assert PALETTE[k].terminal == f"bold {PALETTE[k].ink} on {PALETTE[k].fill}"


def test_every_page_has_the_phase_icon_inline() -> None:
    """A page without an icon makes the browser ask for /favicon.ico: a 404 in every server log."""
    href = re.fullmatch(r"<link rel='icon' href=\"data:image/svg\+xml,(.*)\">", FAVICON)
    assert href is not None
    svg = ET.fromstring(urllib.parse.unquote(href.group(1)))
    fills = [r.get("fill") for r in svg.iter("{http://www.w3.org/2000/svg}rect")]
    assert fills == [PALETTE[p].fill for p in PHASES]
    from phasescope.serve.page import render

    assert FAVICON in render("t", "plotly.js", {})  # the report, run report and fleet pages: their own tests
