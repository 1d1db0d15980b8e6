"""The plain `nvidia-smi` table, printed over and over into one file (`nvidia-smi -l 1 > log`,
`while true; do nvidia-smi; sleep 1; done`, `watch nvidia-smi` captured).

Each block is the boxed summary: an optional date line ('Mon Dec  7 10:00:00 2026'), the `| NVIDIA-SMI ...`
header, then two rows per GPU:

    |   0  NVIDIA A100-SXM4-40GB          On  |   00000000:07:00.0 Off |                    0 |
    | N/A   45C    P0             62W /  400W |    1234MiB /  40960MiB |     35%      Default |

(the old, narrower layout too). The date line is each block's time (read as UTC); without one, the k-th
block is at k * interval (option `interval=`, else the `watch` header's 'Every Ns', else 1 s). The MIG
devices and Processes boxes are skipped (MIG rows counted in meta). A last block cut off by a killed
logger is dropped with one line saying so; any other malformed row is an error naming its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay._common import (
    Options,
    PathLike,
    base_meta,
    check_file,
    check_options,
    float_option,
    guarded,
    head_lines,
    read_text,
    synth_uuid,
)
from phasescope.sources.replay._smi_text import CTIME_LINE, WATCH_LINE, parse_ctime, value_in, warn_cut_tail

NAME = "nvidia-smi-table"
OPTIONS = ("interval",)

_HEADER = re.compile(r"^\|\s*NVIDIA-SMI\s+\d")
_BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
# '|   0  NVIDIA A100-SXM4-40GB   On  |   00000000:07:00.0 Off |   0 |' (Windows: WDDM/TCC for Persistence-M).
_GPU_ROW = re.compile(
    rf"^\|\s*(?P<index>\d+)\s+(?P<name>.*?)\s+(?:On|Off|N/A|WDDM|TCC|MCDM)\s*\|\s*(?P<bus>{_BUS_ID})\s+\S+\s*\|.*\|\s*$"
)
# '| N/A   45C    P0   62W /  400W |   1234MiB /  40960MiB |   35%   Default |'
_STATE_ROW = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<power>\S+)\s*/\s*(?P<cap>\S+)\s*"
    r"\|\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*\|\s*(?P<util>\S+)\s+(?P<mode>.*?)\s*\|\s*$"
)
_BORDER = re.compile(r"^\+[-=+]+\+\s*$")
# A continuation row whose first two cells are blank ('|   |   |   Disabled |', the MIG M. line).
_BLANK_ROW = re.compile(r"^\|\s*\|\s*\|.*\|\s*$")
_MIG_ROW = re.compile(r"^\|\s*\d+\s+\d+\s+\d+\s+\d+\s*\|")

# The second row's cells -> (the column as headed, signal); units come with the values ('45C', '62W').
# Fan and Perf (the P-state) have no signal.
COLUMNS: dict[str, tuple[str, str]] = {
    "temp": ("Temp", "temperature"),
    "power": ("Pwr:Usage", "power"),
    "cap": ("Pwr:Cap", "power_limit"),
    "used": ("Memory-Usage", "mem_used"),
    "total": ("Memory-Usage total", "mem_total"),
    "util": ("GPU-Util", "gpu_util"),
}
_EXPECT_STATE = "the GPU's second row '| Fan Temp Perf Pwr:Usage/Cap | Memory-Usage | GPU-Util Compute M. |'"


def sniff(path: PathLike) -> bool:
    p = Path(path)
    return p.is_file() and any(_HEADER.match(line) for line in head_lines(p, 16384)[:200])


@dataclass
class _Gpu:
    index: int
    name: str
    bus: str
    line_no: int
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class _Block:
    line_no: int  # first line (the date line when there is one)
    time: float | None
    gpus: list[_Gpu] = field(default_factory=list)
    stage: str = "head"  # head -> gpus -> tail
    waiting: _Gpu | None = None  # a GPU whose second row has not come yet
    closed: bool = False  # a border after the last GPU row


@guarded(NAME)
def read(path: PathLike, options: Options | None = None) -> list[Trace]:
    p = check_file(path)
    opts = check_options(p, options, OPTIONS, NAME)
    text = read_text(p).lstrip("\ufeff")
    lines = text.splitlines()
    if text and not text.endswith(("\n", "\r")) and lines and not _BORDER.match(lines[-1]):
        lines.pop()  # the last line was cut mid-write; the block it belonged to is judged below
    blocks, watch_every, mig_rows, skipped = _blocks(p, lines)
    if not blocks:
        raise InputError(p, "data", "at least one nvidia-smi table ('| NVIDIA-SMI ...' and GPU rows)", "none")
    last = blocks[-1]
    if _cut(last, blocks[-2] if len(blocks) > 1 else None):
        if len(blocks) == 1:  # nothing to keep: the error alone says it
            raise InputError(p, f"line {last.line_no}", "one complete nvidia-smi table", "a cut-off one")
        blocks.pop()
        warn_cut_tail(p, "nvidia-smi table", last.line_no, len(blocks))
    times = _times(p, blocks)
    return _traces(p, blocks, times, opts, watch_every, mig_rows, skipped)


def _blocks(p: Path, lines: list[str]) -> tuple[list[_Block], float | None, int, int]:
    blocks: list[_Block] = []
    date: tuple[int, float] | None = None  # the latest date line not yet given to a block
    watch_every: float | None = None
    mig_rows = skipped = 0
    in_mig = False
    for no, line in enumerate(lines, start=1):
        block = blocks[-1] if blocks else None
        if block is not None and block.stage == "gpus":
            if _gpu_table_line(p, block, no, line):
                continue
            block.stage = "tail"  # the table ended; the line is read as a tail line below
        boxed = line.startswith(("|", "+"))  # cheap tests first: most lines are rows of a box
        if boxed and "NVIDIA-SMI" in line and _HEADER.match(line):
            if block is not None and block.stage != "tail":
                expected = "the GPU rows of the table started before it"
                raise InputError(p, f"line {no}", expected, line.strip()[:60])
            start, time = date if date is not None else (no, None)
            blocks.append(_Block(start, time))
            date, in_mig = None, False
            continue
        m = None if boxed else CTIME_LINE.match(line)
        if m is not None:
            date = (no, parse_ctime(p, no, m.group(1)))
            continue
        m = None if boxed else WATCH_LINE.match(line)
        if m is not None:  # nvidia-smi's own date line, just below, wins when both are there
            watch_every = float(m.group(1))
            if m.group(2):
                date = (no, parse_ctime(p, no, m.group(2)))
            continue
        if block is None:
            # a prompt or a script's own line before the first table (its top border is not one)
            skipped += int(bool(line.strip()) and not line.startswith("+"))
            continue
        if block.stage == "head":
            if line.startswith("|="):
                block.stage = "gpus"
            continue
        # tail: the MIG devices and Processes boxes, blank lines
        if "MIG devices" in line:
            in_mig = True
        elif "Processes" in line:
            in_mig = False
        elif in_mig and _MIG_ROW.match(line):
            mig_rows += 1
    return blocks, watch_every, mig_rows, skipped


def _gpu_table_line(p: Path, block: _Block, no: int, line: str) -> bool:
    """Take one line of the GPU table; False when the table has ended (a line outside the box)."""
    if block.waiting is not None:
        m = _STATE_ROW.match(line)
        if m is None:
            raise InputError(p, f"line {no}", _EXPECT_STATE, line.strip()[:60])
        block.waiting.values = _values(p, no, m)
        block.waiting = None
        return True
    if line.startswith("+") and _BORDER.match(line):
        block.closed = True
        return True
    m = _GPU_ROW.match(line)
    if m is not None:
        gpu = _Gpu(int(m.group("index")), m.group("name").strip(), m.group("bus"), no)
        block.gpus.append(gpu)
        block.waiting, block.closed = gpu, False
        return True
    if _BLANK_ROW.match(line):
        return True
    if line.startswith("|"):
        raise InputError(
            p, f"line {no}", "a GPU row '| GPU Name Persistence-M | Bus-Id Disp.A | ... |'", line.strip()[:60]
        )
    if not block.closed:
        raise InputError(p, f"line {no}", "a '+---+' border closing the GPU table", line.strip()[:60])
    return False


def _values(p: Path, no: int, m: re.Match[str]) -> dict[str, float]:
    return {
        signal: value_in(p, no, column, m.group(group), signal) for group, (column, signal) in COLUMNS.items()
    }


def _cut(last: _Block, before: _Block | None) -> bool:
    """Whether the file's last block was cut off: its GPU table never closed, a GPU lacks its second row,
    or it ends (closed) with fewer GPUs than the block before it had."""
    if last.stage == "head" or last.waiting is not None or not last.gpus:
        return True
    if last.stage == "gpus" and not last.closed:
        return True
    return before is not None and len(last.gpus) < len(before.gpus)


def _times(p: Path, blocks: list[_Block]) -> np.ndarray | None:
    dated = [b.time is not None for b in blocks]
    if not any(dated):
        return None
    if not all(dated):
        missing = blocks[dated.index(False)]
        raise InputError(
            p, f"line {missing.line_no}", "a date line before every table (the others have one)", "none"
        )
    return np.array([b.time for b in blocks], dtype=np.float64)


def _traces(
    p: Path,
    blocks: list[_Block],
    times: np.ndarray | None,
    opts: dict[str, str],
    watch_every: float | None,
    mig_rows: int,
    skipped: int,
) -> list[Trace]:
    interval = float_option(p, opts, "interval", watch_every or 1.0)
    t = times if times is not None else np.arange(len(blocks)) * interval
    rows: dict[int, list[tuple[float, _Gpu]]] = {}
    for k, block in enumerate(blocks):
        for gpu in block.gpus:
            rows.setdefault(gpu.index, []).append((float(t[k]), gpu))
    traces: list[Trace] = []
    for index in sorted(rows):
        samples = rows[index]
        first = samples[0][1]
        names = {s: np.array([g.values[s] for _, g in samples]) for s in first.values}
        meta = base_meta(
            p,
            NAME,
            run=p.stem,
            gpu_index=index,
            clock="unix" if times is not None else "sweep",
            blocks=len(blocks),
            mig_rows_ignored=mig_rows,
            skipped_lines=skipped,
        )
        if times is None:
            meta["interval_s"] = interval
        device = DeviceInfo(
            uuid=synth_uuid(p, index), name=first.name, index=index, extra={"pci_bus_id": first.bus}
        )
        traces.append(Trace(device, np.array([s[0] for s in samples]), names, meta))
    return traces
