"""Which Prometheus series carry which schema signal, and which labels name a device, host and pod.

Two metric families are understood:

- phasescope's own agent: `phasescope_gpu_<signal>_<unit>` in base units, named by the exporter's own
  table (`serve.metric_names.SIGNAL_METRICS`);
- NVIDIA dcgm-exporter: `DCGM_FI_DEV_*` / `DCGM_FI_PROF_*`, mapped by the dcgm-exporter reader's own
  table (`sources.replay.dcgm_prom.FIELDS`), so a field means the same thing in a file and in Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from phasescope.prom.names import LEGACY_SIGNAL_NAMES, SIGNAL_METRICS
from phasescope.schema import PAPER_SIGNALS, SIGNALS
from phasescope.sources.replay.dcgm_prom import FIELDS as DCGM_FIELDS

PREFIX = "phasescope_gpu_"


@dataclass(frozen=True)
class MetricMap:
    """metric name -> (signal, factor into base units), for the signals the fleet reads."""

    metrics: Mapping[str, tuple[str, float]]

    def names(self) -> list[str]:
        return sorted(self.metrics)

    def name_regex(self) -> str:
        return "|".join(self.names())


def metric_map(signals: Iterable[str] = PAPER_SIGNALS) -> MetricMap:
    """Both families' names for `signals`. Counters are left out: a rate of them is not a gauge sample."""
    wanted = set(signals)
    out: dict[str, tuple[str, float]] = {}
    for s in wanted:
        if SIGNALS[s].kind == "gauge":
            out[SIGNAL_METRICS[s].name] = (s, 1.0)
    out |= {old: (s, 1.0) for old, s in LEGACY_SIGNAL_NAMES.items() if s in wanted}  # older agents' series
    for field, (sig, factor) in DCGM_FIELDS.items():
        if sig in wanted and SIGNALS[sig].kind == "gauge":
            out[field] = (sig, factor)
    return MetricMap(out)


# Label names, most specific first. dcgm-exporter spells them its own way. exported_* come first: when a
# scrape job sets `pod`/`namespace` target labels (the exporter's own pod), Prometheus renames the
# exporter's labels (the GPU user's pod) to exported_*, and the plain name then names the exporter.
DEVICE_LABELS = ("uuid", "UUID")
MIG_LABELS = ("GPU_I_ID",)
HOST_LABELS = ("host", "Hostname", "hostname", "node", "instance")
MODEL_LABELS = ("model", "modelName")
INDEX_LABELS = ("gpu",)
POD_LABELS = ("exported_pod", "pod", "pod_name")
NAMESPACE_LABELS = ("exported_namespace", "namespace", "pod_namespace")
CONTAINER_LABELS = ("exported_container", "container", "container_name")


def first_label(labels: Mapping[str, str], names: Iterable[str]) -> str:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return ""


def device_key(labels: Mapping[str, str]) -> str | None:
    """The device a series belongs to: its uuid, with the MIG instance where there is one."""
    base = first_label(labels, DEVICE_LABELS)
    if not base:
        return None
    gi = first_label(labels, MIG_LABELS)
    return f"{base}/gi{gi}" if gi else base
