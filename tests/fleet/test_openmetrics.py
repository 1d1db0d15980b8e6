"""Backfill text: real traces written as OpenMetrics read back with prometheus_client's parser."""

from __future__ import annotations

import io

import numpy as np
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from phasescope.fleet.openmetrics import write_stream
from phasescope.schema import MIB, DeviceInfo, Trace


def test_both_families_round_trip(fleet_traces: dict[str, Trace]) -> None:
    t = fleet_traces["inference"].take(slice(0, 120))
    d = t.device
    t = Trace(
        DeviceInfo(d.uuid, d.name, d.index, d.host, extra={"pod": "p-1", "namespace": "ns"}),
        t.time,
        t.columns,
    )
    for family, name, scale, uuid_label in (
        ("phasescope", "phasescope_gpu_mem_used_bytes", 1.0, "uuid"),
        ("dcgm", "DCGM_FI_DEV_FB_USED", MIB, "UUID"),
    ):
        buf = io.StringIO()
        n = write_stream([t], buf, family)  # type: ignore[arg-type]
        fams = {f.name: f for f in text_string_to_metric_families(buf.getvalue())}
        assert n == sum(len(f.samples) for f in fams.values())
        samples = fams[name].samples
        assert samples[0].labels[uuid_label] == d.uuid and samples[0].labels["pod"] == "p-1"
        got = np.array([s.value for s in samples]) * scale
        np.testing.assert_allclose(got, t["mem_used"][np.isfinite(t["mem_used"])], rtol=1e-6)
        np.testing.assert_allclose([float(s.timestamp) for s in samples], np.round(t.time, 3), atol=1e-3)
