"""The web app: token auth on all routes but /metrics (own switch), the JSON API, plotly.js from the wheel."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import plotly
import pytest

from phasescope.classify import onset
from phasescope.classify.model import PhaseModel
from phasescope.config import PriceConfig
from phasescope.live.classify import LiveClassifier, PhaseReading
from phasescope.schema import TickBatch, Trace
from phasescope.serve.agent import CHART_SIGNALS, Agent
from phasescope.serve.app import PLOTLY_PATH, build_app
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from phasescope.views import table
from tests.http_helpers import TestClient
from tests.live_helpers import ticks
from tests.serve.conftest import MIGRATION_RUN, feed

ROUTES = ["/", f"/{PLOTLY_PATH}", "/api/state", "/api/history", "/api/update", "/healthz"]
TOKEN = "s3cret-token"
TRAINING_FROM = 91407.932  # labels.csv: MIGRATION_RUN's labelled training span (GPUs 3 and 4) starts here


@pytest.fixture(scope="module")
def agent(shared_data: Path) -> Agent:
    traces = read(shared_data / MIGRATION_RUN)
    a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()),
              prices=PriceConfig(usd_per_gpu_hour=2.5, usd_per_kwh=0.12))
    feed(a, ticks(traces, stop=90))
    return a


def test_a_redirect_never_names_the_requests_host(agent: Agent) -> None:
    """The trailing-slash redirect was built from the Host header: a forged Host sent the browser away."""
    client = TestClient(build_app(agent))
    r = client.get("/api/state/", headers={"host": "evil.example:666"}, follow_redirects=False)
    assert 300 <= r.status_code < 400
    assert r.headers["location"] == "/api/state"


def test_without_token_everything_is_open(agent: Agent) -> None:
    client = TestClient(build_app(agent))
    for route in [*ROUTES, "/metrics"]:
        assert client.get(route).status_code == 200, route


@pytest.mark.parametrize("metrics_token", [False, True])
def test_token_guards_every_route_and_metrics_has_its_own_switch(agent: Agent, metrics_token: bool) -> None:
    client = TestClient(build_app(agent, token=TOKEN, metrics_token=metrics_token))
    for route in ROUTES:
        r = client.get(route)
        assert r.status_code == 401, route
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert client.get(route, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(route, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.get("/metrics").status_code == (401 if metrics_token else 200)
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_token_in_the_url_once_sets_a_cookie_for_the_page(agent: Agent) -> None:
    client = TestClient(build_app(agent, token=TOKEN))
    r = client.get(f"/?token={TOKEN}")
    assert r.status_code == 200
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert client.get("/api/update").status_code == 200  # the cookie now carries it
    client.cookies.clear()
    assert client.get("/api/update").status_code == 401


def test_state_and_history_json(agent: Agent) -> None:
    client = TestClient(build_app(agent))
    state = client.get("/api/state").json()
    assert [d["index"] for d in state["devices"]] == [3, 4]
    assert state["ticks"] == 90
    gpu4 = state["devices"][1]
    assert gpu4["phase"]["phase"] == "training" and gpu4["phase"]["source"] == "classifier"
    assert gpu4["host_device"] is False
    phases = gpu4["energy"]["phases"]
    assert {"idle", "training"} <= set(phases)
    for e in phases.values():  # priced by GPU-hour and kWh: cost = time part + energy part
        expect = e["seconds"] / 3600 * 2.5 + e["joules"] / 3.6e6 * 0.12
        assert e["cost"]["total_usd"] == pytest.approx(expect, rel=1e-3, abs=1e-6)
    assert state["totals"]["training"]["joules"] > 0
    # Both GPUs are labelled training from TRAINING_FROM (labels.csv); the onset alarm holds on both by tick
    # 90, fired after that start and before the badge turned training (what the page's alarm badge shows).
    for dev in state["devices"]:
        ph = dev["phase"]
        assert ph["training_alarm"] is True, ph
        assert TRAINING_FROM <= ph["alarm_at"] < ph["since"] <= state["time"], ph
    hist = client.get("/api/history").json()
    h4 = hist[gpu4["uuid"]]
    assert len(h4["t"]) == 90 and all(len(h4[s]) == 90 for s in CHART_SIGNALS)
    assert [b[2] for b in h4["bands"]][-1] == "training" and "idle" in [b[2] for b in h4["bands"]]
    # ?since= returns only newer points: what a polling page asks for.
    since = h4["t"][-6]
    newer = client.get(f"/api/history?since={since}").json()[gpu4["uuid"]]
    assert newer["t"] == h4["t"][-5:]


def test_json_is_strict_and_bad_since_is_one_clear_line(agent: Agent) -> None:
    client = TestClient(build_app(agent))
    body = client.get("/api/update").text
    json.loads(body, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    for bad in ("abc", "nan", "inf"):
        r = client.get(f"/api/update?since={bad}")
        assert r.status_code == 400 and r.text.startswith("phasescope: since:")
    assert math.isfinite(client.get("/api/update").json()["state"]["time"])


def test_plotly_comes_from_the_installed_wheel(agent: Agent) -> None:
    client = TestClient(build_app(agent))
    page = client.get("/").text
    assert f'src="{PLOTLY_PATH}"' in page
    assert 'data-testid="training-alarm"' in page and "phase.training_alarm" in page  # the alarm badge
    js = client.get(f"/{PLOTLY_PATH}")
    wheel = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert js.content == wheel.read_bytes()
    assert js.headers["content-type"].startswith("application/javascript")


def test_agent_keeps_every_tick_in_the_store_for_verify(shared_data: Path, tmp_path: Path) -> None:
    from phasescope.store.live import Store

    traces = read(shared_data / MIGRATION_RUN)
    store = Store(tmp_path / "live.sqlite")
    a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()), store=store)
    feed(a, ticks(traces, stop=40))
    stored = {t.device.uuid: t for t in Store(tmp_path / "live.sqlite", read_only=True).query()}
    assert set(stored) == {tr.device.uuid for tr in traces}
    for tr in traces:
        got = stored[tr.device.uuid]
        assert len(got) == 40
        assert got["power"][:40].tolist() == pytest.approx(tr["power"][:40].tolist(), nan_ok=True)


def _first_event(url: str, headers: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """(event id, data) of the first update a live /api/stream sends; the connection is then closed."""
    import urllib.request

    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=20) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in r.headers  # gzip would hold events back until a buffer fills
        fields: dict[str, str] = {}
        for raw in r:
            line = raw.decode().rstrip("\n")
            if not line:
                if "data" in fields:
                    return fields.get("id", ""), json.loads(fields["data"])
                continue
            key, _, value = line.partition(": ")
            fields[key] = value
    raise AssertionError("the stream ended before its first event")


def test_stream_pushes_updates_resumes_from_last_event_id_and_needs_the_token(agent: Agent) -> None:
    import urllib.error
    import urllib.request

    from phasescope.serve.server import BackgroundServer, bind

    server = BackgroundServer(build_app(agent, token=TOKEN), bind("127.0.0.1", 0), log_level="critical")
    server.start()
    try:
        url = server.url + "api/stream"
        assert TestClient(build_app(agent, token=TOKEN)).get("/api/stream").status_code == 401
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(url, timeout=10)
        assert denied.value.code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        event_id, first = _first_event(url, auth)
        state, history = first["state"], first["history"]
        assert isinstance(state, dict) and isinstance(history, dict)
        assert state["ticks"] == 90 and [d["index"] for d in state["devices"]] == [3, 4]
        newest = max(h["t"][-1] for h in history.values())
        assert all(len(h["t"]) == 90 for h in history.values())
        assert float(event_id) == newest  # the id is where a reconnect resumes
        # A reconnecting EventSource sends Last-Event-ID: only newer points come (none here), state in full.
        _, again = _first_event(url, {**auth, "Last-Event-ID": event_id})
        assert all(h["t"] == [] for h in again["history"].values())
        assert again["state"]["ticks"] == 90
        _, later = _first_event(url + f"?since={history[state['devices'][1]['uuid']]['t'][-4]}", auth)
        assert [len(h["t"]) for h in later["history"].values()] == [3, 3]
    finally:
        server.stop()
    assert not server.thread.is_alive()


def test_stream_gzips_each_event_as_it_goes(agent: Agent) -> None:
    """With Accept-Encoding: gzip (every browser), each event is flushed through one gzip stream: the first
    event decodes from the bytes received so far, long before the stream ends."""
    import http.client
    import zlib

    from phasescope.serve.server import STOP_WAIT_S, BackgroundServer, bind

    server = BackgroundServer(build_app(agent), bind("127.0.0.1", 0), log_level="critical")
    server.start()
    try:
        port = server.sock.getsockname()[1]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        conn.request("GET", "/api/stream", headers={"Accept-Encoding": "gzip"})
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("content-encoding") == "gzip"
        unpack = zlib.decompressobj(31)
        text, wire = "", 0
        while "\n\n" not in text:
            chunk = r.read1(65536)
            assert chunk, "the stream ended before its first event"
            wire += len(chunk)
            text += unpack.decompress(chunk).decode()
        event = dict(line.split(": ", 1) for line in text.split("\n\n")[0].splitlines())
        body = json.loads(event["data"])
        assert body["state"]["ticks"] == 90 and float(event["id"]) > 0
        assert wire < len(text) / 3  # compressed on the wire
        # Stopping the server ends the open stream itself, promptly, as a complete gzip stream.
        t0 = time.monotonic()
        server.stop()
        assert time.monotonic() - t0 < STOP_WAIT_S
        while chunk := r.read1(65536):
            unpack.decompress(chunk)
        assert unpack.eof
        conn.close()
    finally:
        server.stop()


def test_streams_share_each_tick_encoding(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """N open streams cost one snapshot per tick, not N: the update is built once and shared."""
    from phasescope.serve.app import _Updates

    calls = {"snapshot": 0, "history": 0}
    real_snapshot, real_history = agent.snapshot, agent.history

    def snapshot() -> dict[str, Any]:
        calls["snapshot"] += 1
        return real_snapshot()

    def history(since: float = -math.inf) -> dict[str, Any]:
        calls["history"] += 1
        return real_history(since)

    monkeypatch.setattr(agent, "snapshot", snapshot)
    monkeypatch.setattr(agent, "history", history)
    updates = _Updates(agent)
    bodies = [updates.body(7, -math.inf) for _ in range(5)]
    assert calls == {"snapshot": 1, "history": 1} and len(set(bodies)) == 1
    body, newest = bodies[0]
    assert json.loads(body) == {"state": json.loads(body)["state"], "history": real_history()}
    behind = updates.body(7, newest - 3)  # a stream that is 3 points behind gets its own history
    assert calls == {"snapshot": 1, "history": 2} and behind[1] == newest
    updates.body(8, newest)  # the next tick: built again
    assert calls == {"snapshot": 2, "history": 3}


def test_store_history_and_phase_are_served_before_the_first_tick(shared_data: Path, tmp_path: Path) -> None:
    """`serve --store` after a restart: the API has the store's last minutes and the phase the classifier
    finds in them (real GPT-2 training on GPU 0, GPU 1 idle) before any live sample; then live ticks
    follow the history, and only they count for energy."""
    from phasescope.store.live import Store
    from tests.live_helpers import training_traces
    from tests.views.test_tui import HISTORY_ROWS, _training_rows, write_store

    traces = training_traces(shared_data)
    lo, hi = _training_rows(traces)
    now = time.time()
    path = tmp_path / "live.sqlite"
    write_store(path, traces, lo, hi, now - 5.0)
    train, idle = (t.device.uuid for t in traces)
    said: list[str] = []
    with Store(path) as store:
        a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()), store=store)
        assert a.load_history(now=now, say=said.append) == HISTORY_ROWS * 2
        client = TestClient(build_app(a))
        state = client.get("/api/state").json()
        history = client.get("/api/history").json()
        assert len(said) == 1
        assert said[0].startswith(f"history: {path}: {HISTORY_ROWS * 2} samples of 2 device(s)")
        assert state["ticks"] == 0
        phase = {d["uuid"]: d["phase"] for d in state["devices"]}
        assert phase[train]["phase"] == "training" and 0 < phase[train]["confidence"] <= 1
        assert phase[idle]["phase"] == "idle"
        for t in traces:
            h = history[t.device.uuid]
            assert len(h["t"]) == HISTORY_ROWS and h["t"][-1] == pytest.approx(now - 5.0, abs=1e-3)
            np.testing.assert_allclose(np.array(h["gpu_util"], dtype=float), t["gpu_util"][lo:hi], atol=1e-4)
        assert [b[2] for b in history[train]["bands"]][-1] == "training"
        assert not any(d["energy"]["phases"] for d in state["devices"])  # nothing metered yet
        live = ticks(traces, hi, hi + 3)
        feed(a, (TickBatch(now + 1.0 + i, b.devices, b.values) for i, b in enumerate(live)))
        after = client.get("/api/state").json()
        assert after["ticks"] == 3 and len(client.get("/api/history").json()[train]["t"]) > HISTORY_ROWS
        assert any(d["energy"]["phases"] for d in after["devices"])


def test_load_history_without_a_store_or_with_nothing_recent(shared_data: Path, tmp_path: Path) -> None:
    from phasescope.store.live import Store
    from tests.live_helpers import training_traces
    from tests.views.test_tui import _training_rows, write_store

    traces = training_traces(shared_data)
    a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()))
    assert a.load_history() == 0
    lo, hi = _training_rows(traces)
    path = tmp_path / "old.sqlite"
    write_store(path, traces, lo, hi, time.time() - 7200.0)  # two hours old: outside 600 ticks at 1 Hz
    said: list[str] = []
    with Store(path) as store:
        b = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()), store=store)
        assert b.load_history(say=said.append) == 0
    assert said == [f"history: {path}: nothing from the last 10 min for the watched devices"]
    assert b.state.device_uuids() == [] and b.classifier.reading(traces[0].device.uuid) is None


def test_the_host_gets_its_hooks_phase_and_a_time_cost_not_the_gpu_classifier() -> None:
    import os

    from phasescope.sources.host import HostSource

    src = HostSource(find_torch=False)
    src.watch([os.getpid()])  # this test process: real CPU readings as a workload's sub-row
    a = Agent(src, 0.1, classifier=LiveClassifier(PhaseModel.load()),
              prices=PriceConfig(usd_per_gpu_hour=3600.0, usd_per_kwh=0.12))  # $1 a second of device time
    try:
        a.on_tick(src.read())
        host = a.state.device_uuids()[0]
        first = a.snapshot()["devices"][0]
        assert first["host_device"] is True and first["phase"] is None  # no hooks yet: no phase at all
        a.state.set_process_phases({os.getpid(): "training"})
        for _ in range(3):
            time.sleep(0.05)
            a.on_tick(src.read())
        state = TestClient(build_app(a)).get("/api/state").json()
        dev = state["devices"][0]
        assert dev["phase"] == {"phase": "training", "confidence": None, "proba": {}, "since": None,
                                "t": None, "held": False, "training_alarm": False, "alarm_at": None,
                                "unknown_reason": None, "source": "hooks"}
        # Every device's phase object has the same fields, whoever answers it (hooks or the classifier).
        assert set(dev["phase"]) == {*PhaseReading("idle", 1.0, {}, 0.0, 0.0).to_dict(), "source"}
        assert dev["energy"]["method"] == "none"
        training = dev["energy"]["phases"]["training"]
        assert "other" not in dev["energy"]["phases"]  # the classifier's verdict on CPU load is not metered
        assert training["seconds"] > 0  # ... and its energy is unknown, not 0 J
        assert training["joules"] is None and training["kwh"] is None
        # No power sensor: cost = device time x price; the energy part is unknown, not $0.
        assert training["cost"]["time_usd"] == pytest.approx(training["seconds"], abs=1e-3)  # rounded s
        assert training["cost"]["energy_usd"] is None
        assert a.history()[host]["bands"] == []  # no classifier bands over CPU load either
    finally:
        src.close()


def test_the_ring_holds_what_the_alarm_reads_at_10_hz(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 10 Hz log: `--history 900` ticks would be 90 s, short of the 120 s the alarm was evaluated on. The
    agent sizes the ring from the data's own spacing, and the alarm then gets its whole history."""
    traces = read(shared_data / "nvidia-smi-h100-training/ckpt1.csv")
    source = ReplaySource(traces)
    assert source.native_interval_s <= 0.11
    a = Agent(source, 1.0, classifier=LiveClassifier(PhaseModel.load()), history_ticks=900)
    assert a.state.capacity >= 120 / source.native_interval_s
    seen: list[float] = []
    windows = onset.OnsetAlarm.windows

    def spy(self: onset.OnsetAlarm, tr: Trace) -> Any:  # the history each alarm step is handed
        if len(tr):
            seen.append(float(tr.time[-1] - tr.time[0]))
        return windows(self, tr)

    monkeypatch.setattr(onset.OnsetAlarm, "windows", spy)
    feed(a, ticks(traces, stop=1500))
    assert seen and max(seen) > 115  # with 900 ticks at 10 Hz it was at most 90 s


