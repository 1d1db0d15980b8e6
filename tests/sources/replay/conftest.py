"""Helpers for the reader tests: real files from shared data, and small bad files written to tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope.errors import InputError


def expect_input_error(fn, *args, match: tuple[str, ...] = (), **kwargs) -> InputError:  # type: ignore[no-untyped-def]
    """Call fn, require an InputError whose one-line message contains every string in `match`."""
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    for part in match:
        assert part in msg, f"{part!r} not in {msg!r}"
    return info.value


@pytest.fixture
def write(tmp_path: Path):  # type: ignore[no-untyped-def]
    """write(name, text_or_bytes) -> Path of a new file in tmp_path."""

    def _write(name: str, content: str | bytes) -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8", newline="")
        return p

    return _write
