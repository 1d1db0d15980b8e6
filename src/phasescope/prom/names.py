"""Prometheus metric names, one place: derived from the schema's signals and units, per Prometheus practice.

Per device signal: `phasescope_gpu_<signal>_<unit>` with the schema's base unit (`phasescope_gpu_power_watts`,
`phasescope_gpu_mem_used_bytes`, `phasescope_gpu_util_ratio`); counters end in `_total`
(`phasescope_gpu_energy_joules_total`); the throttle bitmask has no unit (`phasescope_gpu_throttle_reasons`).
A signal whose name already starts with `gpu_` does not repeat it (`gpu_util` -> `phasescope_gpu_util_ratio`);
`LEGACY_SIGNAL_NAMES` keeps the names older agents wrote, which readers accept too.
Every device series carries the labels in `DEVICE_LABELS`, and only those: a label whose value changes
(the pod on a GPU) would start a new series each time. Pod attribution is in two info-style metrics, value 1,
joined in PromQL (`* on (uuid) group_left (pod, namespace, container) phasescope_gpu_pod_info`):

- `phasescope_gpu_pod_info{DEVICE_LABELS, pod, namespace, container}`: one series per GPU whose processes
  run in containers. A label the GPU's containers disagree on (two pods share the GPU) is empty, so the
  series stays one per GPU and the join stays many-to-one.
- `phasescope_gpu_process_info{DEVICE_LABELS, pid, pod, namespace, container}`: one series per GPU process
  in a container, which names every pod on a shared GPU.

What a device is, beyond its identity labels, is one more info metric, so it costs one series per GPU
rather than more labels on every series:
`phasescope_gpu_info{DEVICE_LABELS, parent_uuid, mig_profile, pci_bus_id, node}`.
For a MIG instance `parent_uuid` is its physical GPU's uuid and `mig_profile` its GPU-instance profile
(`3g.40gb`); both are empty for a whole GPU. The fleet reads it to price a MIG GPU once (fleet/collect.py).
`pci_bus_id` is the source's (empty where it names none); `node` is the downward API's `NODE_NAME`, else the
`host` label. Why not on every series: docs/design/serve.md, "Labels".

GPU health (NVML, physical GPUs only, read every 10 s: sources/nvml.py) is not a schema signal and has its own
metrics, each absent where the GPU does not offer it (no ECC on a consumer GPU), never 0:
`phasescope_gpu_ecc_errors_total{type, scope}`, `phasescope_gpu_remapped_rows_total{cause}`,
`phasescope_gpu_row_remap_pending`, `phasescope_gpu_row_remap_failure`, `phasescope_gpu_pcie_replays_total`,
`phasescope_gpu_mem_temperature_celsius`, `phasescope_gpu_xid_errors_total`, `phasescope_gpu_last_xid`,
`phasescope_gpu_critical_xid_errors_total` and `phasescope_gpu_last_critical_xid`.
deploy/prometheus/dcgm_compat.yml republishes them under dcgm-exporter's names.

Telemetry-only KPIs (kpi/rhythm.py) of each GPU's current phase are gauges of their own
(`TELEMETRY_KPI_METRICS`: `phasescope_gpu_step_period_seconds`, `phasescope_gpu_stall_ratio`,
`phasescope_gpu_busy_ratio`, `phasescope_gpu_burst_rate_per_second`, ...), absent where a figure has no value.

The host source's pseudo-device (CPU and RAM, no GPU) is exported as `phasescope_host_*`, never under a
`phasescope_gpu_*` name, so nothing that counts GPUs counts a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from phasescope.schema import HELD_MEM_BYTES, SIGNALS

PREFIX = "phasescope"
DEVICE_LABELS: tuple[str, ...] = ("uuid", "gpu", "model", "host")
POD_LABELS: tuple[str, ...] = ("pod", "namespace", "container")
HOST_LABELS: tuple[str, ...] = ("host", "model")  # model: the CPU model
# On phasescope_gpu_info only (one series per GPU), not on every series: see the docstring.
GPU_INFO_LABELS: tuple[str, ...] = ("parent_uuid", "mig_profile", "pci_bus_id", "node")

# schema unit -> Prometheus unit suffix ("" = none: a bitmask is not a quantity).
_UNIT_SUFFIX: dict[str, str] = {
    "ratio": "ratio",
    "bytes": "bytes",
    "watts": "watts",
    "joules": "joules",
    "celsius": "celsius",
    "hertz": "hertz",
    "bytes_per_second": "bytes_per_second",
    "bitmask": "",
}


@dataclass(frozen=True)
class MetricName:
    """A metric as exposed: `name` is the full sample name (with `_total` for a counter)."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str

    @property
    def family(self) -> str:
        """The name prometheus_client's metric families take: a counter's without its `_total`."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


def signal_metric(signal: str) -> MetricName:
    """The metric of one schema signal."""
    sig = SIGNALS[signal]
    suffix = _UNIT_SUFFIX[sig.unit]
    stem = sig.name.removeprefix("gpu_")  # `gpu_util` under `phasescope_gpu_` would read twice
    base = f"{PREFIX}_gpu_{stem}" + (f"_{suffix}" if suffix else "")
    if sig.kind == "counter":
        return MetricName(base + "_total", "counter", sig.help)
    return MetricName(base, "gauge", sig.help)


SIGNAL_METRICS: dict[str, MetricName] = {s: signal_metric(s) for s in SIGNALS}
# Names earlier agents wrote (old name -> signal): a Prometheus keeps those series for weeks, so readers
# (fleet/names.py) accept them beside SIGNAL_METRICS. Never exported.
LEGACY_SIGNAL_NAMES: dict[str, str] = {f"{PREFIX}_gpu_gpu_util_ratio": "gpu_util"}

PHASE_PROBABILITY = MetricName(
    f"{PREFIX}_gpu_phase_probability", "gauge",
    "Probability of each phase (label phase: training, inference, other, idle) in the newest judged window",
)
PHASE_CONFIDENCE = MetricName(
    f"{PREFIX}_gpu_phase_confidence", "gauge", "Probability of the device's current phase (NaN when unknown)"
)
PHASE_CURRENT = MetricName(
    f"{PREFIX}_gpu_phase", "gauge", "1 for the device's current phase (incl. unknown), 0 for the others"
)
PHASE_SECONDS = MetricName(
    f"{PREFIX}_gpu_phase_seconds_total", "counter", "Device time spent in each phase since the agent started"
)
PHASE_ENERGY = MetricName(
    f"{PREFIX}_gpu_phase_energy_joules_total", "counter",
    "Energy drawn in each phase since the agent started (energy counter where present, else power integral)",
)
IDLE_HELD = MetricName(
    f"{PREFIX}_gpu_idle_held", "gauge",
    "1 while the device is idle but held (a process on it, or at least "
    f"{HELD_MEM_BYTES / 1024**3:g} GiB of its memory in use: a loaded model or CUDA context serving "
    "nothing), else 0",
)
TRAINING_ALARM = MetricName(
    f"{PREFIX}_gpu_training_alarm", "gauge",
    "1 while the training-started alarm (onset model) holds for the device, else 0",
)
TRAINING_ALARM_START = MetricName(
    f"{PREFIX}_gpu_training_alarm_start_time_seconds", "gauge",
    "Unix time (the telemetry's clock) the holding training-started alarm fired; absent while none holds",
)
PHASE_DISAGREEMENT = MetricName(
    f"{PREFIX}_gpu_phase_disagreement", "gauge",
    "1 while the device's processes claim one phase (a serving engine: inference; a trainer: training) and "
    "its telemetry shows the other, else 0; absent where the processes are not this host's",
)
ENGINE_INFO = MetricName(
    f"{PREFIX}_gpu_engine_info", "gauge",
    "1 per serving engine or trainer its processes name themselves as (context, never the phase)",
)
SOURCE_UP = MetricName(
    f"{PREFIX}_source_up", "gauge", "1 while the telemetry source delivers fresh samples, else 0"
)
SOURCE_ERRORS = MetricName(
    f"{PREFIX}_source_errors_total", "counter", "Failed reads of the telemetry source, by call"
)
SAMPLER_TICKS = MetricName(f"{PREFIX}_sampler_ticks_total", "counter", "Sampling ticks run")
SAMPLER_SKIPPED = MetricName(
    f"{PREFIX}_sampler_skipped_ticks_total", "counter", "Sampling slots skipped because a tick overran"
)
SCRAPE_DURATION = MetricName(
    f"{PREFIX}_scrape_duration_seconds", "gauge", "Time taken to build this scrape's metrics"
)
GPU_POD_INFO = MetricName(
    f"{PREFIX}_gpu_pod_info", "gauge",
    "1 per GPU whose processes run in containers: their pod, namespace and container "
    "(empty where the GPU's containers disagree)",
)
GPU_PROCESS_INFO = MetricName(
    f"{PREFIX}_gpu_process_info", "gauge",
    "1 per GPU process in a container: its pid, pod, namespace and container",
)
GPU_INFO = MetricName(
    f"{PREFIX}_gpu_info", "gauge",
    "1 per GPU: a MIG instance's parent GPU uuid and GPU-instance profile (both empty for a whole GPU)",
)

# GPU health (sources/base.py GpuHealth).
GPU_ECC_ERRORS = MetricName(
    f"{PREFIX}_gpu_ecc_errors_total", "counter",
    "ECC memory errors by type (corrected: single-bit, uncorrected: double-bit) and scope "
    "(volatile: since the driver loaded, aggregate: the GPU's lifetime; do not sum the two)",
)
GPU_REMAPPED_ROWS = MetricName(
    f"{PREFIX}_gpu_remapped_rows_total", "counter",
    "Memory rows remapped to spare rows over the GPU's lifetime, by the cause of the errors "
    "(correctable, uncorrectable)",
)
GPU_ROW_REMAP_PENDING = MetricName(
    f"{PREFIX}_gpu_row_remap_pending", "gauge", "1 while a row remap waits for a GPU reset, else 0"
)
GPU_ROW_REMAP_FAILURE = MetricName(
    f"{PREFIX}_gpu_row_remap_failure", "gauge", "1 once a row remap has failed (no spare row left), else 0"
)
GPU_PCIE_REPLAYS = MetricName(
    f"{PREFIX}_gpu_pcie_replays_total", "counter", "PCIe replays (link-level retries) since the driver loaded"
)
GPU_MEM_TEMPERATURE = MetricName(
    f"{PREFIX}_gpu_mem_temperature_celsius", "gauge", "GPU memory (HBM) temperature"
)
GPU_XID_ERRORS = MetricName(
    f"{PREFIX}_gpu_xid_errors_total", "counter", "XID error events (any code) seen since the agent started"
)
GPU_LAST_XID = MetricName(
    f"{PREFIX}_gpu_last_xid", "gauge",
    "Code of the newest XID error seen since the agent started (0: none), as dcgm-exporter's XID_ERRORS",
)
# The critical XIDs apart (sources/nvml.py CRITICAL_XIDS): the last XID alone would let an application XID
# that follows a critical one (48, then 45 as the channel is torn down) hide it from an alert.
GPU_CRITICAL_XID_ERRORS = MetricName(
    f"{PREFIX}_gpu_critical_xid_errors_total", "counter",
    "XID error events after which the GPU needs a reset or replacing (48, 62, 64, 74, 79, 95, 119), seen "
    "since the agent started",
)
GPU_LAST_CRITICAL_XID = MetricName(
    f"{PREFIX}_gpu_last_critical_xid", "gauge",
    "Code of the newest critical XID error seen since the agent started (0: none)",
)
HEALTH_METRICS: tuple[MetricName, ...] = (
    GPU_ECC_ERRORS, GPU_REMAPPED_ROWS, GPU_ROW_REMAP_PENDING, GPU_ROW_REMAP_FAILURE, GPU_PCIE_REPLAYS,
    GPU_MEM_TEMPERATURE, GPU_XID_ERRORS, GPU_LAST_XID, GPU_CRITICAL_XID_ERRORS, GPU_LAST_CRITICAL_XID,
)

# Telemetry-only KPIs of the device's current phase (kpi/rhythm.py `trace_kpis`, computed by the live
# pipeline once per classifier run): figure -> metric. A figure with no value (no rhythm found, or another
# phase's figure) has no sample, never 0. No `method` label: a method's text is not a bounded value; it is
# in the help, in /api/state and in `classify --json`.
TELEMETRY_KPI_METRICS: dict[str, MetricName] = {
    "step_period_s": MetricName(
        f"{PREFIX}_gpu_step_period_seconds", "gauge",
        "Training step period from the rhythm of utilisation and power (autocorrelation, telemetry only; "
        "absent when no rhythm stands out, e.g. steps faster than NVML refreshes)",
    ),
    "stall_fraction": MetricName(
        f"{PREFIX}_gpu_stall_ratio", "gauge",
        "Training: share of time no kernel ran, from the first to the last busy sample (mean 1 - gpu_util)",
    ),
    "busy_fraction": MetricName(
        f"{PREFIX}_gpu_busy_ratio", "gauge", "Inference: share of time a kernel ran (mean gpu_util)",
    ),
    "burst_rate_per_s": MetricName(
        f"{PREFIX}_gpu_burst_rate_per_second", "gauge",
        "Inference: busy bursts (runs of samples with kernels running) per second",
    ),
    "burst_mean_s": MetricName(
        f"{PREFIX}_gpu_burst_mean_seconds", "gauge", "Inference: mean length of a busy burst",
    ),
    "saturated": MetricName(
        f"{PREFIX}_gpu_saturated", "gauge",
        "Inference: 1 while the GPU is busy nearly all the time with power at its plateau (no head-room), "
        "else 0",
    ),
}
STEP_PERIOD_CONFIDENCE = MetricName(
    f"{PREFIX}_gpu_step_period_confidence", "gauge",
    "How clearly the step period stands out (the autocorrelation peak's prominence, 0-1); absent with it",
)

# The host source's pseudo-device: schema column -> what it holds there (sources/host.py).
HOST_METRICS: dict[str, MetricName] = {
    "gpu_util": MetricName(f"{PREFIX}_host_cpu_util_ratio", "gauge", "Host CPU utilisation, all cores"),
    "mem_used": MetricName(f"{PREFIX}_host_memory_used_bytes", "gauge", "Host RAM in use, not available"),
    "mem_total": MetricName(f"{PREFIX}_host_memory_total_bytes", "gauge", "Host RAM installed"),
}
