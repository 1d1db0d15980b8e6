"""The Starlette app of `phasescope serve`: dashboard page, JSON API, live stream, plotly.js and `/metrics`.

`/api/stream` is the page's live feed: Server-Sent Events, one `/api/update` body per new tick, each with
the newest chart time as its event id, so a reconnecting EventSource resumes where it was (Last-Event-ID).
It is gzipped by itself, flushed after each event (GZipMiddleware would hold events back), with one
compressor for the whole connection, so each update compresses against the ones before it.

Auth: with a token, every route needs it (`Authorization: Bearer TOKEN`, or `?token=TOKEN` once, which
sets an HttpOnly same-site cookie so the page's own requests carry it). `/metrics` follows its own switch:
public by default (Prometheus scrapes it), or token-protected with `metrics_token=True`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from phasescope.prom.exposition import TextWriter
from phasescope.serve.agent import CHART_SIGNALS, Agent
from phasescope.serve.collector import registry_for
from phasescope.serve.page import render

COOKIE = "phasescope_token"
KEEPALIVE_S = 15.0  # a comment line this often on a quiet stream, so proxies and browsers keep it open
PLOTLY_PATH = "static/plotly.min.js"
Endpoint = Callable[[Request], Awaitable[Response]]


@lru_cache(maxsize=1)
def plotly_js() -> bytes:
    """plotly.min.js from the installed plotly wheel's package data."""
    return resources.files("plotly").joinpath("package_data", "plotly.min.js").read_bytes()


