"""The report as one HTML file: inline CSS, plotly's JS inline from the installed wheel, no network at all."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from phasescope.kpi.cost import Cost
from phasescope.kpi.energy import DeviceEnergy, PhaseEnergy, totals_by_phase
from phasescope.report.data import DeviceReport, ReportData
from phasescope.schema import PHASES, FloatArray, Trace
from phasescope.views.display import (
    MISSING,
    fmt_bytes,
    fmt_ratio,
    fmt_seconds,
    fmt_usd,
    fmt_watts,
)
from phasescope.views.kpis import kpi_items, kpi_note
from phasescope.views.palette import FAVICON, UNKNOWN, look

MAX_POINTS = 4000  # per plotted line; longer series keep each bucket's min and max
# Browsers keep about 16 WebGL contexts per page (Chrome, Safari) and drop the oldest beyond that, which
# left the first devices' timelines blank in a report of many devices; each WebGL figure takes 2-3. More
# devices than this are drawn as SVG (decimated to MAX_POINTS a line, so still light).
WEBGL_MAX_FIGURES = 4
GIB = 1024.0**3

# (signals with their legend names, axis title with its unit, scale to the plotted unit). Each line has
# its own colour, so a two-line panel's legend says which is which.
_PANELS: tuple[tuple[tuple[tuple[str, str], ...], str, float], ...] = (
    ((("gpu_util", "GPU util"), ("mem_util", "memory util")), "utilisation (%)", 100.0),
    ((("power", "power"),), "power (W)", 1.0),
    ((("mem_used", "memory used"),), "memory (GiB)", 1.0 / GIB),
    ((("temperature", "temperature"),), "temperature (°C)", 1.0),
    ((("sm_clock", "SM clock"), ("mem_clock", "memory clock")), "clock (MHz)", 1e-6),
    ((("pcie_rx", "PCIe rx"), ("pcie_tx", "PCIe tx")), "PCIe (MB/s)", 1e-6),
)
_LINE = {"gpu_util": ("#0072b2", "solid"), "mem_util": ("#d55e00", "dot"), "power": ("#e69f00", "solid"),
         "mem_used": ("#009e73", "solid"), "temperature": ("#cc3311", "solid"),
         "sm_clock": ("#0072b2", "solid"), "mem_clock": ("#d55e00", "dot"),
         "pcie_rx": ("#0072b2", "solid"), "pcie_tx": ("#d55e00", "dot")}
PANEL_PX = 160  # a panel's height; the figure's is the panels' plus its legend and axis

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em 2em;color:#222;max-width:1400px}
h1{margin-bottom:.2em} h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0 1.2em 0;font-size:.92em}
td,th{border:1px solid #d6d6d6;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;font-size:.9em}
.legend span{margin-right:1em} .note{color:#8a5a00} .ev{font-family:ui-monospace,monospace;font-size:.88em}
.pos{color:#176b2c} .neg{color:#a11}
.plot{width:100%;overflow-x:auto}
@media (max-width:700px){body{margin:.8em .6em} table{display:block;overflow-x:auto} h1{font-size:1.5em}}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def badge(label: str) -> str:
    """A label as the palette draws it: its name on its colour."""
    p = look(label)
    return f"<span class='badge' data-phase='{_e(label)}' style='{p.css()}'>{_e(p.name)}</span>"


def _num(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else MISSING


def _cost(c: Cost) -> str:
    if c.total_usd is None:
        return MISSING
    parts = []
    if c.time_usd is not None:
        parts.append(f"time {fmt_usd(c.time_usd)}")
    if c.energy_usd is not None:
        parts.append(f"energy {fmt_usd(c.energy_usd)}")
    return f"{fmt_usd(c.total_usd)} ({', '.join(parts)})"


def _kwh(fig: DeviceEnergy | PhaseEnergy) -> str:
    """kWh, or MISSING where no second had a power or energy reading (unknown energy is not 0 kWh)."""
    kwh = fig.measured_kwh
    return f"{kwh:.4f}" if kwh is not None else MISSING


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], raw: bool = False, cls: str = "") -> str:
    """A table; cells are escaped unless `raw` (then the caller escaped them)."""
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table class='{cls}'><tr>{h}</tr>{body}</table>"


# --------------------------------------------------------------------------- plotting


def decimate(
    time_s: FloatArray, values: FloatArray, max_points: int = MAX_POINTS
) -> tuple[FloatArray, FloatArray]:
    """At most about `max_points` points: each bucket keeps its min and max (spikes survive), and an
    all-missing bucket keeps one NaN, so gaps still break the line."""
    n = time_s.shape[0]
    if n <= max_points:
        return time_s, values
    k = math.ceil(n / (max_points // 2))
    buckets = math.ceil(n / k)
    pad = buckets * k - n
    v = np.concatenate([values, np.full(pad, np.nan)]).reshape(buckets, k)
    finite = np.isfinite(v)
    lo = np.argmin(np.where(finite, v, np.inf), axis=1)
    hi = np.argmax(np.where(finite, v, -np.inf), axis=1)
    base = np.arange(buckets) * k
    idx = np.unique(np.concatenate([base + lo, base + hi]))
    idx = idx[idx < n]
    return time_s[idx], values[idx]


def _unix_offset(trace: Trace) -> float | None:
    """What to add to the trace's clock for Unix time: 0 when it is Unix time already, the log's own UTC
    anchor (`utc_offset`, e.g. a monotonic clock tied to UTC) otherwise; None where neither holds."""
    if len(trace) and float(np.nanmin(trace.time)) > 1e8:
        return 0.0
    off = trace.meta.get("utc_offset")
    return float(off) if isinstance(off, int | float) and math.isfinite(off) else None


def _x(times: Any, offset: float | None) -> Any:
    """Plotted times: dates where the trace's clock maps to UTC, else seconds on its own clock."""
    t = np.asarray(times, dtype=np.float64)
    if offset is None:
        return t
    return ((t + offset) * 1000.0).astype("datetime64[ms]")