def test_a_gpu_off_the_bus_is_lost_in_the_api(shared_data: Path) -> None:
    """NVML keeps a lost GPU listed with all-NaN rows: /api/state said "lost": false (and the page never
    showed NO DATA) while the terminal view said NO DATA."""
    traces = read(shared_data / MIGRATION_RUN)
    a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()))
    batches = list(ticks(traces, stop=23))
    feed(a, iter(batches[:20]))
    gone = traces[0].device.uuid
    assert not any(d["lost"] for d in a.snapshot()["devices"])
    for batch in batches[20:]:
        values = batch.values.copy()
        values[0] = np.nan
        a.on_tick(TickBatch(batch.time, batch.devices, values))
    lost = {d["uuid"]: d["lost"] for d in a.snapshot()["devices"]}
    assert lost[gone] and not any(v for u, v in lost.items() if u != gone)


def test_energy_without_a_power_reading_is_null_not_zero(shared_data: Path) -> None:
    """A GPU whose log has neither power nor an energy counter: its phases have time and cost, and its energy
    is unknown (null in /api/state, per phase and in the totals), never 0 J; a powered GPU beside it still
    counts in the totals."""
    from dataclasses import replace

    from phasescope.schema import Trace

    powered = read(shared_data / MIGRATION_RUN)[0]
    blind = powered.without("power", "energy")
    blind = Trace(replace(blind.device, uuid="GPU-no-power-sensor"), blind.time, blind.columns, blind.meta)
    a = Agent(ReplaySource([blind]), 1.0, classifier=LiveClassifier(PhaseModel.load()),
              prices=PriceConfig(usd_per_gpu_hour=2.5, usd_per_kwh=0.12))
    feed(a, ticks([blind], stop=30))
    state = TestClient(build_app(a)).get("/api/state").json()
    phases = state["devices"][0]["energy"]["phases"]
    assert phases and all(e["seconds"] > 0 for e in phases.values())
    assert all(e["joules"] is None and e["kwh"] is None for e in phases.values())
    assert all(t["joules"] is None and t["seconds"] > 0 for t in state["totals"].values())
    both = Agent(ReplaySource([powered, blind]), 1.0, classifier=LiveClassifier(PhaseModel.load()))
    feed(both, ticks([powered, blind], stop=30))
    snap = both.snapshot()
    powered_phases = snap["devices"][0]["energy"]["phases"]
    measured = sum(e["joules"] for e in powered_phases.values())
    # Every phase the powered GPU spent time in totals its joules; a phase only the blind GPU was in has
    # no measured energy at all, so its total is null, not 0.
    totals = snap["totals"]
    assert all(totals[p]["joules"] is not None for p in powered_phases)
    assert all(t["joules"] is None for p, t in totals.items() if p not in powered_phases)
    assert sum(t["joules"] or 0.0 for t in totals.values()) == pytest.approx(measured, abs=1e-2)


