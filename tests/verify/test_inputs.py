from __future__ import annotations

import pytest

from phasescope.errors import InputError
from phasescope.verify.inputs import parse_time


def test_time_forms() -> None:
    now = 1_800_000_000.0
    assert parse_time("10m", "--since", now) == now - 600
    assert parse_time("-2h", "--since", now) == now - 7200
    assert parse_time("1d", "--since", now) == now - 86400
    assert parse_time("1700000000.5", "--since", now) == 1_700_000_000.5
    assert parse_time("2023-11-14T22:13:20Z", "--since", now) == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20", "--since", now) == 1_700_000_000.0  # no zone: UTC
    with pytest.raises(InputError, match="--until: time: expected Unix s"):
        parse_time("soon", "--until", now)
