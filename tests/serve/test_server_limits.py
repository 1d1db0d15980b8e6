"""The served app's header-read timeout and connection limit, over real sockets against real uvicorn."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from phasescope.serve.agent import Agent
from phasescope.serve.app import build_app
from phasescope.serve.server import MAX_CONNECTIONS, BackgroundServer, bind, uvicorn_config
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from tests.live_helpers import ticks
from tests.serve.conftest import MIGRATION_RUN, feed

TIMEOUT_S = 1.0  # short, so the test is quick; serve uses HEADER_TIMEOUT_S
SLOW_CLIENTS = 40


@pytest.fixture(scope="module")
def served(shared_data: Path) -> Iterator[BackgroundServer]:
    traces = read(shared_data / MIGRATION_RUN)
    agent = Agent(ReplaySource(traces), 1.0)
    feed(agent, ticks(traces, stop=10))
    server = BackgroundServer(build_app(agent), bind("127.0.0.1", 0), log_level="critical",
                              header_timeout_s=TIMEOUT_S)
    server.start()
    yield server
    server.stop()


def _connect(server: BackgroundServer) -> socket.socket:
    host, port = server.sock.getsockname()[:2]
    return socket.create_connection((host, port), timeout=10)


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes `s` (EOF or reset) within `seconds`, reading whatever it sends first."""
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _response(s: socket.socket) -> bytes:
    """One whole HTTP response read from `s` (its headers and Content-Length bytes of body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(x.split(b":", 1) for x in head.lower().split(b"\r\n")[1:])
    length = int(fields[b"content-length"])
    while len(body) < length:
        body += s.recv(4096)
    return head


def _get(server: BackgroundServer, path: str) -> int:
    with urllib.request.urlopen(server.url + path.lstrip("/"), timeout=10) as r:
        r.read()
        return int(r.status)


def test_clients_that_never_finish_their_headers_are_dropped(served: BackgroundServer) -> None:
    """Each slow client sends part of a request line and headers, then nothing (or a byte at a time):
    all are closed soon after the timeout, and a normal client is served meanwhile."""
    t0 = time.monotonic()
    slow = [_connect(served) for _ in range(SLOW_CLIENTS)]
    for s in slow:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert _get(served, "/healthz") == 200  # the slow ones hold nobody up
    dribbler, sent = _connect(served), time.monotonic()
    with pytest.raises(OSError):  # data keeps coming, a byte a tenth of the timeout, but never the headers
        for ch in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            dribbler.sendall(bytes([ch]))
            time.sleep(TIMEOUT_S / 10)
    assert time.monotonic() - sent < 3 * TIMEOUT_S
    assert all(_closed_within(s, 3 * TIMEOUT_S) for s in slow)
    assert time.monotonic() - t0 < 6 * TIMEOUT_S
    for s in [*slow, dribbler]:
        s.close()


def test_a_kept_alive_connection_is_timed_again_for_its_next_request(served: BackgroundServer) -> None:
    """After a response, data of a next request stops uvicorn's keep-alive timer: its headers, left
    unfinished, must still be cut."""
    s = _connect(served)
    s.settimeout(10)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _response(s).startswith(b"HTTP/1.1 200")
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    assert _closed_within(s, 3 * TIMEOUT_S)
    s.close()


def test_a_normal_client_is_served_slower_than_the_timeout_in_total(served: BackgroundServer) -> None:
    """Only the headers are timed: a client whose headers arrive in time keeps its connection for the
    next request while uvicorn's keep-alive allows."""
    s = _connect(served)
    s.settimeout(10)
    for _ in range(3):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(s).startswith(b"HTTP/1.1 200")
        time.sleep(TIMEOUT_S * 0.6)  # 3 x 0.6 > 1: the clock restarts at each response
    s.close()


def test_the_server_caps_its_connections() -> None:
    assert uvicorn_config(object()).limit_concurrency == MAX_CONNECTIONS
