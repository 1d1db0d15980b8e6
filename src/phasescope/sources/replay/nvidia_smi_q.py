"""`nvidia-smi -q` dumps, one after another in one file (`nvidia-smi -q -l 1`, `-q -d POWER,UTILIZATION`,
a loop of `nvidia-smi -q >> log`).

Each dump opens with '==============NVSMI LOG==============', then `Timestamp : Mon Dec  7 10:00:00 2026`
(the dump's time, read as UTC), `Attached GPUs : N` and one indented section per GPU:

    GPU 00000000:07:00.0
        Product Name                          : NVIDIA A100-SXM4-40GB
        GPU UUID                              : GPU-...
        Utilization
            Gpu                               : 35 %

The fields read are in FIELDS (section, key); every other line is ignored. GPUs are numbered in the order
the dump lists them (nvidia-smi's index order). A last dump cut off by a killed logger is dropped with one
line saying so; a value without its expected unit is an error naming its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from phasescope.errors import InputError
from phasescope.schema import DeviceInfo, FloatArray, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    arrow_mask,
    base_meta,
    check_file,
    check_options,
    dictionary_codes,
    float_option,
    guarded,
    head_lines,
    read_lines,
    synth_uuid,
)
from phasescope.sources.replay._smi_text import parse_ctime, parse_value, value_in, warn_cut_tail

NAME = "nvidia-smi-q"
OPTIONS = ("interval",)

# signal -> the (section, key) places nvidia-smi has printed it in, first found wins. Units come with the
# values ('35 %', '62.00 W', '1000 KB/s'). Power moved from 'Power Readings' to 'GPU Power Readings', and
# 'Power Draw' split into average and instantaneous, in newer drivers.
_POWER_SECTIONS = ("GPU Power Readings", "Power Readings")
FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "gpu_util": (("Utilization", "Gpu"), ("Utilization", "GPU"), ("Utilization", "GPU Utilization")),
    "mem_util": (("Utilization", "Memory"), ("Utilization", "Memory Utilization")),
    "mem_used": (("FB Memory Usage", "Used"),),
    "mem_total": (("FB Memory Usage", "Total"),),
    "temperature": (("Temperature", "GPU Current Temp"),),
    "power": tuple(
        (s, k) for k in ("Power Draw", "Instantaneous Power Draw", "Average Power Draw")
        for s in _POWER_SECTIONS
    ),
    "power_limit": tuple(
        (s, k) for k in ("Current Power Limit", "Enforced Power Limit", "Power Limit")
        for s in _POWER_SECTIONS
    ),
    "sm_clock": (("Clocks", "SM"),),
    "mem_clock": (("Clocks", "Memory"),),
    "pcie_tx": (("PCI", "Tx Throughput"),),
    "pcie_rx": (("PCI", "Rx Throughput"),),
}
_WANTED = {place for places in FIELDS.values() for place in places}
_TOP = ("Product Name", "GPU UUID")  # the depth-1 keys read: they name the device

_BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+\s*$")
_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_INDENT = 4  # spaces per level


def sniff(path: PathLike) -> bool:
    p = Path(path)
    return p.is_file() and any(_BANNER.match(line) for line in head_lines(p, 16384)[:200])


@dataclass
class _Gpu:
    bus: str
    line_no: int
    top: dict[str, str] = field(default_factory=dict)  # depth-1 keys: Product Name, GPU UUID


@dataclass
class _Dump:
    line_no: int
    time: float | None = None
    attached: int | None = None
    gpus: list[_Gpu] = field(default_factory=list)


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    opts = check_options(p, options, OPTIONS, NAME)
    lines = read_lines(p, strip_bom=True)
    if len(lines) and not _ends_with_line_break(p):
        lines = lines.slice(0, len(lines) - 1)  # the last line was cut mid-write; its dump is judged below
    table = _Lines.of(lines)
    dumps, skipped = _dumps(p, table)
    if not dumps:
        raise InputError(p, "data", "at least one nvidia-smi -q dump ('==== NVSMI LOG ====')", "none")
    for dump in dumps[:-1]:
        if not dump.gpus or (dump.attached is not None and len(dump.gpus) != dump.attached):
            raise InputError(
                p, f"line {dump.line_no}", f"{dump.attached or 'at least 1'} GPU section(s) in the dump",
                len(dump.gpus),
            )
    last = dumps[-1]
    sections = [g for d in dumps for g in d.gpus]
    if _cut(last, table, sections[-2] if len(sections) > 1 else None):
        if len(dumps) == 1:  # nothing to keep: the error alone says it
            raise InputError(p, f"line {last.line_no}", "one complete nvidia-smi -q dump", "a cut-off one")
        dumps.pop()
        warn_cut_tail(p, "nvidia-smi -q dump", last.line_no, len(dumps))
    gpu_at = np.array([g.line_no - 1 for d in dumps for g in d.gpus], dtype=np.int64)
    return _traces(p, dumps, _signals(p, table, gpu_at), opts, skipped)


def _ends_with_line_break(p: Path) -> bool:
    with p.open("rb") as fh:
        fh.seek(-1, 2)
        return fh.read(1) in (b"\n", b"\r")


@dataclass
class _Lines:
    """Every line split into depth (4 spaces a level), name and value, as whole columns: a dump is ~150
    lines per GPU and a dozen are read, so the lines are picked with Arrow kernels, not a Python loop."""

    depth: np.ndarray
    blank: np.ndarray
    body: pa.Array  # the line without its indent and trailing space
    name: pa.Array  # before the first ':' (a section line: all of it)
    parts: pa.Array  # the line split at its first ':' (value: the second part)
    colon: np.ndarray
    section: pa.Array  # the name of the depth-1 line a line sits under
    owner: np.ndarray  # the position of the 'GPU <bus id>' line a line sits under, -1 outside any
    is_gpu: np.ndarray
    is_banner: np.ndarray

    @staticmethod
    def of(lines: pa.Array) -> _Lines:
        left = pc.utf8_ltrim(lines, " ")
        lengths = np.asarray(pc.utf8_length(lines).to_numpy(zero_copy_only=False), dtype=np.int64)
        depth = (lengths - np.asarray(pc.utf8_length(left).to_numpy(zero_copy_only=False))) // _INDENT
        body = pc.utf8_rtrim_whitespace(left)
        blank = ~arrow_mask(pc.greater(pc.utf8_length(body), 0))
        # split, not a regex with groups: Arrow's extract_regex took 8 of the 10 s on an hour of 8 GPUs
        parts = pc.split_pattern(body, ":", max_splits=1)
        name = pc.utf8_rtrim_whitespace(pc.list_element(parts, 0))
        top = depth == 0
        is_gpu = top & arrow_mask(pc.match_substring_regex(body, _GPU.pattern))
        is_banner = top & arrow_mask(pc.match_substring_regex(body, _BANNER.pattern))
        at = np.arange(len(lines))
        gpu_at = np.maximum.accumulate(np.where(is_gpu, at, -1)) if len(lines) else at
        banner_at = np.maximum.accumulate(np.where(is_banner, at, -1)) if len(lines) else at
        owner = np.where(gpu_at > banner_at, gpu_at, -1)
        sec_at = np.maximum.accumulate(np.where((depth == 1) & ~blank, at, -1)) if len(lines) else at
        section = name.take(pa.array(np.maximum(sec_at, 0)))
        section = pc.if_else(pa.array(sec_at > gpu_at), section, pa.scalar("", section.type))
        colon = np.asarray(pc.list_value_length(parts).to_numpy(zero_copy_only=False)) == 2
        return _Lines(depth, blank, body, name, parts, colon, section, owner, is_gpu, is_banner)

    def values(self, rows: np.ndarray) -> pa.Array:
        """The text after the first ':' of the lines at `rows` (each must have one)."""
        return pc.utf8_trim_whitespace(pc.list_element(self.parts.take(pa.array(rows)), 1))

    def names_under(self, gpu_at: int) -> set[str]:
        """The depth-1 names (sections and keys) of the GPU section whose line is at `gpu_at`."""
        rows = np.flatnonzero((self.owner == gpu_at) & (self.depth == 1) & ~self.blank)
        return set(self.name.take(pa.array(rows)).to_pylist())


def _dumps(p: Path, t: _Lines) -> tuple[list[_Dump], int]:
    """The dumps and their GPU sections, from the few lines that say where they are (depth 0) and name the
    devices; the values are taken as whole columns by `_signals`."""
    kind = t.name.type  # string or large_string, as read_lines gave
    pick = ~t.blank & (
        (t.depth == 0)
        | ((t.depth == 1) & t.colon & arrow_mask(pc.is_in(t.name, value_set=pa.array(sorted(_TOP), kind))))
    )
    rows = np.flatnonzero(pick)
    take = pa.array(rows)
    dumps: list[_Dump] = []
    skipped = 0
    columns = (t.depth[rows].tolist(), t.body.take(take).to_pylist(), t.is_gpu[rows].tolist(),
               t.is_banner[rows].tolist())
    for i, depth, body, is_gpu, is_banner in zip(rows.tolist(), *columns, strict=True):
        no = i + 1
        name, colon, value = body.partition(":")
        name, value = name.rstrip(), value.strip()
        if is_banner:
            dumps.append(_Dump(no))
        elif not dumps:
            skipped += 1  # a prompt or a script's own line before the first dump
        elif is_gpu:
            dumps[-1].gpus.append(_Gpu(_GPU.match(body).group(1), no))  # type: ignore[union-attr]
        elif depth == 0:
            if colon:
                _dump_key(p, dumps[-1], no, name, value)
            else:
                skipped += 1  # a `date` or a prompt between dumps
        elif not dumps[-1].gpus:
            continue  # Unit sections and the like, before the first GPU
        else:
            dumps[-1].gpus[-1].top[name] = value
    return dumps, skipped


def _signals(p: Path, t: _Lines, gpu_at: np.ndarray) -> dict[str, tuple[FloatArray, np.ndarray]]:
    """signal -> (its value in each GPU section, in base units; whether the section has it), for the GPU
    sections whose lines are at `gpu_at` (sorted). Each distinct value text is parsed once."""
    kind = t.name.type
    places = sorted(_WANTED)
    joined = pc.binary_join_element_wise(t.section, t.name, pa.scalar("\x1f", kind))
    code = pc.index_in(joined, value_set=pa.array([f"{s}\x1f{k}" for s, k in places], kind))
    code_np = np.asarray(pc.fill_null(code, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    code_np[~((t.depth == 2) & t.colon & (t.owner >= 0))] = -1
    out: dict[str, tuple[FloatArray, np.ndarray]] = {}
    for signal, where in FIELDS.items():
        values = np.full(gpu_at.size, np.nan)
        have = np.zeros(gpu_at.size, dtype=bool)
        for place in reversed(where):  # the first place listed wins: written last
            rows = np.flatnonzero(code_np == places.index(place))
            slot = np.searchsorted(gpu_at, t.owner[rows])
            mine = slot < gpu_at.size
            mine[mine] = gpu_at[slot[mine]] == t.owner[rows[mine]]  # not a section of a dropped dump
            rows, slot = rows[mine], slot[mine]
            if not rows.size:
                continue
            codes, texts = dictionary_codes(t.values(rows))
            parsed = [parse_value(text, signal) for text in texts]
            bad = [k for k, v in enumerate(parsed) if v is None]
            if bad:
                first = int(np.flatnonzero(np.isin(codes, bad))[0])
                value_in(p, int(rows[first]) + 1, f"{place[0]} / {place[1]}", texts[codes[first]], signal)
            values[slot] = np.array(parsed, dtype=np.float64)[codes]
            have[slot] = True
        out[signal] = (values, have)
    return out


def _dump_key(p: Path, dump: _Dump, no: int, key: str, value: str) -> None:
    if key == "Timestamp":
        dump.time = parse_ctime(p, no, value)
    elif key == "Attached GPUs":
        if not value.isdigit():
            raise InputError(p, f"line {no}, field 'Attached GPUs'", "a whole number", value)
        dump.attached = int(value)


def _cut(last: _Dump, t: _Lines, before: _Gpu | None) -> bool:
    """Whether the last dump was cut off: fewer GPU sections than it announced, none at all, or a last GPU
    section lacking names (sections, keys) the GPU section before it had."""
    if not last.gpus or (last.attached is not None and len(last.gpus) < last.attached):
        return True
    if before is None:
        return False
    return not t.names_under(before.line_no - 1) <= t.names_under(last.gpus[-1].line_no - 1)


def _traces(
    p: Path,
    dumps: list[_Dump],
    signals: dict[str, tuple[FloatArray, np.ndarray]],
    opts: dict[str, str],
    skipped: int,
) -> list[Trace]:
    dated = [d.time is not None for d in dumps]
    if any(dated) and not all(dated):
        missing = dumps[dated.index(False)]
        raise InputError(p, f"line {missing.line_no}", "a Timestamp line in every dump (the others have one)")
    interval = float_option(p, opts, "interval", 1.0)
    times = [d.time if d.time is not None else k * interval for k, d in enumerate(dumps)]
    # One device per PCI bus id (a GPU that drops out must not shift the others); its index is its place
    # in the first dump that lists it.
    by_bus: dict[str, list[tuple[float, int, _Gpu]]] = {}  # (time, position among all GPU sections, section)
    index_of: dict[str, int] = {}
    at = 0
    for t, dump in zip(times, dumps, strict=True):
        for index, gpu in enumerate(dump.gpus):
            index_of.setdefault(gpu.bus, index)
            by_bus.setdefault(gpu.bus, []).append((t, at, gpu))
            at += 1
    traces: list[Trace] = []
    for bus, samples in sorted(by_bus.items(), key=lambda item: index_of[item[0]]):
        index = index_of[bus]
        mine = np.array([k for _, k, _ in samples], dtype=np.int64)
        columns = {s: values[mine] for s, (values, have) in signals.items() if have[mine].any()}
        first = samples[0][2]
        uuid = first.top.get("GPU UUID", "").strip() or synth_uuid(p, index)
        device = DeviceInfo(
            uuid=uuid, name=first.top.get("Product Name", ""), index=index, extra={"pci_bus_id": bus}
        )
        meta = base_meta(
            p, NAME, run=p.stem, gpu_index=index, clock="unix" if all(dated) else "sweep",
            dumps=len(dumps), skipped_lines=skipped,
        )
        if not all(dated):
            meta["interval_s"] = interval
        traces.append(Trace(device, np.array([t for t, _, _ in samples]), columns, meta))
    return traces
