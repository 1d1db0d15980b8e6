"""`fleet --serve`: metrics, page and API over scheduled passes (the pass itself is stubbed with real
verdicts; the real Prometheus path is in test_prometheus_e2e / test_backfill_dcgm)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.http_helpers import TestClient

from phasescope.classify.model import PhaseModel
from phasescope.errors import SourceError
from phasescope.fleet.collect import FetchStats
from phasescope.fleet.judge import judge_all
from phasescope.fleet.scan import ScanOptions, ScanResult
from phasescope.fleet.service import FleetService, metrics_text
from phasescope.fleet.shard import Shard
from phasescope.schema import Trace
from phasescope.serve.fleet_app import make_app, page_html
from phasescope.views.palette import FAVICON

# starlette's TestClient warns that it will move to httpx2; the client it has today works.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _result(traces: dict[str, Trace], model: PhaseModel) -> ScanResult:
    vs = judge_all(traces.values(), model)
    start = min(t.time[0] for t in traces.values())
    end = max(t.time[-1] for t in traces.values())
    return ScanResult(
        start, end, vs, FetchStats(devices=len(vs)), 0.5, 0.25, model.version, "1/2", wall_s=0.6, workers=2
    )


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict[Any, float], name: str, **labels: str) -> list[float]:
    return [
        v for (n, lab), v in samples.items() if n == name and all((k, x) in lab for k, x in labels.items())
    ]


def test_metrics_page_and_api(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    result = _result(fleet_traces, model)
    calls = []

    def fake_scan(opts: ScanOptions, **kw: Any) -> ScanResult:
        calls.append(opts)
        return result

    svc = FleetService(
        ScanOptions(url="http://p:9090", shard=Shard(1, 2)), 60, model=model, scan_fn=fake_scan
    )
    assert _get(_samples(metrics_text(svc)), "phasescope_fleet_up") == [0.0]  # no pass yet
    svc.run_once()
    m = _samples(metrics_text(svc))
    assert _get(m, "phasescope_fleet_up") == [1.0]
    assert _get(m, "phasescope_fleet_gpus", phase="training") == [1.0]
    assert _get(m, "phasescope_fleet_gpus", phase="idle") == [1.0]
    assert _get(m, "phasescope_fleet_gpu_phase", uuid="GPU-inference", phase="inference") == [1.0]
    assert _get(m, "phasescope_fleet_gpu_phase", uuid="GPU-inference", phase="training") == [0.0]
    probs = _get(m, "phasescope_fleet_gpu_phase_probability", uuid="GPU-training")
    assert len(probs) == 4 and sum(probs) == pytest.approx(1.0)
    assert _get(m, "phasescope_fleet_pass_seconds", part="query") == [0.5]
    assert _get(m, "phasescope_fleet_pass_seconds", part="total") == [0.6]
    assert _get(m, "phasescope_fleet_shard_info", shard="1", shards="2") == [1.0]

    html = page_html(svc)
    assert "GPU-training" in html and "<svg" in html and "held-idle waste" in html
    assert FAVICON in html

    with TestClient(make_app(svc)) as client:
        doc = client.get("/api/fleet").json()
        assert {d["uuid"]: d["label"] for d in doc["devices"]} == {
            "GPU-training": "training",
            "GPU-inference": "inference",
            "GPU-idle": "idle",
        }
        assert client.get("/metrics").status_code == 200
        assert "GPU-idle" in client.get("/").text


def test_a_failing_pass_keeps_the_last_result(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    result = _result(fleet_traces, model)
    answers: list[Any] = [result, SourceError("http://p:9090: cannot reach the Prometheus API")]

    def flaky(opts: ScanOptions, **kw: Any) -> ScanResult:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    svc = FleetService(ScanOptions(url="http://p:9090"), 60, model=model, scan_fn=flaky)
    svc.run_once()
    svc.run_once()
    m = _samples(metrics_text(svc))
    assert _get(m, "phasescope_fleet_up") == [0.0]
    assert _get(m, "phasescope_fleet_gpus", phase="training") == [1.0]
    assert "cannot reach" in page_html(svc)


def test_scheduled_passes_run_in_the_background(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    import threading

    result = _result(fleet_traces, model)
    done = threading.Event()
    n = []

    def count(opts: ScanOptions, **kw: Any) -> ScanResult:
        n.append(1)
        if len(n) >= 2:
            done.set()
        return result

    svc = FleetService(ScanOptions(url="http://p:9090"), 0.05, model=model, scan_fn=count)
    svc.start()
    try:
        assert done.wait(10)
    finally:
        svc.stop()
    assert svc.snapshot().passes >= 2


def test_each_new_failure_is_said_once(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    """`fleet --serve` logs why passes fail (before, only /metrics and the page knew), once per reason."""
    result = _result(fleet_traces, model)
    down = SourceError("http://p:9090: cannot reach the Prometheus API")
    answers: list[Any] = [down, down, result, down]

    def flaky(opts: ScanOptions, **kw: Any) -> ScanResult:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    said: list[str] = []
    svc = FleetService(ScanOptions(url="http://p:9090"), 60, model=model, scan_fn=flaky, say=said.append)
    for _ in range(4):
        svc.run_once()
    assert said == [str(down), str(down)]  # down, (still down), up, down again


def test_serve_on_a_taken_port_is_one_clear_line() -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "phasescope", "fleet", "--prometheus", "http://127.0.0.1:9", "--serve",
               "--port", str(port)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"phasescope: cannot listen on 127.0.0.1:{port}: "), lines


def test_the_page_draws_phases_in_the_palettes_colours(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    """The fleet page's timelines and legend take each label's colour and name from views/palette.py."""
    import re

    from phasescope.views.palette import ORDER, PALETTE

    result = _result(fleet_traces, model)
    svc = FleetService(ScanOptions(url="http://p:9090"), 60, model=model, scan_fn=lambda o, **kw: result)
    svc.run_once()
    page = page_html(svc)
    rects = re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})" data-phase="([^"]+)"><title>([^<]+)</title>', page)
    assert {lab for _, lab, _ in rects} >= {"training", "inference", "idle"}
    for fill, lab, title in rects:
        assert fill == PALETTE[lab].fill and title.startswith(PALETTE[lab].name + " ")
    swatch = r'<span data-phase="([^"]+)" style="background:([^;]+);color:([^;]+);[^"]*">([^<]+)</span>'
    legend = re.findall(swatch, page)
    assert [k for k, *_ in legend] == list(ORDER)
    for k, fill, ink, name in legend:
        assert (fill, ink, name) == (PALETTE[k].fill, PALETTE[k].ink, PALETTE[k].name)


def test_metrics_say_each_gpus_sample_interval_and_why_it_is_unknown(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    """A GPU sampled every 30 s (unknown: no model for that interval), one whose exporter froze (stale, not
    classified) and a 1 Hz one: the interval, the stale flag and the reason are series of their own."""
    t = fleet_traces["training"]
    every30 = np.searchsorted(t.time, np.arange(t.time[0], t.time[-1], 30.0))
    coarse = Trace(replace(t.device, uuid="GPU-coarse"), t.time[every30],
                   {k: v[every30] for k, v in t.columns.items()}, {"sample_interval_s": 30.0})
    frozen = Trace(replace(t.device, uuid="GPU-frozen"), t.time, t.columns,
                   {"sample_interval_s": 1.0, "frozen_since": float(t.time[0])})
    fine = Trace(t.device, t.time, t.columns, {"sample_interval_s": 1.0})
    result = _result({"a": coarse, "b": frozen, "c": fine}, model)
    svc = FleetService(ScanOptions(url="http://p:9090"), 60, model=model, scan_fn=lambda o, **kw: result)
    svc.run_once()
    m = _samples(metrics_text(svc))
    assert _get(m, "phasescope_fleet_gpu_sample_interval_seconds", uuid="GPU-coarse") == [30.0]
    assert _get(m, "phasescope_fleet_gpu_stale", uuid="GPU-frozen") == [1.0]
    assert _get(m, "phasescope_fleet_gpu_stale", uuid=t.device.uuid) == [0.0]
    reasons = {dict(lab)["uuid"]: dict(lab)["reason"] for (n, lab), _ in m.items()
               if n == "phasescope_fleet_gpu_unknown_reason_info"}
    assert "sample interval 30s" in reasons["GPU-coarse"]
    assert reasons["GPU-frozen"].startswith("stale")
    assert t.device.uuid not in reasons
    assert _get(m, "phasescope_fleet_gpu_phase", uuid="GPU-frozen", phase="unknown") == [1.0]