def test_a_kwh_price_without_a_power_reading_is_an_unknown_cost_not_zero(shared_data: Path) -> None:
    """Only a $/kWh price, and a GPU without power: its cost is unknown. The totals said "usd": 0.0, which
    the page drew as "$0.0000"; now they are null (the page: "–")."""
    from dataclasses import replace

    from phasescope.schema import Trace

    powered = read(shared_data / MIGRATION_RUN)[0]
    blind = powered.without("power", "energy")
    blind = Trace(replace(blind.device, uuid="GPU-no-power-sensor"), blind.time, blind.columns, blind.meta)
    a = Agent(ReplaySource([blind]), 1.0, classifier=LiveClassifier(PhaseModel.load()),
              prices=PriceConfig(usd_per_kwh=0.12))
    feed(a, ticks([blind], stop=30))
    state = a.snapshot()
    dev = state["devices"][0]
    assert dev["priced"] and all(e["cost"]["total_usd"] is None for e in dev["energy"]["phases"].values())
    assert state["totals"] and all(t["usd"] is None for t in state["totals"].values())
    page = TestClient(build_app(a)).get("/").text
    assert 't.usd === null ? "–"' in page  # the page draws that null as a dash, not $0


def test_a_phase_inside_a_power_dropout_has_an_unknown_energy_cost_not_zero(shared_data: Path) -> None:
    """A metered GPU whose power and energy readings are missing for its first 40 samples: the phase(s) of
    that stretch have null joules, and their energy cost (a $/kWh price only) is null too, not $0 (which the
    page drew as "$0.0000" in the totals)."""
    from phasescope.schema import Trace

    powered = read(shared_data / MIGRATION_RUN)[0]
    cols = dict(powered.columns)
    for sig in ("power", "energy"):
        if sig in cols:
            cols[sig] = np.array(cols[sig], dtype=np.float64)
            cols[sig][:40] = np.nan
    dropout = Trace(powered.device, powered.time, cols, powered.meta)
    a = Agent(ReplaySource([dropout]), 1.0, classifier=LiveClassifier(PhaseModel.load()),
              prices=PriceConfig(usd_per_kwh=0.12))
    feed(a, ticks([dropout], stop=90))
    snap = a.snapshot()
    phases = snap["devices"][0]["energy"]["phases"]
    assert snap["devices"][0]["energy"]["method"] != "none"
    dark = [p for p, e in phases.items() if e["covered_s"] == 0]
    assert dark and any(e["covered_s"] > 0 for e in phases.values())
    for p in dark:
        assert phases[p]["joules"] is None
        assert phases[p]["cost"]["energy_usd"] is None and phases[p]["cost"]["total_usd"] is None
        assert snap["totals"][p]["usd"] is None


