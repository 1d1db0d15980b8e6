"""The server's own loop at rest: it wakes once a second, not ten times, yet stops at once when asked, and
still sends a current Date header. Real uvicorn on a real socket."""

from __future__ import annotations

import time
import urllib.request
from email.utils import parsedate_to_datetime

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from phasescope.serve.server import SERVER_TICK_S, BackgroundServer, bind


def _app() -> Starlette:
    return Starlette(routes=[Route("/", lambda _request: PlainTextResponse("ok"))])


def test_idle_loop_wakes_once_a_tick_and_stops_at_once() -> None:
    server = BackgroundServer(_app(), bind("127.0.0.1", 0), log_level="critical")
    ticks: list[float] = []
    on_tick = server.server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(time.monotonic())
        return bool(await on_tick(counter))

    server.server.on_tick = counted
    server.start()
    try:
        deadline = time.monotonic() + 10
        while not server.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.server.started
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert r.read() == b"ok"
            sent = parsedate_to_datetime(r.headers["date"]).timestamp()
        assert abs(sent - time.time()) < SERVER_TICK_S + 1.0  # the Date header is kept current
        before = len(ticks)
        time.sleep(3.0)
        woke = len(ticks) - before
        # uvicorn's own loop wakes every 0.1 s (30 times here); ours once per SERVER_TICK_S
        assert 2 <= woke <= 3.0 / SERVER_TICK_S + 1, woke
    finally:
        began = time.monotonic()
        server.stop()
        stopped_in = time.monotonic() - began
    assert not server.thread.is_alive()
    assert stopped_in < 0.5 * SERVER_TICK_S, f"stop took {stopped_in:.2f} s: the loop did not wake"
