"""`report`'s block of telemetry-only KPIs per device, from real shared traces."""

from __future__ import annotations

import html
from pathlib import Path

from phasescope.classify.model import PhaseModel
from phasescope.kpi.rhythm import trace_kpis
from phasescope.report import build, render
from phasescope.sources.replay import read
from phasescope.views.kpis import kpi_items
from tests.live.test_telemetry_kpis import SERVING_RUN
from tests.live_helpers import TRAINING_RUN


def test_each_device_gets_the_kpi_block_of_its_phase(shared_data: Path) -> None:
    paths = [str(shared_data / TRAINING_RUN), str(shared_data / SERVING_RUN)]
    data = build([(p, read(p)) for p in paths], model=PhaseModel.load())
    page = render(data)
    by_label = {d.label: d for d in data.devices}
    train, serve = by_label["training"], by_label["inference"]
    # The figures are `trace_kpis` of the phase over the device's segments of that phase.
    spans = [(s.start, s.end) for s in train.segments if s.label == "training"]
    assert train.telemetry_kpis == trace_kpis(train.trace, "training", spans)
    assert page.count("<h3>KPIs from telemetry alone</h3>") == 2  # the idle GPU has none to show
    assert page.count("class='telemetry-kpis'") == 2
    for d in (train, serve):
        for item in kpi_items(d.telemetry_kpis):
            assert f"<td>{html.escape(item.name)}</td><td>{html.escape(item.text)}</td>" in page
    names = {i.name for i in kpi_items(train.telemetry_kpis)}
    assert {"step period", "stall share"} <= names
    serve_names = {i.name for i in kpi_items(serve.telemetry_kpis)}
    assert {"busy fraction", "bursts per minute", "saturation"} <= serve_names
