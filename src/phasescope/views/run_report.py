"""How `phasescope run` shows its summary: a rich table on the terminal and a self-contained HTML page.

Phases are drawn in the palette's colours and words (views/palette.py), as every other view draws them.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from phasescope.views.palette import FAVICON, look


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if unit == "s":
            return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"
        if unit == "%":
            return f"{value * 100:.1f}%"
        if unit == "B":
            for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
                if value >= scale:
                    return f"{value / scale:.1f} {name}"
            return f"{value:.0f} B"
        if unit == "flop":
            return f"{value / 1e9:.3g} GFLOP"
        return f"{value:.4g}{unit}"
    if unit == "B" and isinstance(value, int):
        return _fmt(float(value), "B")
    if unit == "flop" and isinstance(value, int):
        return _fmt(float(value), "flop")
    return f"{value}{unit}"


TRAINING_ROWS = (
    ("steps", "steps", ""), ("step time p50", "step_time_p50_s", "s"),
    ("step time p95", "step_time_p95_s", "s"),
    ("samples/s", "samples_per_s", ""), ("tokens/s", "tokens_per_s", ""),
    ("FLOPs per step", "flops_per_step", "flop"), ("MFU", "mfu", "%"),
    ("data-loader stall", "data_stall_fraction", "%"), ("model (parameters)", "model_bytes", "B"),
    ("params+grads+optimizer state", "training_state_bytes", "B"),
    ("memory multiple", "memory_multiple", "x"),
    ("activations per forward", "activation_bytes_per_forward", "B"),
)
INFERENCE_ROWS = (
    ("requests", "requests", ""), ("requests/s", "requests_per_s", ""), ("latency p50", "latency_p50_s", "s"),
    ("latency p95", "latency_p95_s", "s"), ("latency p99", "latency_p99_s", "s"),
    ("batch size (mean)", "batch_size_mean", ""),
)
GENERATION_ROWS = (
    ("generation loops", "loops", ""), ("time to first token p50", "ttft_p50_s", "s"),
    ("inter-token latency p50", "inter_token_latency_p50_s", "s"), ("generated tokens/s", "tokens_per_s", ""),
)


SERVER_ROWS = (
    ("requests", "requests", ""), ("requests/s", "requests_per_s", ""),
    ("latency p50", ("latency_s", "p50"), "s"), ("latency p95", ("latency_s", "p95"), "s"),
    ("latency p99", ("latency_s", "p99"), "s"), ("latency mean", ("latency_s", "mean"), "s"),
    ("time to first token p50", ("ttft_s", "p50"), "s"), ("time to first token p95", ("ttft_s", "p95"), "s"),
    ("inter-token latency p50", ("inter_token_s", "p50"), "s"), ("generated tokens/s", "tokens_per_s", ""),
    ("prompt tokens/s", "prompt_tokens_per_s", ""), ("running", "running", ""), ("waiting", "waiting", ""),
    ("batch size (mean)", "batch_size_mean", ""), ("KV cache usage", "kv_cache_usage", "%"),
)


def server_rows(kpis: dict[str, Any]) -> list[tuple[str, str]]:
    """(KPI, value) rows of one scraped serving engine (sources/scrape), skipping what it does not export."""
    out: list[tuple[str, str]] = []
    for label, key, unit in SERVER_ROWS:
        value = (kpis.get(key[0]) or {}).get(key[1]) if isinstance(key, tuple) else kpis.get(key)
        if value is not None:
            out.append((label, _fmt(float(value), unit)))
    return out


def server_title(kpis: dict[str, Any]) -> str:
    models = ", ".join(kpis.get("models") or []) or "model not labelled"
    basis = f"over {kpis['window_s']:.1f} s" if kpis.get("window_s") else "since the server started"
    return f"{kpis['engine']} at {kpis['endpoint']} ({models}), {basis}"


def print_servers(servers: Sequence[dict[str, Any]], console: Console) -> None:
    for srv in servers:
        table = Table(title=escape(server_title(srv)), title_justify="left")
        table.add_column("KPI")
        table.add_column("value")
        for row in server_rows(srv):
            table.add_row(*row)
        console.print(table)


TELEMETRY_COLUMNS = ("device", "samples", "mean util", "max memory", "mean power", "energy", "method",
                     "coverage")


def telemetry_rows(tel: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per watched device. Energy is kpi/energy.py's (`DeviceWatch`): its method, and the share of
    the watched span it covers; a device without a power or energy signal reads "not measured", never 0 J."""
    out: list[tuple[str, ...]] = []
    for d in tel.get("devices") or []:
        e = d.get("energy") or {}
        joules = d.get("energy_j")
        energy = "not measured" if joules is None else f"{joules:,.0f} J"
        coverage = "-" if joules is None or e.get("coverage") is None else _fmt(float(e["coverage"]), "%")
        out.append((d["uuid"], str(d["samples"]), _fmt(d.get("gpu_util_mean"), "%"),
                    _fmt(d.get("mem_used_max"), "B"), _fmt(d.get("power_mean"), " W"), energy,
                    str(e.get("method", "-")), coverage))
    return out


