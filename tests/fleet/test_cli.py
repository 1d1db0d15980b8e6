"""`phasescope fleet` bad input and unreachable servers: one line, non-zero exit, no traceback."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest
from tests.http_helpers import serving

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


class _Empty(BaseHTTPRequestHandler):
    """A Prometheus that holds no GPU series."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        empty = {"resultType": "matrix", "result": []}
        data: object = [] if self.path.startswith("/api/v1/series") else empty
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args: object) -> None:
        pass


def test_nothing_found_names_the_window_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """With --end the window is not "the last 10m" (what the line used to say): it names the range."""
    with serving(_Empty) as url:
        assert main(["fleet", "--prometheus", url, "--since", "10m", "--end", "2026-12-01T12:00:00Z"]) == 0
        out = " ".join(capsys.readouterr().out.split())  # rich wraps at 80 columns off a terminal
        assert f"no GPU series found at {url} from 2026-12-01 11:50:00 UTC to 2026-12-01 12:00:00 UTC" in out
        assert main(["fleet", "--prometheus", url, "--since", "10m"]) == 0
        assert f"no GPU series found at {url} in the last 10m" in " ".join(capsys.readouterr().out.split())


def test_otlp_without_serve_is_refused() -> None:
    from click.testing import CliRunner

    from phasescope.cli.fleet import command as fleet_command

    r = CliRunner().invoke(fleet_command, ["--prometheus", "http://127.0.0.1:9", "--otlp-endpoint",
                                           "http://127.0.0.1:4318"])
    assert r.exit_code == 2 and "--otlp-endpoint" in r.output and "--serve" in r.output