def _nice_top(peak: float, step: float) -> float:
    """`peak` rounded up to a whole `step` (at least one step): an axis top with round ticks."""
    return step * max(1.0, math.ceil(peak / step)) if math.isfinite(peak) else step


def _peak(trace: Trace, sig: str) -> float:
    v = trace[sig] if trace.has(sig) else np.array([np.nan])
    return float(np.nanmax(v)) if np.isfinite(v).any() else math.nan


def _y_range(trace: Trace, sigs: Sequence[str], scale: float) -> list[float] | None:
    """The axis range from the signal's physical range, not from the data's spread, so a 35 W idle stays
    low: 0-100 % for ratios, 0 to the power limit (or the peak, rounded up, where the log has no limit),
    0 to the memory size; None lets the axis fit the data from 0 (clocks, PCIe, temperature)."""
    if sigs[0] in ("gpu_util", "mem_util"):
        return [0.0, 100.0]
    if sigs[0] == "power":
        limit = _peak(trace, "power_limit")
        return [0.0, limit if math.isfinite(limit) else _nice_top(_peak(trace, "power"), 100.0)]
    if sigs[0] == "mem_used":
        total = _peak(trace, "mem_total")
        return [0.0, (total if math.isfinite(total) else _nice_top(_peak(trace, "mem_used"), GIB)) * scale]
    return None


def _figure(d: DeviceReport, webgl: bool = True, x_range: tuple[Any, Any] | None = None) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    trace: Trace = d.trace
    panels = [(sigs, title, scale) for sigs, title, scale in _PANELS if any(trace.has(s) for s, _ in sigs)]
    # A probability line needs two windows at least; one is a dot, drawn as an empty panel before.
    with_proba = d.pred is not None and len(d.pred.labels) >= 2
    rows = len(panels) + (1 if with_proba else 0)
    if rows == 0:
        return None
    offset = _unix_offset(trace)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.03)
    line = go.Scattergl if webgl else go.Scatter
    for r, (sigs, title, scale) in enumerate(panels, start=1):
        for sig, name in sigs:
            if not trace.has(sig):
                continue
            t, v = decimate(trace.time, trace[sig] * scale)
            colour, dash = _LINE[sig]
            fig.add_trace(line(x=_x(t, offset), y=v, name=name, mode="lines",
                               line={"width": 1.2, "color": colour, "dash": dash},
                               hovertemplate=f"{name} %{{y:.3g}}<extra></extra>"), row=r, col=1)
        fig.update_yaxes(title_text=title, row=r, col=1, title_font={"size": 11},
                         range=_y_range(trace, [s for s, _ in sigs], scale), rangemode="tozero")
    if with_proba:
        pred: Any = d.pred
        centre = (np.asarray(pred.start) + np.asarray(pred.end)) / 2.0
        proba = np.asarray(pred.proba, dtype=np.float64)
        for i, ph in enumerate(PHASES):
            fig.add_trace(go.Scatter(x=_x(centre, offset), y=proba[:, i] * 100.0, name=f"P({ph})",
                                     mode="lines",
                                     line={"color": look(ph).fill, "width": 1.5}), row=rows, col=1)
        fig.update_yaxes(title_text="P(phase) (%)", range=[0, 100], row=rows, col=1, title_font={"size": 11})
    for s in d.segments:
        x0, x1 = _x([s.start, s.end], offset)
        fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, line_width=0,
                      fillcolor=look(s.label).fill, opacity=0.16, layer="below")
    xt = "time (UTC)" if offset is not None else "time (s, the log's own clock)"
    fig.update_xaxes(title_text=xt, row=rows, col=1, title_font={"size": 11})
    if offset is not None:
        fig.update_xaxes(type="date")
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    # The legend sits above the panels (y > 1), never over a line; plotly grows the top margin to fit it.
    fig.update_layout(height=PANEL_PX * rows + 170, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                      template="plotly_white", legend={"orientation": "h", "x": 0, "y": 1.0,
                                                       "yanchor": "bottom", "font": {"size": 11}})
    return fig


