"""The fast read path against the old one, through the real Prometheus: real labelled traces are backfilled
with `promtool`, served by /usr/bin/prometheus, and fetched once through `http.client` (the default for a
plain-http URL) and once through httpx (the path every answer took before). The bytes, the columnar decoding
against plain `json.loads`, and the fleet verdicts must all be the same; the pass reports its stages."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from tests.fleet.harness import Procs, backfill, free_port, start_prometheus

from phasescope.classify.model import PhaseModel
from phasescope.fleet.collect import fetch_traces
from phasescope.fleet.judge import judge_all
from phasescope.fleet.scan import ScanOptions, scan
from phasescope.prom.client import PromClient, _parse_matrix_json, parse_matrix
from phasescope.prom.names import SIGNAL_METRICS
from phasescope.schema import DeviceInfo, Trace

SPAN_S = 600.0


@pytest.fixture(scope="module")
def prometheus(fleet_traces: dict[str, Trace], tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    tuple[str, float]
]:
    """(URL, end) of a real Prometheus with the three labelled traces, each twice (six GPUs, three hosts)."""
    tmp = tmp_path_factory.mktemp("prom-paths")
    end = float(np.floor(time.time() / 60) * 60 - 3600)  # whole minutes, an hour ago
    traces = []
    for label, t in fleet_traces.items():
        for copy in range(2):
            dev = DeviceInfo(f"GPU-{label}-{copy}", t.device.name, copy, f"node-{label}")
            traces.append(Trace(dev, t.time - t.time[-1] + end - 7 * copy, t.columns, t.meta))
    # scrape targets with `up` series, so the pass makes its `up` call as against a live Prometheus
    targets = {t.device.host: {"job": "gpu-agent", "instance": f"{t.device.host}:9400"} for t in traces}
    backfill(traces, tmp, "phasescope", targets)
    procs = Procs()
    try:
        config = "global:\n  scrape_interval: 15s\nscrape_configs: []\n"
        yield start_prometheus(procs, tmp, config, free_port()), end
    finally:
        procs.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_old_and_new_read_paths_agree(prometheus: tuple[str, float], model: PhaseModel) -> None:
    url, end = prometheus
    start = end - SPAN_S
    with PromClient(url) as new, PromClient(url, transport=httpx.HTTPTransport()) as old:
        # one raw range answer: the same bytes either way, and the same series by either decoder
        power = SIGNAL_METRICS["power"].name
        form = {"query": power, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"}
        body = new._post("/api/v1/query_range", form)
        assert body == old._post("/api/v1/query_range", form)
        fast, plain = parse_matrix(body), _parse_matrix_json(body, "test")
        assert len(fast) == 6 and [s.labels for s in fast] == [s.labels for s in plain]
        for f, p in zip(fast, plain, strict=True):
            assert f.time.size > 200  # the idle span is the shortest, 255 s
            np.testing.assert_array_equal(f.time, p.time)
            np.testing.assert_array_equal(f.values, p.values)
        # the whole fetch, batches of two devices, and the verdicts
        got = {}
        for name, client in (("new", new), ("old", old)):
            traces = fetch_traces(client, start=start, end=end, max_samples=2 * 10 * 601)
            got[name] = {v.uuid: v.to_dict() for v in judge_all(traces, model)}
        assert len(got["new"]) == 6 and got["new"] == got["old"]
        assert {d["label"] for d in got["new"].values()} >= {"training", "inference"}
        # the new path ran through http.client, the old through httpx: both clocked
        assert new.clock.calls["http"] >= 3 and old.clock.calls["decode"] >= 3


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_pass_reports_every_stage(prometheus: tuple[str, float], model: PhaseModel) -> None:
    url, end = prometheus
    r = scan(ScanOptions(url=url, since_s=SPAN_S, end=end, workers=2, max_samples=3 * 10 * 601), model=model)
    assert len(r.verdicts) == 6 and r.stats.queries >= 2
    stages = r.to_dict()["timing"]["stages"]
    # the device listing and the `up` targets once each, then every batch's four stages
    assert stages["series"]["calls"] == 1 and stages["up"]["calls"] == 1
    for name in ("http", "decode", "assemble", "classify"):
        assert stages[name]["calls"] == r.stats.queries, name
        assert stages[name]["wall_s"] > 0 and stages[name]["cpu_s"] >= 0
    # the stages split the two parts the pass already reported: query (listing + batches) and classify
    fetch = sum(stages[k]["wall_s"] for k in ("series", "up", "gpu_info", "attribution", "limits", "http",
                                              "decode", "assemble") if k in stages)
    assert 0 < fetch <= r.query_s + 0.01  # query_s also holds the listing's own Python work
    assert stages["classify"]["wall_s"] == pytest.approx(r.classify_s, rel=0.05, abs=0.01)


def test_the_old_path_is_kept_where_httpx_is_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """https, basic auth in the URL, a proxy from the environment and test transports stay with httpx."""
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    assert PromClient("http://prom:9090")._direct
    assert not PromClient("https://prom:9090")._direct
    assert not PromClient("http://u:p@prom:9090")._direct
    monkeypatch.setenv("http_proxy", "http://proxy:3128")
    monkeypatch.setenv("no_proxy", "")
    assert not PromClient("http://prom:9090")._direct
