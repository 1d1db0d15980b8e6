"""`scan` in worker processes: batches cut for the workers, and a failure inside a worker reaching the
user as one line (the error crosses the process boundary)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from tests.http_helpers import serving

from phasescope.classify.model import PhaseModel
from phasescope.cli import main
from phasescope.errors import SourceError
from phasescope.fleet.collect import plan_fetch
from phasescope.fleet.scan import ScanOptions, scan
from phasescope.prom.client import PromClient
from phasescope.prom.names import SIGNAL_METRICS

DEVICES = [f"GPU-{i}" for i in range(6)]


class _Fake(BaseHTTPRequestHandler):
    """Lists six devices, has no limits, and refuses every range query."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status = 200
        doc: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": []}}
        if self.path.startswith("/api/v1/series"):
            power = SIGNAL_METRICS["power"].name
            doc = {
                "status": "success",
                "data": [{"__name__": power, "uuid": u, "host": "h"} for u in DEVICES],
            }
        elif self.path.startswith("/api/v1/query_range"):
            status = 422
            doc = {"status": "error", "errorType": "execution", "error": "boom from the fake server"}
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_prometheus() -> Iterator[str]:
    with serving(_Fake) as url:
        yield url


def test_batches_are_cut_for_the_workers(fake_prometheus: str) -> None:
    with PromClient(fake_prometheus) as c:
        one = plan_fetch(c, start=0.0, end=599.0, parts=1)
        four = plan_fetch(c, start=0.0, end=599.0, parts=4)
        capped = plan_fetch(c, start=0.0, end=599.0, parts=1, max_samples=1200)
    assert len(one.batches) == 1 and one.n_points == 600
    assert len(four.batches) >= 4 and sorted(d.key for b in four.batches for d in b) == DEVICES
    assert [len(b) for b in capped.batches] == [2, 2, 2]  # 600 samples per device, 1,200 per query


def test_a_failing_worker_is_one_line(fake_prometheus: str, model: PhaseModel) -> None:
    with pytest.raises(SourceError, match="boom from the fake server"):
        scan(ScanOptions(fake_prometheus, since_s=600, end=1e9, workers=2), model=model)


def test_a_failing_worker_through_the_cli(fake_prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fleet", "--prometheus", fake_prometheus, "--workers", "2", "--end", "1000000000"])
    err = capsys.readouterr().err
    assert code != 0
    assert (
        "boom from the fake server" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    )