def _x_ranges(data: ReportData) -> list[tuple[Any, Any] | None]:
    """One time range for the devices of one file plotted in UTC, so their timelines line up (files of
    other runs keep their own, or a week apart would squash both); None where the clock is not UTC."""
    spans: list[tuple[float, float] | None] = []
    for d in data.devices:
        off = _unix_offset(d.trace)
        spans.append((float(np.nanmin(d.trace.time)) + off, float(np.nanmax(d.trace.time)) + off)
                     if off is not None and len(d.trace) else None)
    out: list[tuple[Any, Any] | None] = []
    for d, span in zip(data.devices, spans, strict=True):
        same = [s for e, s in zip(data.devices, spans, strict=True) if s is not None and e.path == d.path]
        if span is None:
            out.append(None)
            continue
        lo, hi = _x([min(a for a, _ in same), max(b for _, b in same)], 0.0).astype(str).tolist()
        out.append((lo, hi))
    return out


def _figure_html(d: DeviceReport, div_id: str, webgl: bool = True,
                 x_range: tuple[Any, Any] | None = None) -> str:
    fig = _figure(d, webgl, x_range)
    if fig is None:
        return "<p class='note'>No plottable signal in this trace.</p>"
    short = ""
    if d.pred is not None and len(d.pred.labels) < 2:
        short = (f"<p class='note' data-testid='too-short'>Too short to classify over time: "
                 f"{len(d.pred.labels)} classifier window(s) in {_e(fmt_seconds(d.trace.duration()))}, so no "
                 f"probability timeline.</p>")
    out: str = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True})
    return short + f"<div class='plot'>{out}</div>"


# --------------------------------------------------------------------------- sections


def _summary(data: ReportData) -> str:
    rows = []
    for i, d in enumerate(data.devices):
        e = d.energy
        missing = ", ".join(d.trace.missing_signals()) or "none"
        conf = _num(d.confidence)
        rows.append([
            f"<a href='#dev{i}'>{_e(d.title)}</a>",
            _e(d.path),
            f"{badge(d.label)} {conf}",
            _e(fmt_seconds(d.stats["duration_s"])),
            _e(f"{d.stats['samples']:.0f} @ {_num(d.stats['rate_hz'], 2)} Hz"),
            _e(missing),
            _e(f"{_kwh(e)} kWh ({e.method}, {fmt_ratio(e.coverage)} covered)"),
            _e(_cost(d.cost)),
        ])
    return _table(["device", "file", "phase (confidence)", "span", "samples", "missing signals", "energy",
                   "cost"], rows, raw=True)


def _phase_totals(data: ReportData) -> str:
    # Energy over the seconds that have a power or energy reading: a device without one adds held time
    # and cost, but no "0 W" and no 0 kWh (a missing value is never shown as 0).
    measured = totals_by_phase(d.energy for d in data.devices)
    rows = []
    for label, (secs, _, cost) in sorted(data.phase_totals().items(), key=lambda kv: -kv[1][0]):
        pe = measured[label]
        rows.append([badge(label), _e(f"{secs / 3600:.3f}"), _e(_kwh(pe)),
                     _e(fmt_watts(pe.mean_power_w)), _e(_cost(cost))])
    return _table(["phase", "device-hours", "kWh", "mean power", "cost"], rows, raw=True)


