"""Prometheus text-format scrapes of NVIDIA dcgm-exporter (`DCGM_FI_DEV_*`, `DCGM_FI_PROF_*`).

One Trace per device, keyed by the `UUID` label (else `gpu`/`device`), and per MIG instance by
`GPU_I_ID`. Label sets may differ from line to line (pod labels, driver labels). A file may hold
several scrapes one after another: the n-th sample of a series belongs to scrape n. Sample
timestamps (ms), where present, give the time; otherwise scrape n sits at n * interval (option
`interval=`, default 30 s, dcgm-exporter's default collection interval). Comments, other metrics and
noise around the text (curl progress, shell lines) are skipped.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import KB_PER_S, MHZ, MIB, PERCENT, DeviceInfo, FloatArray, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    float_option,
    guarded,
    head_text,
    read_text,
    synth_uuid,
)

NAME = "dcgm-prom"
OPTIONS = ("interval",)

# DCGM field -> (signal, factor into base units). Units per the dcgm-exporter HELP text / DCGM docs.
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", PERCENT),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util", PERCENT),
    "DCGM_FI_DEV_FB_USED": ("mem_used", MIB),
    "DCGM_FI_DEV_FB_TOTAL": ("mem_total", MIB),
    "DCGM_FI_DEV_POWER_USAGE": ("power", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock", MHZ),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock", MHZ),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy", 1e-3),  # mJ
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx", 1.0),  # bytes/s
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx", 1.0),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("pcie_tx", KB_PER_S),  # KB/s (older exporters)
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": ("pcie_rx", KB_PER_S),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),  # ratio 0-1
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", 1.0),
}
# Fields used only to derive memory total (MiB) when FB_TOTAL is absent.
_FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")

_SAMPLE_RE = re.compile(
    r"^(?P<name>DCGM_FI_[A-Za-z0-9_]+)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def sniff(path: PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    return any(line.startswith("DCGM_FI_") for line in head_text(p, 65536).splitlines())


def _labels(text: str | None) -> dict[str, str] | None:
    if not text:
        return {}
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL_RE.match(text, pos)
        if m is None:
            return None if text[pos:].strip(" ,") else out
        out[m.group(1)] = m.group(2)
        pos = m.end()
    return out


def _device_key(labels: dict[str, str]) -> tuple[str, str] | None:
    base = labels.get("UUID") or labels.get("uuid") or labels.get("gpu") or labels.get("device")
    if not base:
        return None
    return base, labels.get("GPU_I_ID", "")


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    opts = check_options(p, options, OPTIONS, NAME)
    interval = float_option(p, opts, "interval", 30.0)
    # device -> field -> list of (explicit time or None, value)
    series: dict[tuple[str, str] | None, dict[str, list[tuple[float | None, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    info: dict[tuple[str, str] | None, dict[str, str]] = {}
    ignored: dict[tuple[str, str] | None, set[str]] = defaultdict(set)
    skipped = 0
    for i, raw in enumerate(read_text(p).splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("DCGM_FI_"):
            skipped += 1  # another exporter's metric, or noise around the scrape
            continue
        m = _SAMPLE_RE.match(line)
        labels = _labels(m.group("labels")) if m else None
        if m is None or labels is None:
            raise InputError(
                p, f"line {i}", "a Prometheus sample 'DCGM_FI_NAME{label=\"v\",...} value'", line[:60]
            )
        name = m.group("name")
        key = _device_key(labels)
        if key is not None and key not in info:
            info[key] = labels
        ts = float(m.group("ts")) / 1000.0 if m.group("ts") else None
        if name not in FIELDS and name not in _FB_PARTS:
            # A DCGM field with no schema signal (ENC_UTIL, XID_ERRORS, ...): it still marks a scrape time.
            ignored[key].add(name)
            series[key]["~" + name].append((ts, np.nan))
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            raise InputError(p, f"line {i}, field {name}", "a number", m.group("value")) from None
        series[key][name].append((ts, value))
    labelled = [k for k in series if k is not None]
    if not series:
        raise InputError(p, "content", "DCGM_FI_* samples of a known field", "none")
    unlabelled = sum(len(v) for v in series.get(None, {}).values())
    keys: list[Any] = labelled if labelled else [None]
    traces = [_trace(p, k, series[k], info.get(k, {}) if k else {}, n, interval) for n, k in enumerate(keys)]
    for t, k in zip(traces, keys, strict=True):
        t.meta["skipped_lines"] = skipped
        t.meta["unmapped_fields"] = sorted(ignored.get(k, set()))
        if labelled and unlabelled:
            t.meta["unlabelled_samples_ignored"] = unlabelled
    return traces


def _trace(
    p: Path,
    key: tuple[str, str] | None,
    fields: dict[str, list[tuple[float | None, float]]],
    labels: dict[str, str],
    n: int,
    interval: float,
) -> Trace:
    # Time of each sample: its own timestamp, else its scrape ordinal (n-th sample of that series).
    stamped: dict[str, list[tuple[float, float]]] = {}
    for name, samples in fields.items():
        stamped[name] = [(ts if ts is not None else k * interval, v) for k, (ts, v) in enumerate(samples)]
    times = np.unique(np.array([t for s in stamped.values() for t, _ in s], dtype=np.float64))
    where = {t: i for i, t in enumerate(times.tolist())}

    def column(name: str) -> FloatArray:
        col = np.full(times.size, np.nan)
        for t, v in stamped.get(name, []):
            col[where[t]] = v
        return col

    cols: dict[str, FloatArray] = {}
    for name, (sig, factor) in FIELDS.items():
        if name in stamped and sig not in cols:
            cols[sig] = column(name) * factor
    derived = False
    if "mem_total" not in cols and all(f in stamped for f in _FB_PARTS[:2]):
        reserved = column(_FB_PARTS[2]) if _FB_PARTS[2] in stamped else np.zeros(times.size)
        cols["mem_total"] = (column(_FB_PARTS[0]) + column(_FB_PARTS[1]) + reserved) * MIB
        derived = True
    gpu = labels.get("gpu", "")
    index = int(gpu) if gpu.isdigit() else None
    if key is None:
        uuid, parent = synth_uuid(p, n), None
    else:
        base, gi = key
        base_uuid = base if base.startswith(("GPU-", "MIG-")) else synth_uuid(p, base)
        uuid, parent = (f"{base_uuid}/gi{gi}", base_uuid) if gi else (base_uuid, None)
    extra: dict[str, str] = {
        k: labels[k]
        for k in ("GPU_I_PROFILE", "GPU_I_ID", "pci_bus_id", "pod", "namespace", "container")
        if k in labels
    }
    device = DeviceInfo(
        uuid=uuid,
        name=labels.get("modelName", ""),
        index=index,
        host=labels.get("Hostname", labels.get("hostname", "")),
        parent_uuid=parent,
        extra=extra,
    )
    has_ts = any(ts is not None for s in fields.values() for ts, _ in s)
    meta = base_meta(
        p,
        NAME,
        run=p.stem,
        gpu_index=index if index is not None else n,
        clock="unix" if has_ts else "scrape",
        scrapes=int(times.size),
    )
    if not has_ts:
        meta["interval_s"] = interval
    if derived:
        meta["mem_total_derived"] = "FB_USED + FB_FREE + FB_RESERVED"
    if "DCGM_DRIVER_VERSION" in labels or "DCGM_FI_DRIVER_VERSION" in labels:
        meta["driver_version"] = labels.get("DCGM_FI_DRIVER_VERSION", labels.get("DCGM_DRIVER_VERSION", ""))
    return Trace(device, times, cols, meta)
