"""Pod attribution for the fleet: the agent's `phasescope_gpu_pod_info` joined onto each GPU's Trace.

The agent keeps pod labels off its per-GPU series (a label whose value changes would start a new series
for every signal) and puts them in the info metric `phasescope_gpu_pod_info` (prom/names.py).
`fetch` reads that metric over the scan's range with one `/api/v1/series` call. `attach` gives its pod,
namespace and container to each Trace whose own series carry none, so the summary groups the agent's GPUs
by namespace and pod as it groups dcgm-exporter's. dcgm-exporter's own pod labels, where present, win.

Over a range the rule is the agent's rule within one scrape: a GPU keeps only the labels all its pod-info
series agree on. A GPU that served two pods in the range, or was shared by two at some point, keeps what
they share (often the namespace), never one pod picked at random.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from phasescope.fleet import names
from phasescope.prom import names as mn
from phasescope.prom.client import PromClient
from phasescope.schema import Trace

POD_INFO = mn.GPU_POD_INFO.name
# exported_* first: a scrape job that sets `pod`/`namespace` target labels (the agent's own pod) makes
# Prometheus rename the agent's labels to exported_*; the plain name then names the agent, not the GPU's user.
_SOURCES: dict[str, tuple[str, ...]] = {k: (f"exported_{k}", k) for k in mn.POD_LABELS}
_GROUPED = ("pod", "namespace")  # a trace with either of these already has its own attribution


def from_label_sets(label_sets: Iterable[Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """device key -> the pod/namespace/container all of its pod-info series agree on (empty ones left out)."""
    seen: dict[str, dict[str, set[str]]] = {}
    for labels in label_sets:
        key = names.device_key(labels)
        if key is None:
            continue
        slot = seen.setdefault(key, {})
        for k, sources in _SOURCES.items():
            # An empty value counts: it is the agent saying "several pods here", which must not be outvoted.
            slot.setdefault(k, set()).add(names.first_label(labels, sources))
    out: dict[str, dict[str, str]] = {}
    for key, slot in seen.items():
        agreed = {k: next(iter(vs)) for k, vs in slot.items() if len(vs) == 1}
        labels = {k: v for k, v in agreed.items() if v}
        if labels:
            out[key] = labels
    return out


def fetch(client: PromClient, start: float, end: float) -> dict[str, dict[str, str]]:
    """device key -> pod/namespace/container from the agent's pod-info series present in [start, end].

    No `--selector` here: it names the GPU series' own labels, and `attach` only touches GPUs already found.
    """
    return from_label_sets(client.series(f'{{__name__="{POD_INFO}"}}', start, end))


def attach(traces: Sequence[Trace], pods: Mapping[str, Mapping[str, str]]) -> list[Trace]:
    """`traces`, with each device's pod labels filled in from `pods` where its own series had none."""
    out: list[Trace] = []
    for t in traces:
        found = pods.get(t.device.uuid)
        extra = t.device.extra
        if not found or any(extra.get(k) for k in _GROUPED):
            out.append(t)
            continue
        device = replace(t.device, extra={**extra, **found})
        out.append(Trace(device, t.time, t.columns, t.meta))
    return out