def _phase_table(d: DeviceReport) -> str:
    rows = []
    phases = d.energy.phases_or_whole()
    for label, pe in sorted(phases.items(), key=lambda kv: -kv[1].seconds):
        st = d.phase_stats.get(label, {})
        rows.append([
            badge(label),
            _e(fmt_seconds(pe.seconds)),
            _e(fmt_ratio(st.get("util_mean", math.nan))),
            _e(fmt_watts(st.get("power_mean_w", math.nan))),
            _e(fmt_bytes(st.get("mem_used_max", math.nan))),
            _e(f"{_kwh(pe)} kWh ({fmt_ratio(pe.coverage)} covered)"),
            _e(_cost(d.phase_cost.get(label, Cost(None, None)))),
        ])
    head = ["phase", "time", "mean util", "mean power", "peak memory", "energy", "cost"]
    return _table(head, rows, raw=True)


def _evidence(d: DeviceReport) -> str:
    if not d.segments:
        return f"<p class='note'>{_e(d.note or 'No phase segments: too little data to classify.')}</p>"
    t0 = float(d.trace.time[0]) if len(d.trace) else 0.0
    rows = []
    for seg, ev in zip(d.segments, d.evidence, strict=True):
        if ev:
            items = []
            for fw in ev:
                cls = "pos" if fw.weight >= 0 else "neg"
                items.append(f"<span class='{cls}'>{fw.weight:+.2f}</span> {_e(fw.feature)}")
            why = "<br>".join(items)
        elif seg.label == UNKNOWN:
            why = _e(_unknown_reason(d, seg) or "the model declined to call these windows")
        else:
            why = MISSING
        rows.append([
            _e(f"{fmt_seconds(seg.start - t0)} – {fmt_seconds(seg.end - t0)}"),
            _e(fmt_seconds(seg.duration)),
            badge(seg.label),
            _e(_num(seg.confidence)),
            _e(f"{seg.n_windows}" + (f" (+{seg.n_unknown} unknown bridged)" if seg.n_unknown else "")),
            f"<span class='ev'>{why}</span>",
        ])
    return _table(["from – to (since start)", "duration", "phase", "confidence", "windows",
                   "evidence: mean contribution (log-odds) towards the phase"], rows, raw=True)


def _unknown_reason(d: DeviceReport, seg: Any) -> str:
    pred = d.pred
    if pred is None:
        return ""
    centre = (np.asarray(pred.start) + np.asarray(pred.end)) / 2.0
    inside = np.flatnonzero((centre >= seg.start) & (centre <= seg.end)).tolist()
    reasons = [pred.reasons[i] for i in inside if i < len(pred.reasons) and pred.reasons[i]]
    return max(set(reasons), key=reasons.count) if reasons else ""


def _kpis(d: DeviceReport) -> str:
    s = d.stats
    mem_total = s["mem_total"]
    rows = [
        ["mean / p95 utilisation", f"{fmt_ratio(s['util_mean'])} / {fmt_ratio(s['util_p95'])}"],
        ["mean / peak power", f"{fmt_watts(s['power_mean_w'])} / {fmt_watts(s['power_max_w'])}"],
        ["peak memory used", fmt_bytes(s["mem_used_max"])
         + (f" of {fmt_bytes(mem_total)}" if math.isfinite(mem_total) else "")],
        ["peak temperature", f"{_num(s['temperature_max'], 0)} °C" if math.isfinite(s["temperature_max"])
         else MISSING],
        ["energy", (f"{d.energy.joules:,.0f} J = {d.energy.kwh:.4f} kWh" if d.energy.measured
                    else f"{MISSING} kWh (no power or energy reading)")
                   + f", method {d.energy.method}, {fmt_ratio(d.energy.coverage)} of the span covered"
                   + (f", {d.energy.resets} counter reset(s)" if d.energy.resets else "")],
        ["cost", _cost(d.cost)],
        ["prices", _prices(d)],
    ]
    if d.pred is not None:
        rows.append(["model", f"{d.pred.model_version} (features of the {d.pred.subset or '—'} signal set)"])
    return _table(["KPI", "value"], rows)


