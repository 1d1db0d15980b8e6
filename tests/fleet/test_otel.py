"""The OTLP exporter's metrics, read back through the OpenTelemetry SDK's in-memory reader."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from phasescope.classify.model import PhaseModel
from phasescope.fleet.attribution import attach
from phasescope.fleet.collect import FetchStats
from phasescope.fleet.judge import judge_all
from phasescope.fleet.otel import OtlpFleetExporter
from phasescope.fleet.scan import ScanResult
from phasescope.schema import Trace


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = [(dict(p.attributes or {}), p.value) for p in m.data.data_points]
    return out


def test_otlp_gauges_follow_the_last_pass(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    reader = InMemoryMetricReader()
    exp = OtlpFleetExporter([reader])
    assert _points(reader).get("phasescope.fleet.gpus", []) == []  # nothing before the first pass
    vs = judge_all(fleet_traces.values(), model)
    exp.update(ScanResult(0.0, 1.0, vs, FetchStats(), 0.1, 0.1, model.version))
    pts = _points(reader)
    gpus = {a["phase"]: v for a, v in pts["phasescope.fleet.gpus"]}
    assert gpus["training"] == 1 and gpus["inference"] == 1 and gpus["idle"] == 1
    train = [v for a, v in pts["phasescope.fleet.gpu.phase_probability"] if a["uuid"] == "GPU-training"]
    assert len(train) == 4 and sum(train) == pytest.approx(1.0)
    assert pts["phasescope.fleet.held_idle"][0][1] == 0.0
    exp.shutdown()


def test_otlp_probabilities_carry_the_pod_of_each_gpu(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    # The same pod/namespace as the fleet's /metrics, here from the agent's pod info (fleet/attribution.py).
    pods = {"GPU-training": {"pod": "llm-train-0", "namespace": "research", "container": "trainer"}}
    vs = judge_all(attach(list(fleet_traces.values()), pods), model)
    reader = InMemoryMetricReader()
    exp = OtlpFleetExporter([reader])
    exp.update(ScanResult(0.0, 1.0, vs, FetchStats(), 0.1, 0.1, model.version))
    points = _points(reader)["phasescope.fleet.gpu.phase_probability"]
    by_gpu = {a["uuid"]: (a["pod"], a["namespace"]) for a, _ in points}
    assert by_gpu["GPU-training"] == ("llm-train-0", "research")
    assert by_gpu["GPU-inference"] == by_gpu["GPU-idle"] == ("", "")
    exp.shutdown()


def test_a_collector_base_url_gets_the_metrics_path(
    fleet_traces: dict[str, Trace], model: PhaseModel
) -> None:
    """`fleet --serve --otlp-endpoint http://collector:4318`: the OTLP/HTTP exporter posts to the URL exactly
    as given, so every push went to `/` and the collector answered 404 (logged, nothing ever arrived)."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from http.server import BaseHTTPRequestHandler

    from tests.http_helpers import serving

    from phasescope.errors import InputError

    posted: list[str] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            posted.append(self.path)
            self.send_response(200 if self.path == "/v1/metrics" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    vs = judge_all(fleet_traces.values(), model)
    with serving(Collector) as url:
        for endpoint in (url, url + "/", url + "/v1/metrics"):
            exp = OtlpFleetExporter.to_endpoint(endpoint, interval_s=3600.0)
            exp.update(ScanResult(0.0, 1.0, vs, FetchStats(), 0.1, 0.1, model.version))
            exp.provider.force_flush(5000)
            exp.shutdown()
    assert posted and set(posted) == {"/v1/metrics"}
    with pytest.raises(InputError, match=r"^collector:4318: OTLP endpoint: expected an http:// or https://"):
        OtlpFleetExporter.to_endpoint("collector:4318")


def test_each_pass_is_pushed_when_it_ends(fleet_traces: dict[str, Trace], model: PhaseModel) -> None:
    """`--otlp-endpoint` followed the SDK's fixed 60 s clock, not `--every`: a pass is pushed as it ends."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from http.server import BaseHTTPRequestHandler

    from tests.http_helpers import serving

    posted: list[int] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(len(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    vs = judge_all(fleet_traces.values(), model)
    with serving(Collector) as url:
        exp = OtlpFleetExporter.to_endpoint(url, interval_s=3600.0)  # the SDK's timer never fires here
        try:
            for n in (1, 2):
                exp.push(ScanResult(0.0, 1.0, vs, FetchStats(), 0.1, 0.1, model.version))
                assert len(posted) == n and posted[-1] > 0
        finally:
            exp.shutdown()
