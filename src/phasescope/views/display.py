"""Text formatting shared by every human-facing view (TUI, plain tables): values, units, sparklines.

Missing is NaN everywhere in phasescope; here it becomes the one visible mark MISSING ("–"), never a 0.
"""

from __future__ import annotations

import math

import numpy as np

from phasescope.schema import SIGNALS, FloatArray
from phasescope.text import ellipsize as ellipsize  # re-exported: the views' one import for text
from phasescope.text import printable as printable

MISSING = "–"  # en dash: what a view shows for a value the source did not give
_BLOCKS = "▁▂▃▄▅▆▇█"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def fmt_ratio(value: float | None) -> str:
    return f"{value * 100:.0f}%" if _finite(value) else MISSING  # type: ignore[operator]


def fmt_bytes(value: float | None) -> str:
    """Binary units, as nvidia-smi and top show memory."""
    if not _finite(value):
        return MISSING
    v = float(value)  # type: ignore[arg-type]
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024.0 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit in ("B", "KiB") else f"{v:.1f} {unit}"
        v /= 1024.0
    return MISSING  # unreachable; keeps mypy happy


def fmt_rate(value: float | None) -> str:
    """Throughput in decimal units (PCIe, NVLink are specified that way)."""
    if not _finite(value):
        return MISSING
    v = float(value)  # type: ignore[arg-type]
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(v) < 1000.0 or unit == "GB/s":
            return f"{v:.0f} {unit}" if unit in ("B/s", "kB/s") else f"{v:.1f} {unit}"
        v /= 1000.0
    return MISSING


def fmt_watts(value: float | None) -> str:
    return f"{value:.0f} W" if _finite(value) else MISSING


def fmt_celsius(value: float | None) -> str:
    return f"{value:.0f}°C" if _finite(value) else MISSING


def fmt_hertz(value: float | None) -> str:
    return f"{value / 1e6:.0f} MHz" if _finite(value) else MISSING  # type: ignore[operator]


def fmt_count(value: float | None) -> str:
    return f"{value:.0f}" if _finite(value) else MISSING


def fmt_bitmask(value: float | None) -> str:
    return f"0x{int(value):x}" if _finite(value) else MISSING  # type: ignore[arg-type]


_BY_UNIT = {
    "ratio": fmt_ratio,
    "bytes": fmt_bytes,
    "bytes_per_second": fmt_rate,
    "watts": fmt_watts,
    "celsius": fmt_celsius,
    "hertz": fmt_hertz,
    "joules": lambda v: f"{v / 1e3:.1f} kJ" if _finite(v) else MISSING,
    "bitmask": fmt_bitmask,
}


def fmt_signal(signal: str, value: float | None) -> str:
    """Format a value in the base unit schema.py gives `signal`."""
    return _BY_UNIT[SIGNALS[signal].unit](value)


def fmt_pair(a: str, b: str) -> str:
    """'a / b', or the one missing mark when both are missing."""
    return MISSING if a == MISSING and b == MISSING else f"{a} / {b}"


def sparkline(values: FloatArray, width: int, lo: float | None = None, hi: float | None = None) -> str:
    """The last `width` values as block characters; a missing sample is a blank, the padding is too.

    `lo`/`hi` fix the scale (e.g. 0..1 for a ratio, 0..power limit); by default the finite range is used.
    """
    if width <= 0:
        return ""
    tail = np.asarray(values, dtype=np.float64)[-width:]
    pad = " " * (width - tail.size)
    finite = np.isfinite(tail)
    if not finite.any():
        return pad + " " * tail.size
    low = float(np.min(tail[finite])) if lo is None else lo
    high = float(np.max(tail[finite])) if hi is None else hi
    span = high - low
    if span <= 0:
        # A flat line: draw it at the bottom for 0-ish values, mid-height otherwise.
        level = np.where(finite, 0 if abs(low) < 1e-12 else 3, -1)
    else:
        scaled = np.clip((np.where(finite, tail, low) - low) / span, 0.0, 1.0)
        level = np.where(finite, np.minimum((scaled * len(_BLOCKS)).astype(int), len(_BLOCKS) - 1), -1)
    return pad + "".join(_BLOCKS[i] if i >= 0 else " " for i in level.tolist())


def fmt_usd(value: float | None) -> str:
    """Dollars; small amounts keep three significant digits ($0.0000449, not $0.00)."""
    if not _finite(value):
        return MISSING
    v = float(value)  # type: ignore[arg-type]
    if v == 0 or abs(v) >= 1:
        return f"${v:,.2f}"
    return f"${v:.{max(2, 2 - math.floor(math.log10(abs(v))))}f}"


def fmt_seconds(value: float | None) -> str:
    """A duration: µs, ms under a second, s under two minutes, then m and h."""
    if not _finite(value):
        return MISSING
    v = float(value)  # type: ignore[arg-type]
    if v == 0:  # a span from the start, a one-sample trace: "0 s", not "0 µs"
        return "0 s"
    if abs(v) < 1e-3:
        return f"{v * 1e6:.0f} µs"
    if abs(v) < 0.01:
        return f"{v * 1e3:.1f} ms"
    if abs(v) < 1:
        return f"{v * 1e3:.0f} ms"
    if abs(v) < 120:
        return f"{v:.1f} s"
    if abs(v) < 7200:
        return f"{v / 60:.1f} m"
    return f"{v / 3600:.1f} h"


def fmt_si(value: float | None) -> str:
    """A count or rate with an SI suffix and three significant digits: 987, 40.2k, 1.35M."""
    if not _finite(value):
        return MISSING
    v = float(value)  # type: ignore[arg-type]
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def fmt_elapsed(value: float | None) -> str:
    """How long a process has run, as ps/top show it but shorter: 42s, 12m05s, 3h12m, 2d03h."""
    if value is None or not math.isfinite(value) or value < 0:
        return MISSING
    s = int(value)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
