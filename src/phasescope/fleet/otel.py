"""OpenTelemetry metrics for sites whose collectors speak OTLP rather than scrape Prometheus.

The same figures as the fleet service's /metrics, as observable gauges read from the last pass:
`phasescope.fleet.gpu.phase_probability` (attributes uuid, host, model, gpu, pod, namespace, phase),
`phasescope.fleet.gpus` (attribute phase) and `phasescope.fleet.held_idle` (GPU-hours). Needs the
`otel` extra (opentelemetry-sdk; opentelemetry-exporter-otlp-proto-http for `to_endpoint`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from phasescope.errors import InputError, SourceError
from phasescope.fleet.summary import summary
from phasescope.schema import PHASES

if TYPE_CHECKING:
    from phasescope.fleet.scan import ScanResult
    from phasescope.fleet.service import FleetService


def _sdk() -> Any:
    try:
        from opentelemetry.sdk import metrics as sdk_metrics
    except ImportError:
        raise SourceError("OTLP export needs the 'otel' extra: pip install 'phasescope[otel]'") from None
    return sdk_metrics


class OtlpFleetExporter:
    """Holds the latest ScanResult and reports it through an OpenTelemetry MeterProvider."""

    def __init__(self, readers: Iterable[Any]) -> None:
        sdk_metrics = _sdk()
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.resources import Resource

        self._Observation = Observation
        self._lock = threading.Lock()
        self._result: ScanResult | None = None
        self.provider = sdk_metrics.MeterProvider(
            metric_readers=list(readers), resource=Resource.create({"service.name": "phasescope-fleet"})
        )
        meter = self.provider.get_meter("phasescope.fleet")

        def probabilities(_: CallbackOptions) -> Iterable[Observation]:
            r = self._latest()
            for v in r.verdicts if r else []:
                attrs = {
                    "uuid": v.uuid,
                    "host": v.host,
                    "model": v.model,
                    "gpu": "" if v.gpu is None else str(v.gpu),
                    "pod": v.pod,
                    "namespace": v.namespace,
                }
                for p in PHASES:
                    x = v.probabilities.get(p, math.nan)
                    if math.isfinite(x):
                        yield Observation(x, {**attrs, "phase": p})

        def gpus(_: CallbackOptions) -> Iterable[Observation]:
            r = self._latest()
            if r is not None:
                for p, n in summary(r.verdicts)["phases"].items():
                    yield Observation(n, {"phase": p})

        def held_idle(_: CallbackOptions) -> Iterable[Observation]:
            r = self._latest()
            if r is not None:
                yield Observation(summary(r.verdicts)["waste"]["held_idle_gpu_hours"])

        meter.create_observable_gauge(
            "phasescope.fleet.gpu.phase_probability",
            [probabilities],
            unit="1",
            description="Probability of each phase in the GPU's newest judged window",
        )
        meter.create_observable_gauge(
            "phasescope.fleet.gpus", [gpus], unit="{gpu}", description="GPUs per phase over the range"
        )
        meter.create_observable_gauge(
            "phasescope.fleet.held_idle",
            [held_idle],
            unit="h",
            description="GPU-hours held but idle over the range",
        )

    @classmethod
    def to_endpoint(cls, endpoint: str, interval_s: float = 60.0) -> OtlpFleetExporter:
        """Push every `interval_s` to an OTLP/HTTP collector: its base URL (`http://collector:4318`, the
        metrics path `/v1/metrics` is added) or the full metrics URL (any other path is kept)."""
        sdk_metrics = _sdk()
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InputError(endpoint, "OTLP endpoint", "an http:// or https:// URL, e.g. http://collector:4318")
        if parts.path in ("", "/"):  # posted to as given, a bare collector URL answers 404
            endpoint = urlunsplit(parts._replace(path="/v1/metrics"))
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError:
            raise SourceError(
                "OTLP export needs opentelemetry-exporter-otlp-proto-http: pip install 'phasescope[otel]'"
            ) from None
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=endpoint), export_interval_millis=interval_s * 1000
        )
        del sdk_metrics
        return cls([reader])

    def update(self, result: ScanResult) -> None:
        with self._lock:
            self._result = result

    def _latest(self) -> ScanResult | None:
        with self._lock:
            return self._result

    def push(self, result: ScanResult) -> None:
        """Take a pass's result and export it now, so the collector sees each pass once, as `--every` paces
        them, rather than on the SDK's own clock."""
        self.update(result)
        self.provider.force_flush()

    def attach(self, service: FleetService) -> None:
        service.on_result(self.push)

    def shutdown(self) -> None:
        self.provider.shutdown()
