"""The one palette and vocabulary of phases: the word every view writes for a phase and the colour it draws.

The TUI, the dashboard, the fleet page, `phasescope report` and the run report all take a phase's name and
colour from here; none keeps a colour of its own. Labels are the data's (`schema.PHASES`, `UNKNOWN`,
`HELD_IDLE`); `look(label)` gives what a view shows for one.

The colours are Okabe & Ito's colour-universal-design set (https://jfly.uni-koeln.de/color/), darkened where
the original is too light to read on a white page; tests/views/test_palette.py checks the choice: every pair
stays apart (CIEDE2000) for normal vision and simulated protanopia, deuteranopia and tritanopia, each fill
stands out from the pages' backgrounds, and each badge's text is readable on its fill.

One word for "not judged": `unknown`, whether the classifier declined a window or no window covers the
time (the first seconds of a live device, the head and tail of a recording, a recording read without a
model: once `unsegmented` in `report` and `cost`). Two states are not "unknown" and keep their own words:
held idle (`idle (held)`: idle while a process or its memory holds the device, a cost, not a doubt) and a
device whose source stopped answering (`NO DATA`, which is not a phase and has no colour here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from phasescope.classify.decide import UNKNOWN
from phasescope.schema import PHASES

__all__ = ["FAVICON", "HELD_IDLE", "ORDER", "PALETTE", "UNKNOWN", "PhaseLook", "as_json", "look"]

# fleet/judge.py's label for a held-idle segment (fleet keeps the name; tests check the two agree).
HELD_IDLE = "held_idle"


@dataclass(frozen=True)
class PhaseLook:
    """How a phase looks: `name` is the word a view writes, `fill` its colour (badge, band, bar, line) and
    `ink` the text colour on that fill (black or white, whichever reads better)."""

    name: str
    fill: str
    ink: str

    @property
    def terminal(self) -> str:
        """The badge as a rich/textual style (truecolor; rich maps it down on 256- and 16-colour ones)."""
        return f"bold {self.ink} on {self.fill}"

    def css(self) -> str:
        return f"background:{self.fill};color:{self.ink}"


_BLACK, _WHITE = "#000000", "#ffffff"

PALETTE: Mapping[str, PhaseLook] = MappingProxyType({
    "training": PhaseLook("training", "#d55e00", _BLACK),  # Okabe-Ito vermillion
    "inference": PhaseLook("inference", "#0072b2", _WHITE),  # Okabe-Ito blue
    "other": PhaseLook("other", "#a53f77", _WHITE),  # Okabe-Ito reddish purple, darker
    "idle": PhaseLook("idle", "#888888", _BLACK),  # neutral: nothing running
    HELD_IDLE: PhaseLook("idle (held)", "#735000", _WHITE),  # Okabe-Ito orange, darker: idle yet paid for
    UNKNOWN: PhaseLook(UNKNOWN, "#4c4c4c", _WHITE),  # neutral and dim: not judged
})
# Legends list labels in this order: the phases, then held idle, then unknown.
ORDER: tuple[str, ...] = (*PHASES, HELD_IDLE, UNKNOWN)


def look(label: str) -> PhaseLook:
    """How `label` looks. A hooks label naming several phases ("training+inference") takes its first
    phase's colour under its own name; a label the palette does not know looks like unknown."""
    if label in PALETTE:
        return PALETTE[label]
    first = PALETTE.get(label.split("+")[0])
    if first is not None:
        return PhaseLook(label, first.fill, first.ink)
    return PhaseLook(label, PALETTE[UNKNOWN].fill, PALETTE[UNKNOWN].ink)


# Every page's tab icon, inline (no request, so no 404 in the server's log): the four phases as quarters.
FAVICON = (
    "<link rel='icon' href=\"data:image/svg+xml,"
    "%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E"
    + "".join(
        f"%3Crect x='{x}' y='{y}' width='8' height='8' fill='%23{PALETTE[p].fill[1:]}'/%3E"
        for p, (x, y) in zip(PHASES, ((0, 0), (8, 0), (0, 8), (8, 8)), strict=True)
    )
    + "%3C/svg%3E\">"
)


def as_json() -> dict[str, dict[str, str]]:
    """The palette for a web page's script: label -> {name, fill, ink}, in legend order."""
    return {k: {"name": PALETTE[k].name, "fill": PALETTE[k].fill, "ink": PALETTE[k].ink} for k in ORDER}