def _telemetry_kpis(d: DeviceReport) -> str:
    """The small block of telemetry-only KPIs of the device's phase (views/kpis.py, as every view shows
    them), each with its method and confidence; nothing when the phase has none to show."""
    items = kpi_items(d.telemetry_kpis)
    if not items:
        return ""
    span = d.telemetry_kpis.get("span_s")
    over = f" over its {_e(fmt_seconds(span))} in that phase" if isinstance(span, float) else ""
    head = (f"<h3>KPIs from telemetry alone</h3><p class='meta'>For the device's phase "
            f"({_e(d.telemetry_kpis.get('phase', ''))}){over}; no hooks needed.</p>")
    return head + _table(["KPI", "value", "how"], [[i.name, i.text, kpi_note(i)] for i in items],
                         cls="telemetry-kpis")


def _prices(d: DeviceReport) -> str:
    p = d.prices
    parts = []
    if p.usd_per_gpu_hour is not None:
        parts.append(f"{fmt_usd(p.usd_per_gpu_hour)}/GPU-hour")
    if p.usd_per_kwh is not None:
        parts.append(f"{fmt_usd(p.usd_per_kwh)}/kWh")
    text = ", ".join(parts) or "not set (use --price-gpu-hour / --price-kwh or the config file)"
    return f"{text} ({d.price_note})" if d.price_note else text


def _hooks(data: ReportData) -> str:
    doc = data.hooks
    if not doc:
        return ""
    from phasescope.views.run_report import kpi_rows  # the run summary's own KPI rows

    parts = ["<h2>KPIs from in-process hooks</h2>"]
    for proc in doc.get("processes") or []:
        parts.append(f"<h3>pid {_e(proc['pid'])} on {_e(proc['device'])}</h3>")
        parts.append(_table(["phase", "KPI", "value"], kpi_rows(proc)))
    if not doc.get("processes"):
        parts.append("<p class='note'>The events directory holds no forward or optimizer step.</p>")
    return "\n".join(parts)


def _legend() -> str:
    return "<p class='legend'>" + "".join(f"<span>{badge(p)}</span>" for p in (*PHASES, UNKNOWN)) + "</p>"


def render(data: ReportData) -> str:
    """The whole page as one string."""
    from plotly.offline import get_plotlyjs

    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data.created))
    head = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>" + FAVICON +
        f"<title>phasescope report: {_e(', '.join(data.inputs))}</title>"
        f"<style>{_CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
    )
    parts = [head, "<h1>phasescope report</h1>"]
    model = data.model_version or data.model_note or "none"
    parts.append(f"<p class='meta'>{_e(len(data.devices))} device trace(s) from {_e(', '.join(data.inputs))}"
                 f" · generated {_e(when)} · model {_e(model)}</p>")
    parts.append(_legend())
    parts.append("<h2>Summary</h2>")
    parts.append(_summary(data))
    parts.append("<h3>Energy and cost per phase, all devices</h3>")
    parts.append(_phase_totals(data))
    parts.append(_hooks(data))
    x_ranges = _x_ranges(data)
    for i, d in enumerate(data.devices):
        parts.append(f"<h2 id='dev{i}'>{_e(d.title)} {badge(d.label)}</h2>")
        parts.append(f"<p class='meta'>{_e(d.path)} · {_e(d.trace.meta.get('format', ''))}</p>")
        if d.note:
            parts.append(f"<p class='note'>{_e(d.note)}</p>")
        parts.append(_kpis(d))
        parts.append(_telemetry_kpis(d))
        parts.append("<h3>Per phase</h3>")
        parts.append(_phase_table(d))
        parts.append("<h3>Timeline</h3><p class='meta'>Bands are the phase segments; the bottom panel is the "
                     "model's probability per window.</p>")
        parts.append(_figure_html(d, f"fig{i}", webgl=len(data.devices) <= WEBGL_MAX_FIGURES,
                                  x_range=x_ranges[i]))
        parts.append("<h3>Segments and the evidence for them</h3>")
        parts.append(_evidence(d))
    parts.append(
        "<p class='meta'>Evidence: each segment's top features by mean SHAP contribution (log-odds) towards "
        "its phase over the windows the model called that phase; positive pushed towards it. Energy: the "
        "device's energy counter where the log has one, else integrated power; gaps longer than a few "
        "sample periods are not bridged (see coverage).</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)
