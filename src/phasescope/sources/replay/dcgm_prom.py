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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from phasescope.errors import InputError
from phasescope.schema import KB_PER_S, MHZ, MIB, PERCENT, DeviceInfo, FloatArray, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    arrow_all,
    arrow_mask,
    base_meta,
    check_file,
    check_options,
    dictionary_codes,
    first_step_back,
    float_option,
    guarded,
    head_text,
    read_lines,
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
# The same, for Arrow's RE2 over the whole file (every group named: Arrow returns a struct of them).
_SAMPLE_PATTERN = (
    r"^(?P<name>DCGM_FI_[A-Za-z0-9_]+)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_HEAD_RE = re.compile(r"^(?P<name>DCGM_FI_[A-Za-z0-9_]+)(?:\{(?P<labels>.*)\})?$")
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
    lines = read_lines(p)
    # Whole-file columnar pass: Arrow classifies and splits every line; Python only parses each
    # distinct label set once (a few per device), never a line at a time.
    text = pc.utf8_trim_whitespace(lines)
    sample = arrow_mask(pc.starts_with(text, "DCGM_FI_"))
    quiet = arrow_mask(pc.starts_with(text, "#")) | arrow_mask(pc.equal(pc.utf8_length(text), 0))
    skipped = int(np.count_nonzero(~sample & ~quiet))  # another exporter's metric, or noise around it
    rows = np.flatnonzero(sample)
    if rows.size == 0:
        raise InputError(p, "content", "DCGM_FI_* samples of a known field", "none")
    s = _Samples.parse(p, text.filter(pa.array(sample)), rows)
    labelled = [d for d in range(len(s.keys)) if s.keys[d] is not None]
    devices = labelled if labelled else [s.keys.index(None)]
    unlabelled = int(np.count_nonzero(s.device == s.keys.index(None))) if None in s.keys else 0
    traces = []
    for n, d in enumerate(devices):
        t = _trace(p, s, d, n, interval)
        t.meta["skipped_lines"] = skipped
        if labelled and unlabelled:
            t.meta["unlabelled_samples_ignored"] = unlabelled
        traces.append(t)
    return traces


@dataclass
class _Samples:
    """Every DCGM sample line as columns: device, field name, value, time (explicit or by scrape)."""

    keys: list[tuple[str, str] | None]  # device keys in order of first appearance
    labels: list[dict[str, str]]  # per device key: labels of its first sample
    names: list[str]  # field names (codes index this)
    device: np.ndarray  # per sample: index into keys
    name: np.ndarray  # per sample: index into names
    value: FloatArray  # NaN for fields we do not map
    stamp: FloatArray  # sample timestamp in s, NaN when the line has none
    ordinal: np.ndarray  # n-th sample of its (device, field) series = its scrape number

    @classmethod
    def parse(cls, p: Path, lines: pa.Array, line_no: np.ndarray) -> _Samples:
        parts = _split_fast(lines)
        if parts is None:  # unusual layout or a bad line: the exact (slower) pass names the first problem
            parts = _split_regex(p, lines, line_no)
        # Device of each label set; devices ordered by their first sample.
        first_seen = np.full(len(parts.label_sets), len(lines))
        present, first = np.unique(parts.label_codes, return_index=True)
        first_seen[present] = first
        key_of = [_device_key(lab) for lab in parts.label_sets]
        keys: list[tuple[str, str] | None] = []
        labels: list[dict[str, str]] = []
        for i in np.argsort(first_seen, kind="stable").tolist():
            if first_seen[i] < len(lines) and key_of[i] not in keys:
                keys.append(key_of[i])
                labels.append(parts.label_sets[i])
        device = np.array([keys.index(k) if k in keys else -1 for k in key_of], dtype=np.int64)
        dev = device[parts.label_codes]
        series = dev * len(parts.names) + parts.name_codes
        return cls(
            keys, labels, parts.names, dev, parts.name_codes, parts.value, parts.stamp, _ordinal(series)
        )


@dataclass
class _Parts:
    """The fields of every sample line: name and label set (as codes into distinct values), value, time."""

    name_codes: np.ndarray
    names: list[str]
    label_codes: np.ndarray
    label_sets: list[dict[str, str]]
    value: FloatArray  # NaN for fields we do not map
    stamp: FloatArray  # seconds; NaN where the line has no timestamp


def _split_fast(lines: pa.Array) -> _Parts | None:
    """Split lines at their last whitespace runs (no regex over long label text); None if not plain.

    A line is `HEAD VALUE` or `HEAD VALUE TS` where HEAD is `NAME{labels}` or `NAME`. Only distinct
    heads (one per series) are checked against the sample pattern, in Python. Files that mix lines
    with and without timestamps, or anything irregular, go to `_split_regex`.
    """
    first = pc.ascii_split_whitespace(lines, max_splits=1, reverse=True)
    if not arrow_all(pc.equal(pc.list_value_length(first), 2)):
        return None
    rest, last = pc.list_element(first, 0), pc.list_element(first, 1)
    second = pc.ascii_split_whitespace(rest, max_splits=1, reverse=True)
    has_ts = arrow_mask(
        pc.and_(pc.invert(pc.ends_with(rest, "}")), pc.equal(pc.list_value_length(second), 2))
    )
    if has_ts.all():
        head, value, ts = pc.list_element(second, 0), pc.list_element(second, 1), last
        if not arrow_all(pc.match_substring_regex(ts, r"^-?\d+$")):
            return None
    elif not has_ts.any():
        head, value, ts = rest, last, None
    else:
        return None
    if pc.any(pc.match_substring(value, "}")).as_py():  # a '}' after the labels: let the regex decide
        return None
    head_codes, heads = dictionary_codes(head)
    names: list[str] = []
    label_text: list[str] = []
    for h in heads:
        m = _HEAD_RE.match(h)
        if m is None:
            return None
        names.append(m.group("name"))
        label_text.append(m.group("labels") or "")
    label_sets = [_labels(text) for text in label_text]
    if any(lab is None for lab in label_sets):
        return None
    name_codes, distinct_names = _recode(head_codes, names)
    label_codes, distinct_labels = _recode(head_codes, label_text)
    known = _known(name_codes, distinct_names)
    stamp = np.full(len(lines), np.nan) if ts is None else _floats(ts) / 1000.0
    try:
        values = _values(value, known)
    except ValueError:
        return None
    sets = [_labels(text) or {} for text in distinct_labels]
    return _Parts(name_codes, distinct_names, label_codes, sets, values, stamp)


def _split_regex(p: Path, lines: pa.Array, line_no: np.ndarray) -> _Parts:
    """Every line against the full sample pattern; raises the first problem in line order."""
    parts = pc.extract_regex(lines, _SAMPLE_PATTERN)
    errors: list[tuple[int, InputError]] = []
    sample_error = "a Prometheus sample 'DCGM_FI_NAME{label=\"v\",...} value'"
    miss = arrow_mask(pc.is_null(parts))
    if miss.any():
        k = int(np.flatnonzero(miss)[0])
        errors.append((k, InputError(p, f"line {line_no[k] + 1}", sample_error, lines[k].as_py()[:60])))
    label_codes, label_text = dictionary_codes(pc.struct_field(parts, "labels"))
    parsed = [_labels(text) for text in label_text]
    bad = np.flatnonzero(np.isin(label_codes, [i for i, lab in enumerate(parsed) if lab is None]) & ~miss)
    if bad.size:
        k = int(bad[0])
        errors.append((k, InputError(p, f"line {line_no[k] + 1}", sample_error, lines[k].as_py()[:60])))
    name_codes, names = dictionary_codes(pc.struct_field(parts, "name"))
    known = _known(name_codes, names) & ~miss
    raw = pc.struct_field(parts, "value")
    value = np.full(len(lines), np.nan)
    try:
        value = _values(raw, known)
    except ValueError:
        k = _first_bad_number(raw, known)
        got = raw[k].as_py()
        errors.append(
            (k, InputError(p, f"line {line_no[k] + 1}, field {names[name_codes[k]]}", "a number", got))
        )
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    ts = pc.struct_field(parts, "ts")
    stamp = _floats(pc.if_else(pc.equal(ts, ""), pa.scalar(None, ts.type), ts)) / 1000.0
    return _Parts(name_codes, names, label_codes, [lab or {} for lab in parsed], value, stamp)


def _known(name_codes: np.ndarray, names: list[str]) -> np.ndarray:
    """Which samples are of a field we map (only those values must be numbers)."""
    return np.isin(name_codes, [i for i, n in enumerate(names) if n in FIELDS or n in _FB_PARTS])


def _values(raw: pa.Array, known: np.ndarray) -> FloatArray:
    value = np.full(len(raw), np.nan)
    value[known] = _floats(raw.filter(pa.array(known)))
    return value


def _recode(codes: np.ndarray, per_code: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes into `per_code` values -> codes into the distinct values (first-seen order)."""
    distinct = list(dict.fromkeys(per_code))
    where = {v: i for i, v in enumerate(distinct)}
    return np.array([where[v] for v in per_code], dtype=np.int64)[codes], distinct


def _floats(col: pa.Array) -> FloatArray:
    try:
        out = col.cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return np.array([float(v) if v is not None else np.nan for v in col.to_pylist()], dtype=np.float64)
    return np.asarray(pc.fill_null(out, np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def _first_bad_number(raw: pa.Array, known: np.ndarray) -> int:
    for k in np.flatnonzero(known).tolist():  # error path only
        try:
            float(raw[k].as_py())
        except (ValueError, TypeError):
            return int(k)
    return 0


def _ordinal(series: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements share its series id (0, 1, 2, ... per series)."""
    order = np.argsort(series, kind="stable")
    ranked = series[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]]) if ranked.size else np.zeros(0, int)
    run_start = np.repeat(starts, np.diff(np.r_[starts, ranked.size]))
    out = np.empty(series.size, dtype=np.int64)
    out[order] = np.arange(series.size) - run_start
    return out


