"""Where `verify` gets telemetry: recordings and logs, a ledger, the live store, or a live source."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.errors import InputError
from phasescope.schema import SIGNAL_NAMES, TickBatch, Trace
from phasescope.sources.base import LiveSource
from phasescope.timespec import parse_time as parse_time  # the shared grammar (cli/verify uses it here)


def is_ledger(path: str | Path) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        head = f.read(400)
    # Canonical JSON sorts keys, so a ledger's first line starts with its header's body.
    return head.startswith(b'{"body":{') and b'"format":"phasescope-ledger"' in head


def read_ledger_traces(path: str | Path) -> tuple[list[Trace], dict[str, Any]]:
    """Telemetry from an intact ledger (any break in it is an error here: audit it to see all problems)."""
    from phasescope.verify.audit import _traces, check_chain

    chain = check_chain(path)
    problems = list(chain.problems)
    traces = _traces(chain, problems) if not problems else {}
    if problems:
        raise InputError(
            path, problems[0].where, "an intact ledger (see phasescope audit)", problems[0].message
        )
    last = chain.records[-1]
    return list(traces.values()), {
        "ledger_id": chain.header.get("ledger_id"),
        "last_hash": last["hash"],
        "key_fingerprint": chain.header.get("key_fingerprint"),
    }


def read_inputs(paths: Sequence[str], fmt: str = "auto") -> tuple[list[Trace], list[dict[str, Any]]]:
    from phasescope.sources.replay import check_file, read

    traces: list[Trace] = []
    sources: list[dict[str, Any]] = []
    for p in paths:
        check_file(p, allow_dir=True)  # before any open: a FIFO would block the first read forever
        if is_ledger(p):
            from phasescope.verify import require_cryptography

            require_cryptography()
            ts, info = read_ledger_traces(p)
            sources.append({"path": str(p), "ledger": info})
        else:
            ts = read(p, fmt)
            sources.append({"path": str(p), "format": ts[0].meta.get("format") if ts else None})
        traces.extend(ts)
    return one_trace_per_device(traces), sources


def one_trace_per_device(traces: Sequence[Trace]) -> list[Trace]:
    """Traces of one device from several inputs (a recording per day) joined in time order, so a verdict
    covers the device's whole span and a bundle holds one timeline per device, as `audit` rebuilds it;
    a sample read twice (overlapping inputs) is kept once.

    A device named only by its file (`synth_uuid`: "file:<stem>#<index>", a log without GPU uuids) is one
    device in several files only if their spans follow one another (day0/gpu.csv, day1/gpu.csv): two such
    files that overlap in time are two devices, or logs without dates (h1/dmon.txt, h2/dmon.txt), and are
    refused. Joined, one's samples at the other's times were silently dropped."""
    by_device: dict[str, list[Trace]] = {}
    for t in traces:
        by_device.setdefault(t.device.uuid, []).append(t)
    out = []
    for uuid, parts in by_device.items():
        if uuid.startswith("file:"):  # sources/replay/_common.py synth_uuid
            _check_one_device(uuid, parts)
        out.append(parts[0] if len(parts) == 1 else _join(parts))
    return out


def _join(parts: Sequence[Trace]) -> Trace:
    joined = Trace.concat(list(parts))
    return joined.take(np.concatenate([[True], np.diff(joined.time) > 0]))


def _check_one_device(uuid: str, parts: Sequence[Trace]) -> None:
    """InputError when files that share a file-made device id overlap in time (see one_trace_per_device)."""
    by_file: dict[str, list[Trace]] = {}
    for t in parts:
        where = t.meta.get("source_path")  # one file given twice, by two spellings, is still one file
        by_file.setdefault(str(Path(where).resolve()) if where else "", []).append(t)
    spans = sorted((float(np.min(t.time)), float(np.max(t.time)), path)
                   for path, ts in by_file.items() if len(t := _join(ts)))
    for (_, end, before), (start, _, path) in itertools.pairwise(spans):
        if start <= end:
            raise InputError(
                path, f"device {uuid}",
                f"a span after {before}'s (the files name no GPU uuid, so one id from the file name means "
                "one device, whose logs cannot overlap; give other devices' logs other file names)",
                f"samples from t={start:.3f}, before its end t={end:.3f}",
            )


def read_store(path: str | Path | None, since: float | None, until: float | None) -> list[Trace]:
    from phasescope.sources.replay import check_file
    from phasescope.store.live import Store, default_store_path

    p = Path(path) if path else default_store_path()
    if not p.exists():
        raise InputError(
            p, "live store", "the store a running phasescope agent writes (or pass --store)", "no such file"
        )
    check_file(p)  # SQLite would block opening a FIFO forever
    with Store(p, read_only=True) as st:  # a running agent may be writing it: read, never write
        return st.query(start=since, end=until)


def sample_live(
    source: LiveSource,
    duration_s: float,
    interval_s: float = 1.0,
    on_tick: Callable[[TickBatch], None] | None = None,
    stop: threading.Event | None = None,
    sampler_kwargs: dict[str, Any] | None = None,
) -> list[Trace]:
    """Watch `source` for `duration_s` seconds; one Trace per device (and hand every tick to `on_tick`)."""
    from phasescope.sources.sampler import Sampler, until_played_out

    ticks: list[TickBatch] = []
    stop = stop or threading.Event()

    def keep(b: TickBatch) -> None:
        ticks.append(b)
        if on_tick is not None:
            on_tick(b)

    Sampler(source, interval_s, **(sampler_kwargs or {})).run(
        until_played_out(source, keep, stop), duration=duration_s, stop=stop
    )
    return ticks_to_traces(ticks)


def ticks_to_traces(ticks: Sequence[TickBatch]) -> list[Trace]:
    rows: dict[str, list[tuple[float, np.ndarray]]] = {}
    devs: dict[str, Any] = {}
    for b in ticks:
        for i, d in enumerate(b.devices):
            devs[d.uuid] = d
            rows.setdefault(d.uuid, []).append((b.time, b.values[i]))
    out = []
    for uid, rs in rows.items():
        vals = np.vstack([r[1] for r in rs])
        t = np.array([r[0] for r in rs], dtype=np.float64)
        keep = np.concatenate([[True], np.diff(t) > 0])  # a stalled clock repeats a time: keep the first
        cols = {s: vals[keep, j] for j, s in enumerate(SIGNAL_NAMES) if np.isfinite(vals[:, j]).any()}
        out.append(Trace(devs[uid], t[keep], cols, {"format": "live"}))
    return out
