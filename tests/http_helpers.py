"""A local HTTP server in a thread, for tests that need a real endpoint (metrics, a fake Prometheus), and
Starlette's TestClient for the in-process apps."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

with warnings.catch_warnings():  # starlette warns that its TestClient will move to httpx2; today's works
    warnings.simplefilter("ignore", UserWarning)  # StarletteDeprecationWarning is a UserWarning
    from starlette.testclient import TestClient

__all__ = ["TestClient", "serving"]


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free local port; yields the base URL (`http://127.0.0.1:PORT`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
