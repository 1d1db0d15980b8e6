"""The web server under `phasescope serve`, `demo` and `fleet --serve`: binding, uvicorn, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from typing import Any

from phasescope.errors import SourceError

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}
STOP_WAIT_S = 2  # seconds a stopping server gives open connections (live streams) before closing them
# A client gets this long from connecting (or from its previous response) to finish a request's headers:
# uvicorn has no such limit, and 300 clients that never finish theirs held 300 connections for 40 s+.
HEADER_TIMEOUT_S = 10.0
# Open connections (live streams included) past which a request is answered 503 at once; under the usual
# 1024 open files, so the server can still take and refuse a connection rather than fail to accept it.
MAX_CONNECTIONS = 500
# uvicorn's own loop wakes ten times a second to refresh the Date header (once a second) and to see a stop;
# an idle agent then spends more CPU there than on sampling. Once a second does the first; a stop wakes it.
SERVER_TICK_S = 1.0


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def header_timeout_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (h11 or httptools, as uvicorn picks), which closes a connection
    whose request headers are not complete `timeout_s` after it opened or after its previous response.
    The clock is not reset by data: a client sending one byte at a time is dropped too."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Protocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _waiting_after: Any = None  # the request cycle before the one whose headers are awaited

        def _await_headers(self) -> None:
            # uvicorn makes a new cycle once a request's headers are in: until then, they are late.
            self._cancel_header_timer()
            self._waiting_after = self.cycle
            self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.cycle is self._waiting_after and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._waiting_after:
                self._cancel_header_timer()

        def on_response_complete(self) -> None:
            # Armed first: a pipelined request that super() starts at once has its headers already.
            self._await_headers()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

    return Protocol


def uvicorn_config(app: Any, log_level: str = "warning", header_timeout_s: float = HEADER_TIMEOUT_S) -> Any:
    """How both `serve` and the demo run the app. The graceful-shutdown timeout is the backstop for a
    request that outlives the stop (open /api/stream connections end by themselves: make_server); the
    header timeout and the connection limit keep slow or many clients from holding the server."""
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                          timeout_graceful_shutdown=STOP_WAIT_S, limit_concurrency=MAX_CONNECTIONS,
                          http=header_timeout_protocol(header_timeout_s))


def url_of(sock: socket.socket) -> str:
    addr = sock.getsockname()
    shown = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
    return f"http://{shown}:{addr[1]}/"


def make_server(app: Any, log_level: str = "warning", header_timeout_s: float = HEADER_TIMEOUT_S) -> Any:
    """A uvicorn server for `app` that, as it shuts down, first tells the app's live streams to end (they
    would otherwise run into the grace timeout and be cancelled, with a traceback in the log)."""
    import uvicorn

    class Server(uvicorn.Server):
        _wake: asyncio.Event | None = None  # set when a stop is asked, so main_loop sees it at once
        _loop: asyncio.AbstractEventLoop | None = None
        _exit = False

        @property
        def should_exit(self) -> bool:
            return self._exit

        @should_exit.setter
        def should_exit(self, value: bool) -> None:
            # Set by uvicorn's signal handler, or by BackgroundServer.stop from another thread.
            self._exit = value
            if value and self._wake is not None and self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to wake
                    self._loop.call_soon_threadsafe(self._wake.set)

        async def main_loop(self) -> None:
            self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
            # counter 0: uvicorn's on_tick refreshes the Date header on every call, then says whether to stop
            while not await self.on_tick(0):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), SERVER_TICK_S)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            closing = getattr(app.state, "closing", None)
            if closing is not None:
                closing.set()
            await super().shutdown(sockets)

    return Server(uvicorn_config(app, log_level, header_timeout_s))


class BackgroundServer:
    """The app served on `sock` from a daemon thread, beside a view that owns the main thread (the demo)."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        log_level: str = "warning",
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        self.sock = sock
        self.url = url_of(sock)
        self.server = make_server(app, log_level, header_timeout_s)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="phasescope-web", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(STOP_WAIT_S + 3.0)
        self.sock.close()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one clear line saying why not (port taken, no such address)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        raise SourceError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock
