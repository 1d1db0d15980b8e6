"""Print the phase palette's figures that docs/design/visual-language.md quotes: per kind of vision, the
closest pair of phase colours (CIEDE2000, Machado 2009 simulation) and the lowest fill and text contrasts.

    .venv/bin/python benchmarks/palette_figures.py

The measures are the test's own (tests/views/test_palette.py), which asserts the bounds; this prints them.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.views.test_palette import BACKGROUNDS, MACHADO_2009, _lab, _linear, ciede2000, contrast

from phasescope.views.palette import ORDER, PALETTE


def main() -> None:
    for vision in (None, *MACHADO_2009):
        m = np.eye(3) if vision is None else np.array(MACHADO_2009[vision])
        seen = {k: _lab(m @ _linear(PALETTE[k].fill)) for k in ORDER}
        d, a, b = min((ciede2000(seen[a], seen[b]), a, b) for a, b in itertools.combinations(ORDER, 2))
        print(f"{vision or 'normal vision':13s} closest pair {a} / {b}: {d:.1f} CIEDE2000")
    fill = min((contrast(PALETTE[k].fill, bg), k, bg) for k in ORDER for bg in BACKGROUNDS)
    ink = min((contrast(PALETTE[k].ink, PALETTE[k].fill), k) for k in ORDER)
    print(f"lowest fill contrast: {fill[0]:.2f}:1 ({fill[1]} on {fill[2]})")
    print(f"lowest badge text contrast: {ink[0]:.2f}:1 ({ink[1]})")


if __name__ == "__main__":
    main()
