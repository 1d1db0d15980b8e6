"""The Starlette app of `phasescope serve`: dashboard page, JSON API, plotly.js and `/metrics`.

Auth: with a token, every route needs it (`Authorization: Bearer TOKEN`, or `?token=TOKEN` once, which
sets an HttpOnly same-site cookie so the page's own requests carry it). `/metrics` follows its own switch:
public by default (Prometheus scrapes it), or token-protected with `metrics_token=True`.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Awaitable, Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from phasescope.serve.agent import CHART_SIGNALS, Agent
from phasescope.serve.collector import registry_for
from phasescope.serve.exposition import TextWriter
from phasescope.serve.page import render

COOKIE = "phasescope_token"
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


def _json(data: Any) -> Response:
    # allow_nan=False: a NaN that slipped through is a bug to see, not invalid JSON to ship.
    body = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def _since(request: Request) -> float:
    raw = request.query_params.get("since")
    if raw is None or raw == "":
        return -math.inf
    value = float(raw)  # ValueError -> 400 below
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


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
        Route("/healthz", _guard(health, token)),
        Route("/metrics", _guard(metrics, token if metrics_token else None)),
    ]
    return Starlette(routes=routes, middleware=[Middleware(GZipMiddleware, minimum_size=1024)])
