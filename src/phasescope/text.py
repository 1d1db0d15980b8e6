"""Plain-text safety shared by the sources and the views: cutting a string to a width, and making text from
another process (argv, names) safe to put on a terminal.

It sits below both: `sources.host` sanitises what it reads once, at first sight of a process, and every view
(`display`, which re-exports these, the TUI, the tables) cuts and escapes what it shows, with the same rules.
"""

from __future__ import annotations

import re


def ellipsize(text: str, width: int) -> str:
    """`text` in at most `width` characters, an ellipsis marking a cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


# C0 and C1 control characters, DEL, and the bidi overrides/isolates ("Trojan source"): from a process's argv
# or name they would reach the terminal raw (an ESC starts a cursor move, a screen clear or a title change;
# a newline breaks a one-line row), so `printable` writes them as visible escapes.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` safe to put on a terminal: each control character as a visible escape (ESC -> \\x1b)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
