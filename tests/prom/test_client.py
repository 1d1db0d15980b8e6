"""The Prometheus API client: columnar decoding of range answers, splitting, and one-line errors."""

from __future__ import annotations

import gzip
import json
import re
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import httpx
import numpy as np
import pytest

from phasescope.errors import InputError, SourceError
from phasescope.prom.client import MAX_POINTS, PromClient, parse_matrix, selector_body
from phasescope.schema import Trace
from tests.http_helpers import serving


def _answer(series: list[tuple[dict[str, str], np.ndarray, np.ndarray]], indent: int | None = None) -> bytes:
    """A range answer as Prometheus writes it (values are strings; Go's float formatting)."""
    result = [
        {
            "metric": labels,
            "values": [
                [float(t), "NaN" if np.isnan(v) else repr(float(v))] for t, v in zip(ts, vs, strict=True)
            ],
        }
        for labels, ts, vs in series
    ]
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    sep = (",", ":") if indent is None else None
    return json.dumps(doc, indent=indent, separators=sep).encode()


def test_parse_matrix_matches_json_on_real_values(fleet_traces: dict[str, Trace]) -> None:
    t = fleet_traces["training"]
    power = t["power"].copy()
    power[5] = np.nan  # a NaN sample as Prometheus spells it
    odd = {"__name__": "phasescope_gpu_power_watts", "uuid": "GPU-1", "note": 'has "values":[ and ]] inside'}
    body = _answer(
        [(odd, t.time, power), ({"__name__": "m", "uuid": "GPU-2"}, t.time[:3], t["gpu_util"][:3])]
    )
    got = parse_matrix(body)
    assert [s.labels for s in got] == [odd, {"__name__": "m", "uuid": "GPU-2"}]
    np.testing.assert_array_equal(got[0].time, t.time)
    np.testing.assert_array_equal(got[0].values, power)  # NaN where NaN
    np.testing.assert_array_equal(got[1].values, t["gpu_util"][:3])


def test_parse_matrix_other_layouts_and_empty(fleet_traces: dict[str, Trace]) -> None:
    t = fleet_traces["idle"]
    pretty = _answer([({"uuid": "GPU-x"}, t.time[:50], t["power"][:50])], indent=2)  # whitespace everywhere
    got = parse_matrix(pretty)
    np.testing.assert_array_equal(got[0].values, t["power"][:50])
    assert parse_matrix(_answer([])) == []
    # One line, spaces after the commas: the compact reading fails, the one that strips spaces does not.
    two = _answer(
        [({"uuid": "GPU-y"}, t.time[:40], t["power"][:40]), ({"uuid": "GPU-z"}, t.time[:2], t["power"][:2])]
    )
    spaced = parse_matrix(two.replace(b",", b", "))
    assert [s.labels for s in spaced] == [{"uuid": "GPU-y"}, {"uuid": "GPU-z"}]
    np.testing.assert_array_equal(spaced[0].values, t["power"][:40])
    np.testing.assert_array_equal(spaced[1].time, t.time[:2])
    # A series with no samples, then one with samples.
    empty = _answer(
        [({"uuid": "GPU-e"}, t.time[:0], t["power"][:0]), ({"uuid": "GPU-f"}, t.time[:3], t["power"][:3])]
    )
    got = parse_matrix(empty)
    assert [s.time.size for s in got] == [0, 3] and got[1].labels == {"uuid": "GPU-f"}
    np.testing.assert_array_equal(got[1].values, t["power"][:3])


def test_parse_matrix_errors_are_one_line() -> None:
    with pytest.raises(SourceError, match="bad_data: parse error"):
        parse_matrix(b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}')
    with pytest.raises(SourceError, match="expected a JSON API answer"):
        parse_matrix(b"<html>proxy error</html>")
    with pytest.raises(SourceError, match="expected a matrix"):
        parse_matrix(b'{"status":"success","data":{"resultType":"vector","result":[]}}')