def kpi_rows(proc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(phase, KPI, value) rows of one process's hook KPIs (also `phasescope report`'s hooks section)."""
    out: list[tuple[str, str, str]] = []
    generation = (proc.get("inference") or {}).get("generation")
    for phase, spec, kpis in (("training", TRAINING_ROWS, proc.get("training")),
                              ("inference", INFERENCE_ROWS, proc.get("inference")),
                              ("generation", GENERATION_ROWS, generation)):
        if kpis:
            out += [(phase, label, _fmt(kpis.get(key), unit)) for label, key, unit in spec]
    return out


def print_summary(doc: dict[str, Any], console: Console) -> None:
    procs = doc.get("processes") or []
    if not procs:
        console.print("phasescope: no PyTorch activity seen (no module forward or optimizer step).")
    for proc in procs:
        seg = Table(title=f"pid {proc['pid']} on {proc['device']}: phases", title_justify="left")
        for col in ("phase", "duration", "steps", "forwards"):
            seg.add_column(col)
        for s in proc["segments"]:
            p = look(s["phase"])
            seg.add_row(Text(f" {p.name} ", style=p.terminal), _fmt(s["duration_s"], "s"), str(s["steps"]),
                        str(s["forwards"]))
        console.print(seg)
        kpi = Table(title="KPIs", title_justify="left")
        for col in ("phase", "KPI", "value"):
            kpi.add_column(col)
        for row in kpi_rows(proc):
            kpi.add_row(*row)
        console.print(kpi)
        for w in proc["warnings"]:
            console.print(f"[bold yellow]warning[/]: {escape(w['message'])}")
    tel = doc.get("telemetry") or {}
    if tel.get("devices"):
        # The terminal's table leaves out samples and memory (in the JSON and the HTML) to fit 80 columns.
        keep = [TELEMETRY_COLUMNS.index(c) for c in ("device", "energy", "method", "coverage", "mean power",
                                                      "mean util")]
        table = Table(title="device telemetry", title_justify="left")
        for i in keep:
            table.add_column(TELEMETRY_COLUMNS[i], overflow="fold" if i == 0 else "ellipsis",
                             no_wrap=i != 0)
        for cells in telemetry_rows(tel):
            table.add_row(*(escape(cells[i]) for i in keep))
        console.print(table)
    print_servers(doc.get("servers") or [], console)
    for note in doc.get("notes") or []:
        console.print(f"note: {escape(note)}")
    if "exit_code" in doc:
        console.print(f"command exited with {doc['exit_code']}")


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f3f3f3}.warn{color:#a60}
.bar{display:flex;height:22px;width:100%;border:1px solid #ccc}.bar div{height:100%}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600}"""


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]], badge_first: bool = False) -> str:
    """A table, cells escaped; `badge_first`: the first column holds phase labels, drawn as badges."""
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{_badge(c) if badge_first and i == 0 else html.escape(str(c))}</td>"
                         for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{h}</tr>{body}</table>"


def _badge(label: str) -> str:
    p = look(label)
    return (f"<span class='badge' data-phase='{html.escape(label, quote=True)}' style='{p.css()}'>"
            f"{html.escape(p.name)}</span>")


# (series key, axis title): a training process's charts over time, top to bottom, on one time axis.
SERIES_PANELS = (("step_time_s", "step time (s)"), ("samples_per_s", "samples/s"), ("loss", "loss"))
# (signal, axis title, scale from base units): a watched device's charts over the run.
TELEMETRY_PANELS = (("gpu_util", "utilisation (%)", 100.0), ("mem_used", "memory used (GiB)", 1 / 2**30),
                    ("power", "power (W)", 1.0))
Panel = tuple[list[float | None], list[float | None], str, bool]  # times (Unix s), values, title, from zero


def _figure(panels: list[Panel], div_id: str) -> str | None:
    """Panels stacked on one shared time axis as one plotly figure (a div; plotly's JS is inlined once by the
    page), or None where no panel has a value."""
    import datetime as dt

    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    drawn = [p for p in panels if any(v is not None for v in p[1])]
    if not drawn:
        return None
    fig = make_subplots(rows=len(drawn), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for row, (ts, ys, title, from_zero) in enumerate(drawn, start=1):
        x = [None if t is None else dt.datetime.fromtimestamp(t) for t in ts]
        fig.add_trace(go.Scatter(x=x, y=ys, name=title, mode="lines+markers", marker={"size": 3},
                                 line={"color": look("training").fill}, connectgaps=False), row=row, col=1)
        fig.update_yaxes(title_text=title, rangemode="tozero" if from_zero else "normal", row=row, col=1)
    fig.update_xaxes(title_text="time (local)", row=len(drawn), col=1)
    fig.update_layout(height=170 * len(drawn) + 60, margin={"l": 70, "r": 20, "t": 20, "b": 40},
                      showlegend=False, template="plotly_white")
    out: str = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True})
    return out


