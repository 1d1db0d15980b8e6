"""`phasescope fleet --serve`'s web side: the fleet page, `/metrics` and `/api/fleet` over a `FleetService`.

The service (fleet/service.py) runs the passes on its schedule; this module only shows its last one, so the
fleet never imports the web server (the layers in docs/design/layers.md).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from typing import Any

from phasescope.fleet.scan import ScanOptions
from phasescope.fleet.service import FleetService, metrics_text
from phasescope.fleet.summary import COLUMNS, phase_text, waste_usd_text
from phasescope.kpi.cost import Prices
from phasescope.serve.server import bind, make_server, url_of
from phasescope.views.palette import FAVICON, ORDER, PALETTE, look

# -- the fleet page ------------------------------------------------------------------------------


def _timeline(v: Any, start: float, end: float, width: int = 480) -> str:
    """The GPU's segments over [start, end] as one SVG bar."""
    span = max(end - start, 1e-9)
    rects = []
    for seg in v["segments"]:
        a = max(seg["start"], start)
        b = min(seg["end"], end)
        if b <= a:
            continue
        x = (a - start) / span * width
        w = max((b - a) / span * width, 0.5)
        p = look(seg["label"])
        rects.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="14" fill="{p.fill}"'
            f' data-phase="{html.escape(seg["label"])}">'
            f"<title>{html.escape(p.name)} {b - a:.0f}s</title></rect>"
        )
    return f'<svg width="{width}" height="14" role="img">{"".join(rects)}</svg>'


def page_html(service: FleetService) -> str:
    st = service.snapshot()
    r = st.result
    head = (
        "<!doctype html><meta charset=utf-8>" + FAVICON + "<title>phasescope fleet</title><style>"
        "body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}.n{text-align:right}"
        ".err{color:#b00}</style><h1>phasescope fleet</h1>"
    )
    if st.error:
        head += f'<p class="err">last pass failed: {html.escape(st.error)}</p>'
    if r is None:
        return head + "<p>first pass running…</p>"
    doc = r.to_dict()
    s = doc["summary"]
    w = s["waste"]
    parts = [
        head,
        f"<p>{s['gpus']} GPUs, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r.start))} to "
        f"{time.strftime('%H:%M:%S', time.gmtime(r.end))} UTC; shard {html.escape(r.shard or 'all')}; "
        f"pass {r.wall_s:.1f}s with {r.workers} worker(s) (query {r.query_s:.1f}s, "
        f"classify {r.classify_s:.1f}s summed over them).</p>",
        f"<p><b>held-idle waste:</b> {w['held_idle_gpu_hours']:.2f} GPU-hours, {w['held_idle_kwh']:.2f} kWh"
        + html.escape(waste_usd_text(r.verdicts))
        + "</p>",
        "<table><tr><th>phase</th>"
        + "".join(f"<th>{p}</th>" for p in COLUMNS)
        + "</tr><tr><td>GPUs</td>"
        + "".join(f'<td class="n">{s["phases"][p]}</td>' for p in COLUMNS)
        + "</tr></table><br>",
        "<table><tr><th>host</th><th>gpu</th><th>uuid</th><th>model</th><th>pod</th><th>phase</th>"
        "<th>conf</th><th>held-idle h</th><th>timeline</th></tr>",
    ]
    for v in sorted(doc["devices"], key=lambda d: (d["host"], d["gpu"] if d["gpu"] is not None else -1)):
        conf = "" if v["confidence"] is None else f"{v['confidence']:.2f}"
        pod = f"{v['namespace']}/{v['pod']}" if v["pod"] else ""
        parts.append(
            f"<tr><td>{html.escape(v['host'])}</td><td>{'' if v['gpu'] is None else v['gpu']}</td>"
            f"<td>{html.escape(v['uuid'])}</td><td>{html.escape(v['model'])}</td><td>{html.escape(pod)}</td>"
            f"<td>{html.escape(phase_text(v['label'], v['held']))}</td><td class=n>{conf}</td>"
            f"<td class=n>{v['held_idle_gpu_hours']:.2f}</td><td>{_timeline(v, r.start, r.end)}</td></tr>"
        )
    parts.append(
        "</table><p>"
        + " ".join(
            f'<span data-phase="{k}" style="{PALETTE[k].css()};padding:0 6px">'
            f"{html.escape(PALETTE[k].name)}</span>"
            for k in ORDER
        )
        + "</p>"
    )
    return "".join(parts)


def make_app(service: FleetService) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    async def metrics(_: Request) -> Response:
        return Response(metrics_text(service), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def page(_: Request) -> Response:
        return HTMLResponse(page_html(service))

    async def api(_: Request) -> Response:
        st = service.snapshot()
        if st.result is None:
            return JSONResponse({"error": st.error or "first pass running"}, status_code=503)
        return JSONResponse({**st.result.to_dict(), "error": st.error})

    return Starlette(routes=[Route("/", page), Route("/metrics", metrics), Route("/api/fleet", api)])


def run_service(
    opts: ScanOptions,
    *,
    every_s: float,
    host: str,
    port: int,
    prices: Callable[[str], Prices] | None = None,
    otlp_endpoint: str | None = None,
) -> None:
    import sys

    def say(line: str) -> None:
        print(f"phasescope: {line}", file=sys.stderr, flush=True)

    sock = bind(host, port)  # a taken port is one clear line, before any pass starts
    service = FleetService(opts, every_s, prices, say=say)
    try:
        if otlp_endpoint:
            from phasescope.fleet.otel import OtlpFleetExporter

            # Pushed after each pass; the SDK's own timer, at the same pace, only repeats the latest one.
            OtlpFleetExporter.to_endpoint(otlp_endpoint, interval_s=every_s).attach(service)
        service.start()
        say(f"fleet: serving {url_of(sock)} (a pass of {opts.url} every {every_s:g}s)")
        make_server(make_app(service)).run(sockets=[sock])
    finally:
        service.stop()
        sock.close()
