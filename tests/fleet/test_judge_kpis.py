"""Fleet verdicts carry the telemetry-only KPIs of each GPU's phase (JSON `kpis`, the devices table's
column), from real labelled traces."""

from __future__ import annotations

import io
import json

from rich.console import Console

from phasescope.classify.model import PhaseModel
from phasescope.fleet.judge import judge
from phasescope.fleet.summary import render
from phasescope.kpi.rhythm import trace_kpis
from phasescope.schema import Trace
from phasescope.views.kpis import kpi_text


def test_fleet_json_and_table_carry_the_kpis_of_the_phase(fleet_traces: dict[str, Trace],
                                                         model: PhaseModel) -> None:
    train, serve = judge(fleet_traces["training"], model), judge(fleet_traces["inference"], model)
    assert (train.label, serve.label) == ("training", "inference")
    docs = [json.loads(json.dumps(v.to_dict(), allow_nan=False)) for v in (train, serve)]  # strict JSON
    t, s = docs[0]["kpis"], docs[1]["kpis"]
    assert t["phase"] == "training" and {"step_period_s", "stall_fraction"} <= t.keys()
    assert s["phase"] == "inference" and {"busy_fraction", "burst_rate_per_s", "saturated"} <= s.keys()
    assert "step_period_s" not in s and "busy_fraction" not in t
    # Over the range's segments of its phase: the whole labelled span is one training segment here.
    spans = [(seg.start, seg.end) for seg in train.segments if seg.label == "training"]
    offline = trace_kpis(fleet_traces["training"], "training", spans)
    assert t["stall_fraction"] == offline["stall_fraction"]
    buf = io.StringIO()
    render([train, serve], Console(file=buf, width=320), show_devices=True)
    out = buf.getvalue()
    assert "KPIs (telemetry)" in out
    for v in (train, serve):
        assert kpi_text(v.kpis) in out
    assert "stall " in kpi_text(train.kpis) and "busy " in kpi_text(serve.kpis)