def _charts(panels: list[Panel], div_id: str, heading: str) -> tuple[str, bool]:
    """A heading and the figure, and whether it needs plotly's JS; a one-line note where plotly is absent."""
    if not panels:
        return "", False
    try:
        figure = _figure(panels, div_id)
    except ImportError:
        return "<p>note: charts over time need plotly: pip install 'phasescope[web]'</p>", False
    return ("", False) if figure is None else (f"<h3>{html.escape(heading)}</h3>{figure}", True)


def _process_panels(proc: dict[str, Any]) -> list[Panel]:
    series = proc.get("series")
    if not series:
        return []
    return [(series["loss_t"] if key == "loss" else series["step_t"], series[key], title, key != "loss")
            for key, title in SERIES_PANELS]


def _device_panels(dev: dict[str, Any]) -> list[Panel]:
    series = dev.get("series")
    if not series:
        return []
    return [(series["t"], [None if v is None else v * scale for v in series[signal]], title, True)
            for signal, title, scale in TELEMETRY_PANELS]


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained page (inline CSS; plotly's JS inline where there are charts, no network) with the
    timeline, KPIs, charts over time, warnings and telemetry."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>{FAVICON}<title>phasescope run</title>"
             f"<style>{_CSS}</style>__PLOTLY__</head><body><h1>phasescope run</h1>"]
    plotly_needed = False
    cmd = " ".join(doc.get("command") or [])
    parts.append(f"<p><code>{html.escape(cmd)}</code> exited with {doc.get('exit_code', '-')}; "
                 f"{html.escape(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(doc.get('start', 0))))}, "
                 f"{_fmt(doc.get('duration_s'), 's')}.</p>")
    for proc in doc.get("processes") or []:
        parts.append(f"<h2>pid {proc['pid']} on {html.escape(proc['device'])}</h2>")
        segs = proc["segments"]
        if segs:
            t0, t1 = segs[0]["start"], segs[-1]["end"]
            span = max(t1 - t0, 1e-9)
            bar = "".join(
                f"<div data-phase='{html.escape(s['phase'], quote=True)}' "
                f"title='{html.escape(look(s['phase']).name, quote=True)} {s['duration_s']:.3f} s' "
                f"style='width:{100 * s['duration_s'] / span:.3f}%;background:{look(s['phase']).fill}'></div>"
                for s in segs
            )
            parts.append(f"<div class='bar'>{bar}</div>")
        parts.append(_table(("phase", "duration", "steps", "forwards"),
                            [(s["phase"], _fmt(s["duration_s"], "s"), str(s["steps"]), str(s["forwards"]))
                             for s in segs], badge_first=True))
        parts.append(_table(("phase", "KPI", "value"), kpi_rows(proc)))
        chart, needs_js = _charts(_process_panels(proc), f"series-{proc['pid']}", "Over time")
        parts.append(chart)
        plotly_needed |= needs_js
        for w in proc["warnings"]:
            code, msg = html.escape(w["code"]), html.escape(w["message"])
            parts.append(f"<p class='warn'>warning ({code}): {msg}</p>")
    if not doc.get("processes"):
        parts.append("<p>No PyTorch activity seen (no module forward or optimizer step).</p>")
    tel = doc.get("telemetry") or {}
    if tel.get("devices"):
        parts.append("<h2>Device telemetry</h2>")
        parts.append(_table(TELEMETRY_COLUMNS, telemetry_rows(tel)))
        for i, dev in enumerate(tel["devices"]):
            chart, needs_js = _charts(_device_panels(dev), f"telemetry-{i}", f"{dev['uuid']} over the run")
            parts.append(chart)
            plotly_needed |= needs_js
    for srv in doc.get("servers") or []:
        parts.append(f"<h2>Serving engine: {html.escape(server_title(srv))}</h2>")
        parts.append(_table(("KPI", "value"), server_rows(srv)))
    for note in doc.get("notes") or []:
        parts.append(f"<p>note: {html.escape(note)}</p>")
    parts.append("</body></html>")
    script = ""
    if plotly_needed:
        from plotly.offline import get_plotlyjs

        script = f"<script type='text/javascript'>{get_plotlyjs()}</script>"
    parts[0] = parts[0].replace("__PLOTLY__", script)
    return "\n".join(parts)
