"""The web server under `phasescope serve`, `demo` and `fleet --serve`: binding, uvicorn, clean shutdown."""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

from phasescope.errors import SourceError

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}
STOP_WAIT_S = 2  # seconds a stopping server gives open connections (live streams) before closing them


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def uvicorn_config(app: Any, log_level: str = "warning") -> Any:
    """How both `serve` and the demo run the app. The graceful-shutdown timeout is the backstop for a
    request that outlives the stop (open /api/stream connections end by themselves: make_server)."""
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                          timeout_graceful_shutdown=STOP_WAIT_S)


def url_of(sock: socket.socket) -> str:
    addr = sock.getsockname()
    shown = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
    return f"http://{shown}:{addr[1]}/"


def make_server(app: Any, log_level: str = "warning") -> Any:
    """A uvicorn server for `app` that, as it shuts down, first tells the app's live streams to end (they
    would otherwise run into the grace timeout and be cancelled, with a traceback in the log)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            closing = getattr(app.state, "closing", None)
            if closing is not None:
                closing.set()
            await super().shutdown(sockets)

    return Server(uvicorn_config(app, log_level))


class BackgroundServer:
    """The app served on `sock` from a daemon thread, beside a view that owns the main thread (the demo)."""

    def __init__(self, app: Any, sock: socket.socket, log_level: str = "warning") -> None:
        self.sock = sock
        self.url = url_of(sock)
        self.server = make_server(app, log_level)
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
