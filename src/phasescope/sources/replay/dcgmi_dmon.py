"""`dcgmi dmon` text: a `#Entity  POWER  GPUTL ...` header (DCGM's short field names), an `ID` line, then
one row per entity and sample: `GPU 0   62.0  35 ...`; the header comes back now and then.

DCGM prints no time: the k-th row of a GPU is at k * interval (option `interval=`, default 1 s, dcgmi's
default `-d 1000`). Rows of other entities (GPU-I, GPU-CI, NvSwitch, CPU ...) are counted and skipped;
'N/A' is NaN. A last row cut off by a killed logger is dropped with one line saying so; any other row
with the wrong number of fields is an error naming its line.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import SIGNALS, DeviceInfo, Trace
from phasescope.signal_names import UNITS
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    float_option,
    guarded,
    head_lines,
    log,
    read_text,
    synth_uuid,
)
from phasescope.sources.replay._smi_text import MISSING, warn_cut_tail

NAME = "dcgmi-dmon"
OPTIONS = ("interval",)

# DCGM short name -> (signal, unit). dcgmi prints no unit: it is fixed by the field id (in the comment).
FIELDS: dict[str, tuple[str, str]] = {
    "POWER": ("power", "w"),  # 155 POWER_USAGE
    "PMLMT": ("power_limit", "w"),  # 160 POWER_MGMT_LIMIT
    "TOTEC": ("energy", "mj"),  # 156 TOTAL_ENERGY_CONSUMPTION
    "TMPTR": ("temperature", "c"),  # 150 GPU_TEMP
    "GPUTL": ("gpu_util", "%"),  # 203 GPU_UTIL
    "MCUTL": ("mem_util", "%"),  # 204 MEM_COPY_UTIL
    "FBUSD": ("mem_used", "mib"),  # 252 FB_USED
    "FBTTL": ("mem_total", "mib"),  # 250 FB_TOTAL
    "SMCLK": ("sm_clock", "mhz"),  # 100 SM_CLOCK
    "MMCLK": ("mem_clock", "mhz"),  # 101 MEM_CLOCK
    "PCITX": ("pcie_tx", "b/s"),  # 1009 PROF_PCIE_TX_BYTES
    "PCIRX": ("pcie_rx", "b/s"),  # 1010 PROF_PCIE_RX_BYTES
    "NVLTX": ("nvlink_tx", "b/s"),  # 1011 PROF_NVLINK_TX_BYTES
    "NVLRX": ("nvlink_rx", "b/s"),  # 1012 PROF_NVLINK_RX_BYTES
    "SMACT": ("sm_active", "ratio"),  # 1002 PROF_SM_ACTIVE
    "TENSO": ("tensor_active", "ratio"),  # 1004 PROF_PIPE_TENSOR_ACTIVE
    "DRAMA": ("dram_active", "ratio"),  # 1005 PROF_DRAM_ACTIVE
}
# Each unit read through the one units table, checked once here against the signal's base unit.
_FACTORS: dict[str, float] = {}
for _tag, (_signal, _unit) in FIELDS.items():
    assert UNITS[_unit][0] == SIGNALS[_signal].unit, (_tag, _unit)
    _FACTORS[_tag] = UNITS[_unit][1]

_HEADER = re.compile(r"^#\s*Entity\s+(?P<fields>\S.*?)\s*$", re.IGNORECASE)
_ID_LINE = re.compile(r"^\s*I[Dd](\s|$)")
# 'GPU 0  62.0 ...', 'GPU-I 3 ...', 'NvSwitch 0 ...': an entity type, its id, the values.
_ROW = re.compile(r"^\s*(?P<kind>[A-Za-z][A-Za-z-]*)\s+(?P<id>\d+)(?P<rest>(\s+\S+)*)\s*$")


def sniff(path: PathLike) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    lines = [ln for ln in head_lines(p, 16384)[:200] if ln.strip()]
    return any(
        _HEADER.match(a) is not None and _ID_LINE.match(b) is not None
        for a, b in itertools.pairwise(lines)
    )


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    opts = check_options(p, options, OPTIONS, NAME)
    interval = float_option(p, opts, "interval", 1.0)
    text = read_text(p).lstrip("\ufeff")
    lines = text.splitlines()
    cut_open = bool(text) and not text.endswith(("\n", "\r"))  # no line break after the last line
    fields: list[str] = []
    rows: dict[int, list[list[float]]] = {}
    other = skipped = 0
    for no, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        head = _HEADER.match(stripped)
        if head is not None:
            names = head.group("fields").split()
            if fields and names != fields:
                expected = "the same fields as the first '#Entity' header"
                raise InputError(p, f"line {no}", expected, stripped[:60])
            fields = names
            continue
        if not fields or _ID_LINE.match(stripped):
            skipped += int(not fields)  # a prompt or a script's own line before the first header
            continue
        m = _ROW.match(stripped)
        tokens = m.group("rest").split() if m is not None else []
        if m is None or len(tokens) != len(fields):
            if no == len(lines) and cut_open and m is not None and len(tokens) < len(fields):
                warn_cut_tail(p, "dcgmi dmon row", no, sum(map(len, rows.values())))
                break
            got = f"{len(tokens)} values: {stripped[:60]!r}" if m is not None else stripped[:60]
            expected = f"an entity row 'GPU <id>' and {len(fields)} values ({' '.join(fields)})"
            raise InputError(p, f"line {no}", expected, got)
        if m.group("kind") != "GPU":
            other += 1
            continue
        rows.setdefault(int(m.group("id")), []).append(_numbers(p, no, fields, tokens))
    if not fields:
        raise InputError(p, "header", "a dcgmi dmon header '#Entity FIELD ...'", "none")
    if not rows:
        raise InputError(p, "data", "at least one 'GPU <id> ...' row under the '#Entity' header", "none")
    return _traces(p, fields, rows, interval, other, skipped)


def _numbers(p: Path, no: int, fields: list[str], tokens: list[str]) -> list[float]:
    out: list[float] = []
    for name, token in zip(fields, tokens, strict=True):
        if token in MISSING:
            out.append(float("nan"))
            continue
        try:
            out.append(float(token))
        except ValueError:
            raise InputError(p, f"line {no}, field {name!r}", "a number or N/A", token) from None
    return out


def _traces(
    p: Path, fields: list[str], rows: dict[int, list[list[float]]], interval: float, other: int, skipped: int
) -> list[Trace]:
    used = [(j, FIELDS[name][0], _FACTORS[name]) for j, name in enumerate(fields) if name in FIELDS]
    ignored = [name for name in fields if name not in FIELDS]
    recognised = [f"{fields[j]}->{sig}" for j, sig, _ in used]
    log.info(
        "phasescope: %s: dcgmi dmon fields read: %s; ignored (no phasescope signal): %s",
        p, ", ".join(recognised) or "none", ", ".join(ignored) or "none",
    )
    traces: list[Trace] = []
    for gpu, values in sorted(rows.items()):
        table = np.array(values, dtype=np.float64).reshape(len(values), len(fields))
        columns = {sig: table[:, j] * factor for j, sig, factor in used}
        meta = base_meta(
            p, NAME, run=p.stem, gpu_index=gpu, clock="sweep", interval_s=interval,
            ignored_fields=ignored, other_entity_rows=other, skipped_lines=skipped,
        )
        traces.append(Trace(DeviceInfo(uuid=synth_uuid(p, gpu), index=gpu), np.arange(len(values)) * interval,
                            columns, meta))
    return traces