def test_query_range_splits_long_ranges() -> None:
    calls: list[dict[str, str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        form = dict(x.split("=", 1) for x in req.content.decode().split("&"))
        calls.append(form)
        s, e = float(form["start"]), float(form["end"])
        ts = np.arange(s, e + 0.5, 1.0)
        return httpx.Response(200, content=_answer([({"uuid": "GPU-a"}, ts, np.ones(ts.size))]))

    with PromClient("http://prom:9090", transport=httpx.MockTransport(handler)) as c:
        got = c.query_range("up", 0.0, 25_000.0, 1.0)
    assert len(calls) == 3  # 11,000 points per piece at most
    assert all(float(c["end"]) - float(c["start"]) <= MAX_POINTS - 1 for c in calls)
    times = np.concatenate([s.time for s in got])
    np.testing.assert_array_equal(times, np.arange(0.0, 25_001.0))


def test_http_errors_become_source_errors() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(
            422, json={"status": "error", "errorType": "execution", "error": "too many samples"}
        )

    with (
        PromClient("http://prom:9090", transport=httpx.MockTransport(handler)) as c,
        pytest.raises(SourceError, match="HTTP 422: execution: too many samples"),
    ):
        c.series("{}", 0, 1)
    with PromClient("http://127.0.0.1:9", timeout_s=2) as c, pytest.raises(SourceError, match="cannot reach"):
        c.series("{}", 0, 1)
    with pytest.raises(InputError, match="--prometheus"):
        PromClient("prom:9090")


@pytest.mark.parametrize(
    ("call", "answer", "says"),
    [
        ("series", {"status": "success", "data": {"a": 1}}, "/api/v1/series: expected a list of label sets"),
        ("series", {"status": "success", "data": ["GPU-a"]}, "/api/v1/series: expected a list of label sets"),
        ("series", [1, 2], "/api/v1/series: expected a JSON API answer"),
        ("query", {"status": "success", "data": {"resultType": "vector", "result": [{"foo": 1}]}},
         "/api/v1/query: expected results of {metric, value"),
        ("query", {"status": "success", "data": {"resultType": "vector",
                                                 "result": [{"metric": {}, "value": [1, "soon"]}]}},
         "/api/v1/query: expected results of {metric, value"),
        ("query_range", [1, 2], "query_range: expected a JSON API answer"),
        ("query_range", {"status": "success", "data": {"resultType": "matrix", "result": [{"values": 3}]}},
         "query_range: expected series of {metric, values"),
    ],
)
def test_malformed_answers_are_one_line(call: str, answer: object, says: str) -> None:
    """A proxy or a half-compatible server answering 200 with the wrong shape: one line, not a traceback."""

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer)

    with PromClient("http://prom:9090", transport=httpx.MockTransport(handler)) as c:
        fn = {"series": lambda: c.series("{}", 0, 1), "query": lambda: c.query("up", 1),
              "query_range": lambda: c.query_range("up", 0, 1, 1)}[call]
        with pytest.raises(SourceError, match=re.escape(says)):
            fn()


@pytest.mark.parametrize(
    ("text", "body"),
    [("", ""), ('{namespace="ml"}', 'namespace="ml"'), ('host=~"a.*",gpu!="3"', 'host=~"a.*",gpu!="3"')],
)
def test_selector_body(text: str, body: str) -> None:
    assert selector_body(text) == body


@pytest.mark.parametrize("bad", ['up{job="x"}', "{namespace}", '{a="1"', "{{}}"])
def test_bad_selectors(bad: str) -> None:
    with pytest.raises(InputError, match="--selector"):
        selector_body(bad)


def _range_answer(n: int) -> bytes:
    ts = 1_700_000_000.0 + np.arange(n)
    return _answer([({"__name__": "m", "uuid": "GPU-a"}, ts, np.arange(n) * 1.5)])


class _Direct(BaseHTTPRequestHandler):
    """Answers over HTTP/1.1 as Prometheus does; each test case sets how (see the class attributes)."""

    protocol_version = "HTTP/1.1"
    hang_up_after = False  # close the kept-alive connection after answering, without saying so
    gzip = False  # compress although asked for identity, as a misconfigured proxy might
    silent = False  # close without answering at all
    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        form = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        type(self).seen.append(f"{self.path} {self.headers.get('Accept-Encoding')} {form[:20]}")
        if self.silent:
            self.close_connection = True
            return
        body = _range_answer(5)
        self.send_response(200)
        if self.gzip:
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.hang_up_after

    def log_message(self, *args: object) -> None:
        pass


def _direct_handler(**attrs: object) -> type[_Direct]:
    return type("Handler", (_Direct,), {"seen": [], **attrs})


def test_the_direct_path_reads_prometheus_answers() -> None:
    handler = _direct_handler()
    with serving(handler) as url, PromClient(url + "/prefix") as c:
        assert c._direct
        for _ in range(3):  # one kept-alive connection
            got = c.query_range("m", 1_700_000_000.0, 1_700_000_004.0, 1.0)
            np.testing.assert_array_equal(got[0].values, np.arange(5) * 1.5)
    assert len(handler.seen) == 3 and all(s.startswith("/prefix/api/v1/query_range identity query=m") for s in
                                          handler.seen)
    assert c.clock.calls == {"http": 3, "decode": 3}


def test_the_direct_path_reopens_a_connection_the_server_closed() -> None:
    handler = _direct_handler(hang_up_after=True)
    with serving(handler) as url, PromClient(url) as c:
        for _ in range(3):
            assert c.query_range("m", 1_700_000_000.0, 1_700_000_004.0, 1.0)[0].time.size == 5
    assert len(handler.seen) == 3  # each asked once: the stale connection's try never reached the server


def test_the_direct_path_unpacks_gzip_and_reports_a_silent_server() -> None:
    with serving(_direct_handler(gzip=True)) as url, PromClient(url) as c:
        assert c.query_range("m", 1_700_000_000.0, 1_700_000_004.0, 1.0)[0].values[-1] == 6.0
    with (
        serving(_direct_handler(silent=True)) as url,
        PromClient(url) as c,
        pytest.raises(SourceError, match=r"cannot reach the Prometheus API \(RemoteDisconnected"),
    ):
        c.query_range("m", 0, 1, 1)
    with pytest.raises(InputError, match=r"--prometheus: URL: expected http\(s\)"):
        PromClient("http://prom:nine")
