"""How much of a time window the telemetry actually covers: gaps, rate and missing signals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from phasescope.schema import Trace

# A step between samples above this many median steps is a gap (the sampler skipped, or the source was down).
GAP_FACTOR = 3.0


@dataclass(frozen=True)
class Coverage:
    """Data coverage of one device over one window [start, end]."""

    start: float
    end: float
    samples: int
    rate_hz: float  # median sampling rate; NaN with fewer than two samples
    gaps: int  # steps longer than GAP_FACTOR x the median step (and the empty edges of the window)
    gap_s: float  # seconds inside the window not covered by a sample step of normal length
    longest_gap_s: float
    covered_fraction: float  # 1 - gap_s / window length
    missing_signals: list[str] = field(default_factory=list)  # of the paper's 9
    windows: int = 0  # classifier windows in the span
    windows_judged: int = 0  # ... that the model could call (not "unknown")

    @property
    def judged_fraction(self) -> float:
        return self.windows_judged / self.windows if self.windows else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["judged_fraction"] = self.judged_fraction
        return d


def coverage(trace: Trace, start: float, end: float, windows: int = 0, windows_judged: int = 0) -> Coverage:
    """Coverage of `trace` (already cut to the window, or not: samples outside are ignored)."""
    t = trace.time[(trace.time >= start) & (trace.time <= end) & trace.rows_with_data()]
    span = max(end - start, 0.0)
    missing = trace.missing_signals()
    if t.size < 2:
        gap = span
        return Coverage(
            start,
            end,
            int(t.size),
            float("nan"),
            1,
            gap,
            gap,
            0.0 if span else 1.0,
            missing,
            windows,
            windows_judged,
        )
    t = np.sort(t)
    dt = np.diff(t)
    pos = dt[dt > 0]
    step = float(np.median(pos)) if pos.size else 0.0
    big = dt[dt > GAP_FACTOR * step] if step > 0 else dt[:0]
    # A gap's uncovered part is what lies beyond one normal step; the window's empty edges count whole.
    inner = float(np.sum(big - step))
    edges = [max(float(t[0] - start) - step, 0.0), max(float(end - t[-1]) - step, 0.0)]
    n_gaps = int(big.size) + sum(e > 0 for e in edges)
    gap_s = inner + sum(edges)
    longest = max([float(big.max() - step) if big.size else 0.0, *edges])
    frac = 1.0 - gap_s / span if span > 0 else 1.0
    return Coverage(
        start,
        end,
        int(t.size),
        1.0 / step if step > 0 else float("nan"),
        n_gaps,
        gap_s,
        longest,
        max(0.0, min(1.0, frac)),
        missing,
        windows,
        windows_judged,
    )
