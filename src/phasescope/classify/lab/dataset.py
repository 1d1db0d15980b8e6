"""Labelled examples for training and evaluation, from a labels table (the `labels.csv` layout).

A labels table has the columns of `../shared/data/labels.csv`:
`path, gpu_index, t_from, t_to, label, family, gpu, source, rate_hz, signals, run, notes`.
Only `path` and `label` are required; the others default sensibly (see `LabelRow`). A site labels its
own recordings with the same table (a "labels sidecar"), so `phasescope eval` and `train-model` work
on its own fleet:

- `path`: the file, relative to the table's folder (any format the readers know);
- `gpu_index`: a device index, `all` (every device in the file) or `per <key>` (every device, each its
  own run, e.g. `per container_ip`); empty means `all`;
- `t_from` / `t_to`: the labelled span in the file's own clock (seconds); empty means the whole trace;
- `run`: the recording the row comes from. Rows sharing a run never sit on both sides of a split.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import PHASES, Trace
from phasescope.sources.replay._common import decode_utf8

Reader = Callable[[str], list[Trace]]
LABEL_COLUMNS = (
    "path",
    "gpu_index",
    "t_from",
    "t_to",
    "label",
    "family",
    "gpu",
    "source",
    "rate_hz",
    "signals",
    "run",
    "notes",
)


@dataclass(frozen=True)
class LabelRow:
    path: Path  # absolute
    gpu_index: str  # "3", "all" or "per <key>"
    t_from: float | None
    t_to: float | None
    label: str
    family: str
    gpu: str
    source: str
    run: str
    line: int  # line in the labels file, for messages


@dataclass
class Example:
    """One labelled device trace, cut to its labelled span."""

    trace: Trace
    label: str
    family: str
    gpu: str
    source: str
    run: str
    path: str
    device: str
    dataset: str = ""  # the labels table it came from (for the leave-one-dataset-out split)

    @property
    def key(self) -> str:
        return f"{self.run}|{self.device}|{self.trace.time[0] if len(self.trace) else 0:.3f}"


def find_labels(data: str | Path) -> Path:
    """A labels table itself, or `labels.csv` inside a folder."""
    p = Path(data)
    if p.is_dir():
        p = p / "labels.csv"
    if not p.is_file():
        raise InputError(data, "labels", "a labels.csv file or a folder holding one", "nothing there")
    return p


def _float_or_none(text: str, path: Path, line: int, column: str) -> float | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(path, f"line {line}, column {column}", "a number of seconds or empty", text)
    return value


def read_labels(labels: str | Path) -> list[LabelRow]:
    """Parse a labels table; bad rows raise InputError naming the line and column."""
    path = find_labels(labels)
    root = path.parent
    rows: list[LabelRow] = []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, "file", "a readable labels table", exc.strerror or str(exc)) from None
    # A spreadsheet's "CSV UTF-8" starts with a BOM; other bytes must be UTF-8 (named by line if not).
    reader = csv.DictReader(io.StringIO(decode_utf8(path, data), newline=""))
    try:
        header = reader.fieldnames or []
        for col in ("path", "label"):
            if col not in header:
                raise InputError(
                    path, "header", f"a column named {col!r}", ",".join(header) or "an empty file"
                )
        for rec in reader:
            i = reader.line_num  # the file's line (blank lines and quoted line breaks included)
            label = (rec.get("label") or "").strip()
            if label not in PHASES:
                raise InputError(path, f"line {i}, column label", f"one of {', '.join(PHASES)}", label)
            rel = (rec.get("path") or "").strip()
            if not rel:
                raise InputError(path, f"line {i}, column path", "a file path", "an empty value")
            file = (root / rel).resolve()
            t_from = _float_or_none(rec.get("t_from", ""), path, i, "t_from")
            t_to = _float_or_none(rec.get("t_to", ""), path, i, "t_to")
            if t_from is not None and t_to is not None and t_to <= t_from:
                raise InputError(
                    path, f"line {i}, columns t_from/t_to", "t_to after t_from", f"{t_from}..{t_to}"
                )
            rows.append(
                LabelRow(
                    path=file,
                    gpu_index=(rec.get("gpu_index") or "all").strip() or "all",
                    t_from=t_from,
                    t_to=t_to,
                    label=label,
                    family=(rec.get("family") or "").strip() or label,
                    gpu=(rec.get("gpu") or "").strip(),
                    source=(rec.get("source") or "").strip() or "site",
                    run=(rec.get("run") or "").strip() or rel,
                    line=i,
                )
            )
    except csv.Error as exc:  # e.g. a field over the csv module's size limit
        raise InputError(path, f"line {reader.line_num}", "CSV rows", str(exc)) from None
    return rows


def _device_index(trace: Trace) -> int | None:
    idx = trace.meta.get("gpu_index", trace.device.index)
    try:
        return None if idx is None else int(idx)
    except (TypeError, ValueError):
        return None


def _default_reader() -> Reader:
    from phasescope.sources.replay import read  # the readers (engineer A)

    return read


def load_examples(
    labels: str | Path,
    reader: Reader | None = None,
    include: Callable[[LabelRow], bool] | None = None,
) -> list[Example]:
    """Read every labelled file once and cut out one Example per labelled device span."""
    rows = read_labels(labels)
    if include is not None:
        rows = [r for r in rows if include(r)]
    read = reader or _default_reader()
    cache: dict[Path, list[Trace]] = {}
    examples: list[Example] = []
    for row in rows:
        if row.path not in cache:
            if not row.path.exists():
                raise InputError(
                    find_labels(labels), f"line {row.line}, column path", "an existing file", str(row.path)
                )
            cache[row.path] = read(str(row.path))
        traces = cache[row.path]
        per_device = row.gpu_index.startswith("per ")
        if row.gpu_index == "all" or per_device:
            chosen = traces
        else:
            try:
                want = int(row.gpu_index)
            except ValueError:
                raise InputError(
                    find_labels(labels),
                    f"line {row.line}, column gpu_index",
                    "an index, 'all' or 'per <key>'",
                    row.gpu_index,
                ) from None
            chosen = [t for t in traces if _device_index(t) == want]
            if not chosen and len(traces) == 1 and want == 0:
                chosen = traces  # single-device files whose reader does not number the device
            if not chosen:
                raise InputError(
                    row.path,
                    f"device {want} (labels line {row.line})",
                    "a device with that index",
                    f"indices {sorted({_device_index(t) for t in traces}, key=str)}",
                )
        before = len(examples)
        for t in chosen:
            cut = t.slice_time(row.t_from, row.t_to)
            if len(cut) == 0:
                continue
            if row.gpu and not t.device.name and "gpu_model" not in cut.meta:
                cut.meta["gpu_model"] = row.gpu  # lets the features look up the device's limits
            device = t.device.uuid
            run = row.run
            if per_device:
                run = device if row.run == row.gpu_index[4:].strip() else f"{row.run}/{device}"
            # An empty `gpu` column falls back to the device's own name, so the leave-one-GPU-out split
            # works on a site's recordings without hand-filling the column.
            gpu = row.gpu or t.device.name or str(t.meta.get("gpu_model", "")) or "unknown"
            examples.append(
                Example(cut, row.label, row.family, gpu, row.source, run, str(row.path), device, str(labels))
            )
        if len(examples) == before:  # a span on another clock (Unix vs the file's own) must not vanish
            times = [t.time for t in chosen if len(t)]
            runs = (f"its clock runs {min(x.min() for x in times):.3f}..{max(x.max() for x in times):.3f}"
                    if times else "it holds no sample")
            raise InputError(
                find_labels(labels), f"line {row.line}, columns t_from/t_to",
                f"a span holding samples of {row.path.name} ({runs})", f"{row.t_from}..{row.t_to}",
            )
    return _merge_split_signals(examples)


def _merge_split_signals(examples: list[Example]) -> list[Example]:
    """Join examples of the same run and device whose signals come from different files (Alibaba keeps
    utilisation and memory in two files); drop exact duplicates (a reader that already joined them)."""
    groups: dict[tuple[str, str, str, float], list[Example]] = {}
    order: list[tuple[str, str, str, float]] = []
    for ex in examples:
        # The sample spacing is part of the key: one run recorded at two rates (our H200 battery) is two
        # examples, not a duplicate.
        k = (ex.run, ex.device, ex.label, _spacing(ex.trace.time))
        if k not in groups:
            groups[k] = []
            order.append(k)
        groups[k].append(ex)
    out: list[Example] = []
    for k in order:
        group = groups[k]
        paths = {e.path for e in group}
        if len(group) == 1 or len(paths) == 1:
            out.extend(group)
            continue
        sigsets = [frozenset(e.trace.columns) for e in group]
        if all(s == sigsets[0] for s in sigsets):
            out.append(group[0])
            continue
        out.append(_join(group))
    return out


def _spacing(time: np.ndarray) -> float:
    return round(float(np.median(np.diff(time))), 2) if len(time) > 1 else 0.0


def _join(group: Sequence[Example]) -> Example:
    time = np.unique(np.concatenate([e.trace.time for e in group]))
    cols: dict[str, np.ndarray] = {}
    for e in group:
        pos = np.searchsorted(time, e.trace.time)
        for name, values in e.trace.columns.items():
            col = cols.setdefault(name, np.full(time.size, np.nan))
            col[pos] = np.where(np.isfinite(values), values, col[pos])
    first = group[0]
    trace = Trace(first.trace.device, time, cols, first.trace.meta)
    return Example(
        trace,
        first.label,
        first.family,
        first.gpu,
        first.source,
        first.run,
        "+".join(sorted({e.path for e in group})),
        first.device,
        first.dataset,
    )


def summary(examples: Sequence[Example]) -> dict[str, dict[str, int]]:
    """Run and example counts by source and by label (for the model card)."""
    by_source: dict[str, set[str]] = {}
    by_label: dict[str, int] = {}
    for ex in examples:
        by_source.setdefault(ex.source, set()).add(ex.run)
        by_label[ex.label] = by_label.get(ex.label, 0) + 1
    return {
        "runs_by_source": {k: len(v) for k, v in sorted(by_source.items())},
        "examples_by_label": dict(sorted(by_label.items())),
    }
