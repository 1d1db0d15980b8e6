# ruff: noqa: E501  (the page is one HTML/JS document; its lines follow JS, not Python, layout)
"""The dashboard page: one HTML document that follows `/api/stream` (Server-Sent Events) and redraws with
plotly.js, polling `/api/update` instead where the stream cannot open (no EventSource, a proxy that drops it).

plotly.js is served from the installed `plotly` wheel (`/static/plotly.min.js`), so nothing is vendored here.
Each update carries only the chart points newer than the last one the page holds (the stream keeps that
point itself, and gets it back as Last-Event-ID on a reconnect; a poll sends `?since=`), the current state
and the phase bands, not the whole history again. Phase names and colours are views/palette.py's, handed
to the script as JSON (`CONFIG.palette`), so the page keeps no colour table of its own.

Times are plotted and printed with /api/state's `clock_offset_s` added (a replay's own clock). The axes are
fixed by the signals' physical ranges (0-100 %, 0 to the power limit), every device shares one time range,
and the legend sits above the plot; below 900 and 600 px the layout folds to one column.
"""

from __future__ import annotations

import html
import json

from phasescope.views.palette import FAVICON, HELD_IDLE, PALETTE, as_json

_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>phasescope · __TITLE__</title>
__FAVICON__
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #f5f6f8; color: #1d2733; }
 header { background: #1d2733; color: #fff; padding: 10px 18px; display: flex; gap: 16px; align-items: center; }
 header h1 { font-size: 18px; margin: 0; }
 #status { font-size: 12px; opacity: .85; flex: 1; }
 #up { font-size: 12px; padding: 2px 8px; border-radius: 9px; background: #7f8c8d; }
 #up.on { background: #27ae60; }
 main { padding: 14px 18px; display: grid; gap: 14px; }
 section.panel { background: #fff; border-radius: 8px; padding: 12px 14px; box-shadow: 0 1px 2px #0002; }
 h2 { font-size: 15px; margin: 0 0 8px; }
 table { border-collapse: collapse; font-size: 13px; }
 td, th { padding: 3px 10px 3px 0; text-align: right; }
 td:first-child, th:first-child { text-align: left; }
 .badge { display: inline-block; padding: 2px 10px; border-radius: 10px; font-weight: 600; }
 .kpis { display: flex; flex-wrap: wrap; gap: 8px 18px; margin: 6px 0; font-size: 13px; }
 .kpis b { font-size: 15px; }
 .hook-kpis { display: flex; flex-wrap: wrap; gap: 4px 18px; margin: 2px 0 6px; font-size: 13px; }
 .hook-kpis:empty { display: none; }
 .hook-kpis .who { color: #667; }
 .telemetry-kpis { margin: 2px 0 6px; font-size: 13px; }
 .telemetry-kpis:empty { display: none; }
 .evidence { margin: 2px 0 6px; font-size: 13px; color: #555; }
 .evidence:empty { display: none; }
 .evidence.disagrees { color: #8a2a00; font-weight: 600; }
 .device-head { display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
 .muted { color: #667; font-size: 12px; }
 .held { color: __HELD__; font-weight: 600; }
 .alarm { display: inline-block; padding: 2px 10px; border-radius: 10px; background: #c0392b; color: #fff; font-weight: 600; }
 .alarm:empty { display: none; }
 .chart { height: 300px; min-width: 0; }
 .cols { display: grid; grid-template-columns: minmax(0, 3fr) minmax(260px, 1fr); gap: 12px; }
 .device-head .muted { overflow-wrap: anywhere; }
 /* Tablets and phones: one column, a header that wraps, charts that keep a readable height. */
 @media (max-width: 900px) {
  .cols { grid-template-columns: minmax(0, 1fr); }
 }
 @media (max-width: 600px) {
  header { flex-wrap: wrap; gap: 6px 12px; padding: 8px 12px; }
  #status { flex-basis: 100%; order: 3; overflow-wrap: anywhere; }
  main { padding: 10px 8px; gap: 10px; }
  section.panel { padding: 10px; }
  .chart { height: 260px; }
  table { display: block; overflow-x: auto; max-width: 100%; }
 }
</style>
</head>
<body>
<header><h1>phasescope</h1><span id="status">connecting…</span><span id="up">source</span></header>
<main>
 <section class="panel"><h2>Energy and cost so far, per phase (all devices)</h2>
  <table id="totals"><thead><tr><th>phase</th><th>device time</th><th>energy</th><th>cost</th></tr></thead>
  <tbody></tbody></table><div class="muted" id="pricing"></div></section>
 <section class="panel"><h2>Idle but held</h2><div id="idle-held">none</div></section>
 <div id="devices"></div>
</main>
<script src="__PLOTLY__"></script>
<script>
const CONFIG = __CONFIG__;
const PALETTE = CONFIG.palette;  // views/palette.py: label -> {name, fill, ink}
const hist = {};       // uuid -> {t: [...], <signal>: [...], bands: [...]}
const cards = {};      // uuid -> DOM elements of its card
let since = null;
let OFFSET = 0;        // /api/state's clock_offset_s: a replay's times on the trace's own clock, 0 when live
const when = t => new Date((t + OFFSET) * 1000);  // a data-clock time as the date to plot or print

function fmt(v, unit, digits) {
  if (v === null || v === undefined) return "–";
  return v.toFixed(digits === undefined ? 0 : digits) + unit;
}
function gib(v) { return v === null || v === undefined ? "–" : (v / 1073741824).toFixed(1) + " GiB"; }
function dur(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function energy(j) { return j === null ? "–" : (j >= 3.6e5 ? (j / 3.6e6).toFixed(3) + " kWh" : (j / 1000).toFixed(1) + " kJ"); }
// Priced, yet no cost: e.g. only a $/kWh price and no power reading, so the cost is unknown ("–"), not $0.
function usd(c, priced) { return c.total_usd === null ? (priced ? "–" : "not priced") : "$" + c.total_usd.toFixed(c.total_usd < 1 ? 4 : 2); }
function phaseKpis(k, who) {
  const parts = [];
  const ms = s => s < 0.001 ? (s * 1e6).toFixed(0) + " µs" : (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
  if (k.step_time_p50_s != null) parts.push(["step", ms(k.step_time_p50_s)]);
  if (k.samples_per_s != null) parts.push(["samples/s", k.samples_per_s.toFixed(0)]);
  if (k.mfu != null) parts.push(["MFU", (k.mfu * 100).toFixed(1) + " %"]);
  if (k.requests_per_s != null) parts.push(["req/s", k.requests_per_s.toFixed(1)]);
  if (k.latency_p50_s != null) parts.push(["p50", ms(k.latency_p50_s)]);
  if (k.latency_p99_s != null) parts.push(["p99", ms(k.latency_p99_s)]);
  if (!parts.length) return "";
  const head = who ? `<span class="who">${esc(who)}</span>` : "";
  return `<span data-kpis="${esc(who || "device")}">${head} ` + parts.map(([n, v]) => `${n} <b>${v}</b>`).join(" · ") + "</span>";
}
function esc(s) { return String(s).replace(/[&<>"]/g, ch => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[ch])); }
// A label's look, as palette.look says it: a hooks label such as "training+inference" takes its first
// phase's colours under its own name; a label the palette lacks looks like unknown.
function look(p) {
  const k = String(p);
  if (PALETTE[k]) return PALETTE[k];
  return {...(PALETTE[k.split("+")[0]] || PALETTE.unknown), name: k};
}
function badge(p) {
  const l = look(p);
  return `<span class="badge" data-phase="${esc(p)}" style="background:${l.fill};color:${l.ink}">${esc(l.name)}</span>`;
}

function card(dev) {
  if (cards[dev.uuid]) return cards[dev.uuid];
  const el = document.createElement("section");
  el.className = "panel device";
  el.dataset.uuid = dev.uuid;
  el.dataset.index = dev.index === null ? "" : String(dev.index);
  const idx = dev.index === null ? "" : "#" + dev.index + " ";
  el.innerHTML = `<div class="device-head"><h2>${esc(idx + (dev.name || "device"))}</h2>
    <span class="badge" data-testid="phase-badge"></span><span class="alarm" data-testid="training-alarm"></span><span class="conf muted"></span>
    <span class="since muted"></span><span class="held"></span><span class="muted">${esc(dev.uuid)}</span></div>
    <div class="cols"><div><div class="hook-kpis" data-testid="phase-kpis"></div><div class="telemetry-kpis" data-testid="telemetry-kpis"></div><div class="evidence" data-testid="evidence"></div><div class="kpis"></div><div class="chart"></div></div>
    <div><table class="energy"><thead><tr><th>phase</th><th>time</th><th>energy</th><th>cost</th></tr></thead>
    <tbody></tbody></table><div class="muted method"></div></div></div>`;
  document.getElementById("devices").appendChild(el);
  cards[dev.uuid] = {
    el, limit: null, badge: el.querySelector(".badge"), alarm: el.querySelector(".alarm"), conf: el.querySelector(".conf"), since: el.querySelector(".since"),
    held: el.querySelector(".held"), kpis: el.querySelector(".kpis"), chart: el.querySelector(".chart"),
    hook: el.querySelector(".hook-kpis"), telemetry: el.querySelector(".telemetry-kpis"),
    evidence: el.querySelector(".evidence"),
    energy: el.querySelector(".energy tbody"), method: el.querySelector(".method"),
  };
  return cards[dev.uuid];
}

function drawDevice(dev, now) {
  const c = card(dev);
  const ph = dev.phase ? dev.phase.phase : "unknown";
  const l = look(ph);
  c.badge.textContent = l.name;
  c.badge.dataset.phase = ph;
  c.badge.style.background = l.fill;
  c.badge.style.color = l.ink;
  // The onset alarm fires before the badge turns to training; alarm_at is on the data clock, like now.
  const al = dev.phase && dev.phase.training_alarm ? dev.phase.alarm_at : undefined;
  c.alarm.textContent = al === undefined ? "" : "⚑ training started"
    + (al === null ? "" : " " + when(al).toLocaleTimeString() + (now !== null ? " (" + dur(Math.max(0, now - al)) + " ago)" : ""));
  // Hooks report the phase exactly (no confidence); the classifier's may be held from an older window.
  const held = dev.phase && dev.phase.held ? " (held)" : "";
  c.conf.textContent = !dev.phase ? (dev.host_device ? "no phase: hooks only (the classifier reads GPUs)" : "")
    : dev.phase.source === "hooks" ? "from hooks (exact)"
    : (dev.phase.confidence !== null ? "confidence " + dev.phase.confidence.toFixed(2) : "") + held;
  c.since.textContent = dev.phase && dev.phase.since !== null && now !== null ? "for " + dur(now - dev.phase.since) : "";
  c.held.textContent = dev.lost ? "NO DATA" : (dev.idle_held ? PALETTE.held_idle.name : "");
  const v = dev.latest;
  c.limit = v.power_limit === undefined ? null : v.power_limit;
  const kpis = [
    ["util", fmt(v.gpu_util === undefined ? null : v.gpu_util * 100, " %")],
    ["mem util", fmt(v.mem_util === undefined ? null : v.mem_util * 100, " %")],
    ["power", fmt(v.power, " W") + (v.power_limit !== undefined ? " / " + fmt(v.power_limit, " W") : "")],
    ["memory", gib(v.mem_used) + (v.mem_total !== undefined ? " / " + gib(v.mem_total) : "")],
    ["temp", fmt(v.temperature, " °C")],
    ["SM clock", fmt(v.sm_clock === undefined ? null : v.sm_clock / 1e6, " MHz")],
    ["processes", String(dev.processes)],
  ];
  c.kpis.innerHTML = kpis.map(([k, x]) => `<span>${k} <b>${x}</b></span>`).join("");
  // The phase's own KPIs (hooks or a serving engine's /metrics): the device's, then each reporting process.
  const hook = [phaseKpis(dev.kpis, "")];
  for (const p of dev.process_kpis || []) {
    hook.push(phaseKpis(p.kpis, (p.label || "pid") + " " + p.pid + (p.phase ? " · " + p.phase + " (hooks)" : "")));
  }
  c.hook.innerHTML = hook.filter(x => x).join("");
  // From telemetry alone (no hooks): /api/state's line, as `top` shows it; each figure's method on hover.
  const tk = dev.telemetry_kpis_text;
  c.telemetry.textContent = tk && tk !== "–" ? "from telemetry: " + tk : "";
  c.telemetry.title = Object.entries(dev.telemetry_kpis_notes || {}).map(([n, m]) => n + ": " + m).join("\\n");
  // What its processes say they are: context beside the phase, marked where it contradicts the telemetry.
  const ev = dev.evidence;
  const said = ev && ev.engines.length ? ev.engines.join(" + ") + (ev.role ? " (" + ev.role + ")" : "") : "";
  c.evidence.textContent = said ? (ev.disagrees ? "≠ processes say: " : "processes: ") + said : "";
  c.evidence.classList.toggle("disagrees", !!(ev && ev.disagrees));
  // /api/state's `measured` (kpi/energy.py's rule), e.g. false on a host: time per phase, no power to integrate.
  const metered = dev.energy.measured;
  const rows = Object.entries(dev.energy.phases).map(([p, e]) =>
    `<tr><td>${badge(p)}</td>` +
    `<td>${dur(e.seconds)}</td><td>${metered ? energy(e.joules) : "– kWh"}</td><td>${usd(e.cost, dev.priced)}</td></tr>`);
  c.energy.innerHTML = rows.join("") || "<tr><td colspan=4 class=muted>no energy yet</td></tr>";
  c.method.textContent = (metered ? "energy from " + dev.energy.method.replace("_", " ")
    : "energy unmeasured (no power reading)"
      + (Object.values(dev.energy.phases).some(e => e.cost.time_usd !== null) ? "; cost from device time" : ""))
    + (dev.price_note ? " · " + dev.price_note : "");  // a MIG row: its share of the physical GPU's price
}

function merge(uuid, h) {
  const cur = hist[uuid] || (hist[uuid] = {t: [], bands: []});
  for (const s of ["t", ...CONFIG.signals]) {
    cur[s] = (cur[s] || []).concat(h[s] || []);
    if (cur[s].length > CONFIG.max_points) cur[s] = cur[s].slice(cur[s].length - CONFIG.max_points);
  }
  cur.bands = h.bands;
}

// The power axis runs from 0 to the board's power limit (a signal), so an idle 35 W sits low instead of
// filling the axis; without a limit, to the peak rounded up to 100 W. null: no power reading at all.
function powerRange(h, limit) {
  const peak = (h.power || []).reduce((m, v) => v === null ? m : Math.max(m, v), -Infinity);
  if (limit !== null && limit > 0) return [0, limit];
  return peak === -Infinity ? null : [0, Math.max(1, Math.ceil(peak / 100)) * 100];
}

// One time range for every device, so their charts line up.
function timeRange() {
  let lo = Infinity, hi = -Infinity;
  for (const h of Object.values(hist)) {
    if (h.t.length) { lo = Math.min(lo, h.t[0]); hi = Math.max(hi, h.t[h.t.length - 1]); }
  }
  return lo <= hi ? [when(lo), when(hi)] : undefined;
}

function plot(uuid, xrange) {
  const h = hist[uuid];
  const c = cards[uuid];
  if (!h || !c) return;
  const x = h.t.map(when);
  const pct = a => a.map(v => v === null ? null : v * 100);
  const power = powerRange(h, c.limit);
  const traces = [
    {x, y: pct(h.gpu_util), name: "util", mode: "lines", line: {color: "#1d2733"}},
    {x, y: pct(h.mem_util), name: "mem util", mode: "lines", line: {color: "#16a085", dash: "dot"}},
  ];
  if (power) traces.push({x, y: h.power, name: "power", mode: "lines", yaxis: "y2", line: {color: "#e67e22"}});
  const shapes = h.bands.map(([a, b, p]) => ({
    type: "rect", xref: "x", yref: "paper", x0: when(a), x1: when(b), y0: 0, y1: 1,
    fillcolor: look(p).fill, opacity: 0.18, line: {width: 0}, layer: "below",
  }));
  const layout = {
    // The legend sits above the plot (y > 1), never over a line.
    margin: {l: 50, r: 55, t: 30, b: 30}, showlegend: true,
    legend: {orientation: "h", x: 0, y: 1.02, yanchor: "bottom"},
    xaxis: {type: "date", range: xrange},
    yaxis: {title: {text: "utilisation (%)"}, range: [0, 100], fixedrange: true},
    yaxis2: power ? {title: {text: "power (W)"}, overlaying: "y", side: "right", range: power, fixedrange: true,
                     showgrid: false}
      : {overlaying: "y", side: "right", visible: false},
    annotations: power ? [] : [{text: "no power reading", xref: "paper", yref: "paper", x: 1, y: 1,
                                xanchor: "right", yanchor: "top", showarrow: false, font: {color: "#667"}}],
    shapes, uirevision: uuid,
  };
  Plotly.react(c.chart, traces, layout, {displayModeBar: false, responsive: true});
  c.chart.dataset.points = String(h.t.length);
  c.chart.dataset.power = power ? "reading" : "none";
}

function drawTotals(s) {
  const body = document.querySelector("#totals tbody");
  const metered = s.devices.some(d => d.energy.measured);
  body.innerHTML = Object.entries(s.totals).map(([p, t]) =>
    `<tr><td>${badge(p)}</td>` +
    `<td>${dur(t.seconds)}</td><td>${metered ? energy(t.joules) : "– kWh"}</td><td>${!s.devices.some(d => d.priced) ? "not priced" : t.usd === null ? "–" : "$" + t.usd.toFixed(4)}</td></tr>`
  ).join("") || "<tr><td colspan=4 class=muted>no samples yet</td></tr>";
  document.getElementById("pricing").textContent = CONFIG.pricing;
  const held = s.devices.filter(d => d.idle_held);
  document.getElementById("idle-held").innerHTML = held.length ? held.map(d =>
    `<div class="held">#${d.index === null ? "?" : d.index} ${esc(d.name)} · ${gib(d.latest.mem_used)} held · ${d.processes} process(es)</div>`
  ).join("") : "none";
}

function apply(body) {
  const s = body.state;
  document.getElementById("status").textContent = s.status;
  const up = document.getElementById("up");
  up.textContent = s.up ? "source up" : (s.exhausted ? "replay ended" : "source down");
  up.className = s.up ? "on" : "";
  OFFSET = s.clock_offset_s || 0;
  for (const dev of s.devices) drawDevice(dev, s.time);
  for (const [uuid, h] of Object.entries(body.history)) {
    merge(uuid, h);
    if (h.t.length) since = Math.max(since === null ? -Infinity : since, h.t[h.t.length - 1]);
  }
  const xrange = timeRange();
  for (const uuid of Object.keys(body.history)) plot(uuid, xrange);
  drawTotals(s);
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
}

async function poll() {
  try {
    const url = "api/update" + (since === null ? "" : "?since=" + since);
    const r = await fetch(url, {credentials: "same-origin", cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    apply(await r.json());
  } catch (e) {
    document.getElementById("status").textContent = "update failed: " + e.message;
  }
  setTimeout(poll, CONFIG.refresh_ms);
}

// Live updates pushed by the server; polling where the stream never opens (an EventSource that fails
// after opening reconnects by itself, resuming from its Last-Event-ID).
function follow() {
  if (!window.EventSource || new URLSearchParams(location.search).get("transport") === "poll") {
    document.body.dataset.transport = "poll";
    return poll();
  }
  const es = new EventSource("api/stream");
  let opened = false;
  es.onopen = () => { opened = true; document.body.dataset.transport = "sse"; };
  es.onmessage = e => {
    try { apply(JSON.parse(e.data)); }
    catch (err) { document.getElementById("status").textContent = "update failed: " + err.message; }
  };
  es.onerror = () => {
    if (opened) { document.getElementById("status").textContent = "stream lost, reconnecting…"; return; }
    es.close();
    document.body.dataset.transport = "poll";
    poll();
  };
}
follow();
</script>
</body>
</html>
"""


def render(title: str, plotly_src: str, config: dict[str, object]) -> str:
    """The page, with its settings and the phase palette inlined as JSON (`</` escaped so no value can
    close the script)."""
    cfg = dict(config, palette=as_json())
    blob = json.dumps(cfg).replace("</", "<\\/")
    return (
        _TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__FAVICON__", FAVICON)
        .replace("__HELD__", PALETTE[HELD_IDLE].fill)
        .replace("__PLOTLY__", html.escape(plotly_src))
        .replace("__CONFIG__", blob)
    )