def _token_of(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.query_params.get("token") or request.cookies.get(COOKIE, "")


def _guard(endpoint: Endpoint, token: str | None) -> Endpoint:
    """`endpoint`, answering 401 unless the request carries `token` (no-op when token is None)."""
    if not token:
        return endpoint
    expected = token.encode()

    async def guarded(request: Request) -> Response:
        if not hmac.compare_digest(_token_of(request).encode(), expected):
            return PlainTextResponse(
                "phasescope: this server needs its token (Authorization: Bearer TOKEN, or ?token=TOKEN)\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="phasescope"'},
            )
        response = await endpoint(request)
        if request.query_params.get("token"):  # remember it, so the page's own fetches need not carry it
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    return guarded


def _dumps(data: Any) -> str:
    # allow_nan=False: a NaN that slipped through is a bug to see, not invalid JSON to ship.
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def _json(data: Any) -> Response:
    return Response(_dumps(data), media_type="application/json", headers={"Cache-Control": "no-store"})


def _since(request: Request) -> float:
    raw = request.query_params.get("since")
    if raw is None or raw == "":
        return -math.inf
    value = float(raw)  # ValueError -> 400 below
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def _resume_from(request: Request) -> float:
    """Where a stream starts: after the Last-Event-ID a reconnecting EventSource sends, else `?since=`."""
    last = request.headers.get("last-event-id", "")
    try:
        value = float(last)
    except ValueError:
        return _since(request)
    return value if math.isfinite(value) else _since(request)


def _newest(history: dict[str, Any], since: float) -> float:
    ends = [h["t"][-1] for h in history.values() if h["t"]]
    return max([since, *ends])


class _Updates:
    """Each tick's update encoded once for every open stream: the state once per tick, the history once per
    (tick, since), which streams that have kept up all share. Used from the event loop only."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.version = -1
        self.state = ""
        self.history: dict[float, tuple[str, float]] = {}

    def body(self, version: int, since: float) -> tuple[str, float]:
        """(the update's JSON, its newest chart time) for a stream that holds points up to `since`."""
        if version != self.version:
            self.version, self.state, self.history = version, _dumps(self.agent.snapshot()), {}
        hit = self.history.get(since)
        if hit is None:
            history = self.agent.history(since)
            hit = self.history[since] = (_dumps(history), _newest(history, since))
        return f'{{"state":{self.state},"history":{hit[0]}}}', hit[1]


async def _events(
    agent: Agent, updates: _Updates, since: float, period_s: float, closing: threading.Event
) -> AsyncIterator[str]:
    """An update whenever the agent's state moved (checked every `period_s`), a keep-alive otherwise;
    ends when the server is `closing`, so it can stop without cancelling the stream."""
    seen = -1
    quiet = 0.0
    while not closing.is_set():
        version = agent.state.version
        if version != seen:
            seen = version
            body, since = updates.body(version, since)
            yield f"id: {since!r}\ndata: {body}\n\n"
            quiet = 0.0
        elif quiet >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            quiet = 0.0
        await asyncio.sleep(period_s)
        quiet += period_s


async def _gzipped(events: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """`events` as one gzip stream, flushed after each so the browser can decode it as it arrives."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    async for event in events:
        yield packer.compress(event.encode()) + packer.flush(zlib.Z_SYNC_FLUSH)
    yield packer.flush()  # the server is closing: end the gzip stream properly


def build_app(
    agent: Agent,
    *,
    token: str | None = None,
    metrics_token: bool = False,
    host_label: str = "",
    pricing_note: str = "",
) -> Starlette:
    """The web app over a running (or about to run) `agent`."""
    registry = registry_for(agent, host_label)
    closing = threading.Event()  # set by the server as it stops (cli/serve.py): open streams end
    updates = _Updates(agent)
    writer = TextWriter()
    refresh_ms = int(min(1000.0, max(250.0, agent.interval_s * 1000.0)))
    page = render(
        agent.source.name,
        PLOTLY_PATH,
        {
            "signals": list(CHART_SIGNALS),
            "max_points": agent.state.capacity,
            "refresh_ms": refresh_ms,
            "pricing": pricing_note,
        },
    )

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def plotly(request: Request) -> Response:
        return Response(plotly_js(), media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})

    async def state(request: Request) -> Response:
        return _json(agent.snapshot())

    async def history(request: Request) -> Response:
        try:
            since = _since(request)
        except ValueError:
            return PlainTextResponse("phasescope: since: expected a number (Unix seconds)\n", status_code=400)
        return _json(agent.history(since))

    async def update(request: Request) -> Response:
        try:
            since = _since(request)
        except ValueError:
            return PlainTextResponse("phasescope: since: expected a number (Unix seconds)\n", status_code=400)
        return _json({"state": agent.snapshot(), "history": agent.history(since)})

    async def stream(request: Request) -> Response:
        try:
            since = _resume_from(request)
        except ValueError:
            return PlainTextResponse("phasescope: since: expected a number (Unix seconds)\n", status_code=400)
        events = _events(agent, updates, since, refresh_ms / 1000.0, closing)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "Vary": "Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            headers["Content-Encoding"] = "gzip"
            return StreamingResponse(_gzipped(events), media_type="text/event-stream", headers=headers)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def metrics(request: Request) -> Response:
        return Response(writer.render(registry.collect()), media_type=CONTENT_TYPE_LATEST)

    async def health(request: Request) -> Response:
        return JSONResponse({"up": agent.source_up(), "ticks": agent.state.ticks})

    routes = [
        Route("/", _guard(index, token)),
        Route(f"/{PLOTLY_PATH}", _guard(plotly, token)),
        Route("/api/state", _guard(state, token)),
        Route("/api/history", _guard(history, token)),
        Route("/api/update", _guard(update, token)),
        Route("/api/stream", _guard(stream, token)),
        Route("/healthz", _guard(health, token)),
        Route("/metrics", _guard(metrics, token if metrics_token else None)),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(GZipMiddleware, minimum_size=1024),
                                               Middleware(RelativeRedirects)])
    app.state.closing = closing
    return app


class RelativeRedirects:
    """ASGI middleware: a redirect's Location keeps only its path and query. Starlette's trailing-slash
    redirect (`/api/state/` -> `/api/state`) builds an absolute URL from the request's Host header, so a
    forged Host would send the browser elsewhere; a relative one cannot leave this server."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def relative(message: Any) -> None:
            if message["type"] == "http.response.start" and 300 <= message["status"] < 400:
                message = dict(message, headers=[
                    (k, _path_only(v) if k.lower() == b"location" else v) for k, v in message["headers"]
                ])
            await send(message)

        await self.app(scope, receive, relative)


def _path_only(location: bytes) -> bytes:
    from urllib.parse import urlsplit

    parts = urlsplit(location.decode("latin-1"))
    path = parts.path if parts.path.startswith("/") else "/" + parts.path
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")