def test_process_count_is_every_process_not_the_tables_rows(shared_data: Path) -> None:
    """The table shows 8 process rows and "+N more"; /api/state's count is every process the tick saw
    (12 processes used to read 9: 8 rows plus the summary row)."""
    from dataclasses import replace

    from phasescope.schema import ProcessSample

    traces = read(shared_data / MIGRATION_RUN)
    a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()))
    uuid = traces[0].device.uuid
    batches = list(ticks(traces, stop=3))
    procs = [ProcessSample(time=batches[-1].time, pid=1000 + i, device_uuid=uuid, name=f"w{i}")
             for i in range(12)]
    feed(a, [*batches[:-1], replace(batches[-1], processes=procs)])
    counts = {d["uuid"]: d["processes"] for d in TestClient(build_app(a)).get("/api/state").json()["devices"]}
    assert counts[uuid] == 12 and counts[traces[1].device.uuid] == 0


def test_process_kpis_are_every_hooked_process_from_the_states_records(shared_data: Path) -> None:
    """/api/state's per-process KPIs come from the state's per-PID records, not the table's rows: all 10
    hooked processes of a device are there (the table shows 8 process rows and "+N more", and the KPIs used to
    stop at those 8, their PIDs parsed back out of the rows' keys), each under its own device, with its role
    and hook phase; a process without KPIs, or no longer in the newest tick, has none."""
    from dataclasses import replace

    from phasescope.schema import ProcessSample
    from phasescope.views.table import MAX_PROCESS_ROWS

    traces = read(shared_data / MIGRATION_RUN)
    a = Agent(ReplaySource(traces), 1.0, classifier=LiveClassifier(PhaseModel.load()))
    gpu0, gpu1 = traces[0].device.uuid, traces[1].device.uuid
    batches = list(ticks(traces, stop=3))
    t = batches[-1].time
    procs = [ProcessSample(time=t, pid=2000 + i, device_uuid=gpu0, name=f"w{i}") for i in range(10)]
    procs += [ProcessSample(time=t, pid=3000, device_uuid=gpu1, name="serve"),
              ProcessSample(time=t, pid=3001, device_uuid=gpu1, name="unhooked")]
    feed(a, [*batches[:-1], replace(batches[-1], processes=procs)])
    kpis = {2000 + i: {"samples_per_s": 100.0 + i, "step_time_p50_s": 0.25} for i in range(10)}
    kpis[3000] = {"requests_per_s": 4.0, "latency_p99_s": float("nan")}
    kpis[4242] = {"samples_per_s": 1.0}  # a hooked process the tick did not see
    a.state.set_kpis({}, kpis)
    a.state.set_process_phases({2003: "training", 3000: "inference"})
    a.state.process_labels[3000] = "demo inference"
    shown = [r for r in table.rows(a.state) if r.pid is not None and r.device_uuid == gpu0]
    assert len(shown) == MAX_PROCESS_ROWS  # the table's cap, which the KPIs no longer follow

    devices = {d["uuid"]: d for d in TestClient(build_app(a)).get("/api/state").json()["devices"]}
    by_pid = {p["pid"]: p for p in devices[gpu0]["process_kpis"]}
    assert sorted(by_pid) == [2000 + i for i in range(10)]
    assert by_pid[2009]["kpis"] == {"samples_per_s": 109.0, "step_time_p50_s": 0.25}
    assert by_pid[2003]["phase"] == "training" and by_pid[2000]["phase"] is None
    assert by_pid[2000]["label"] == ""
    (served,) = devices[gpu1]["process_kpis"]
    assert served == {"pid": 3000, "label": "demo inference", "phase": "inference",
                      "kpis": {"requests_per_s": 4.0, "latency_p99_s": None}}  # NaN is null, never 0