def _refuse_clock_step(p: Path, s: _Samples, d: int, when: FloatArray, name: np.ndarray) -> None:
    """InputError when a series' times go backwards in file order: a clock step. This reader joins every
    series of a device by time, so it cannot cut the trace there as the others do (replay.read): it
    refuses the file instead, naming the series and the step, rather than sort it into the earlier data."""
    step = first_step_back(name, when)
    if step is not None:
        i, j = step
        gpu = s.labels[d].get("gpu", str(d)) if s.keys[d] is not None else str(d)
        raise InputError(
            p, f"series {s.names[name[i]]} of gpu {gpu}",
            "timestamps that never go back (a clock step: split the file there and read each part)",
            f"t={when[j]:.3f} s after t={when[i]:.3f} s",
        )


def _trace(p: Path, s: _Samples, d: int, n: int, interval: float) -> Trace:
    sel = np.flatnonzero(s.device == d)
    stamp = s.stamp[sel]
    # Time of each sample: its own timestamp, else its scrape ordinal (n-th sample of that series).
    when = np.where(np.isnan(stamp), s.ordinal[sel] * interval, stamp)
    name = s.name[sel]
    _refuse_clock_step(p, s, d, when, name)
    times = np.unique(when)
    pos = np.searchsorted(times, when)
    value = s.value[sel]
    have = {s.names[c] for c in np.unique(name).tolist()}

    def column(field: str) -> FloatArray:
        col = np.full(times.size, np.nan)
        m = name == s.names.index(field)
        col[pos[m]] = value[m]  # a repeated (series, time): the later sample wins
        return col

    cols: dict[str, FloatArray] = {}
    for field, (sig, factor) in FIELDS.items():
        if field in have and sig not in cols:
            cols[sig] = column(field) * factor
    derived = False
    if "mem_total" not in cols and all(f in have for f in _FB_PARTS[:2]):
        reserved = column(_FB_PARTS[2]) if _FB_PARTS[2] in have else np.zeros(times.size)
        cols["mem_total"] = (column(_FB_PARTS[0]) + column(_FB_PARTS[1]) + reserved) * MIB
        derived = True
    key = s.keys[d]
    labels = s.labels[d] if key is not None else {}
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
    has_ts = bool(np.any(~np.isnan(stamp)))
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
    meta["unmapped_fields"] = sorted(f for f in have if f not in FIELDS and f not in _FB_PARTS)
    return Trace(device, times, cols, meta)
