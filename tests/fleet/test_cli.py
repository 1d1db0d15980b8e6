"""`phasescope fleet` bad input and unreachable servers: one line, non-zero exit, no traceback."""

from __future__ import annotations

import pytest

from phasescope.cli import main


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--prometheus", "http://127.0.0.1:9", "--timeout", "2"], "cannot reach the Prometheus API"),
        (["--prometheus", "prometheus:9090"], "--prometheus: URL: expected http(s)://"),
        (["--prometheus", "http://127.0.0.1:9", "--since", "an hour"], "--since: duration"),
        (["--prometheus", "http://127.0.0.1:9", "--shard", "3/3"], "--shard: shard: expected I/N"),
        (["--prometheus", "http://127.0.0.1:9", "--selector", 'up{a="b"}'], "--selector"),
        (["--prometheus", "http://127.0.0.1:9", "--end", "yesterday"], "--end: time"),
    ],
)
def test_errors_are_one_line(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fleet", *args])
    err = capsys.readouterr().err
    assert code != 0
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
