"""Progress of the long commands: plain lines off a terminal, nothing when quiet."""

from __future__ import annotations

import io

from phasescope.classify.lab.progress import steps


def test_plain_lines_on_a_pipe() -> None:
    buf = io.StringIO()
    with steps(2, stream=buf) as step:
        step.phase("loading")
        step("fold 1")
        step("fold 2")
    assert buf.getvalue().splitlines() == ["  loading", "  fold 1", "  fold 2"]
    assert step.done == 2


def test_quiet_says_nothing() -> None:
    buf = io.StringIO()
    with steps(1, quiet=True, stream=buf) as step:
        step("fold 1")
    assert buf.getvalue() == "" and step.done == 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_on_a_terminal_is_transient() -> None:
    buf = _Tty()
    with steps(3, stream=buf) as step:
        for i in range(3):
            step(f"fold {i}")
    assert step.done == 3
    text = buf.getvalue()
    assert "\x1b[" in text  # drawn as a live bar (control sequences), not as plain lines
    assert "  fold 0\n" not in text
