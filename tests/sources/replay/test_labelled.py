"""Every telemetry file labels.csv names is read as it is, by the auto-detecting reader (no `--format`): the
right format, the labelled GPU, the labelled span on the file's clock, and the signals the row says it has."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from phasescope.schema import PAPER_SIGNALS
from phasescope.sources.replay import detect, read
from tests.conftest import shared_data_dir

# Top folder of a labelled path (formats/: its sub-folder) -> the format its files are in. A new folder in
# labels.csv fails here until it is given one, rather than passing on whatever the sniffers guess.
FORMAT_OF = {
    "sensorguard-rtx3090": "sensorguard",
    "sensorguard-markers": "sensorguard",
    "spar-a100": "spar",
    "nvidia-smi-h100-training": "nvidia-smi-csv",
    "alibaba-gentd26": "alibaba-gentd26",
    "energy-inference": "nvidia-smi-csv",
    "powertrace-vllm": "nvidia-smi-csv",
    "formats/nvidia-smi-csv": "nvidia-smi-csv",
    "formats/nvidia-smi-csv-noheader": "nvidia-smi-csv",
}
# labels.csv `signals` words -> schema signals ("all9": the paper's nine; "partial": not listed).
SIGNAL_OF = {
    "power": "power",
    "util_gpu": "gpu_util",
    "util_mem": "mem_util",
    "mem_used": "mem_used",
    "temp": "temperature",
    "clock_sm": "sm_clock",
    "clock_mem": "mem_clock",
}
SPAN_SLACK_S = 2.0  # a labelled span may start or end up to a sample or two past the file's rows


def _labelled() -> dict[str, list[dict[str, str]]]:
    """path -> its labels.csv rows; empty when the shared data is not beside the checkout."""
    labels = shared_data_dir() / "labels.csv"
    if not labels.is_file():
        return {}
    out: dict[str, list[dict[str, str]]] = {}
    with open(labels, newline="") as fh:
        for row in csv.DictReader(fh):
            out.setdefault(row["path"], []).append(row)
    return out


LABELLED = _labelled()
PATHS: list[Any] = sorted(LABELLED) or [
    pytest.param("", marks=pytest.mark.skip(reason=f"no shared data at {shared_data_dir()}"))
]


def _format_of(rel: str) -> str:
    parts = Path(rel).parts
    key = "/".join(parts[:2]) if parts[0] == "formats" else parts[0]
    assert key in FORMAT_OF, f"labels.csv names a new folder {key!r}: add the format its files are in"
    return FORMAT_OF[key]


def _signals(words: str) -> list[str]:
    out: list[str] = []
    for word in words.split(","):
        if word.startswith("all9"):
            out += PAPER_SIGNALS
        elif word in SIGNAL_OF:
            out.append(SIGNAL_OF[word])
        else:
            assert word == "partial", f"unknown signals word {word!r} in labels.csv"
    return out


@pytest.mark.parametrize("rel", PATHS)
def test_labelled_file_reads_without_a_format(rel: str) -> None:
    path = shared_data_dir() / rel
    fmt = _format_of(rel)
    assert detect(path) == fmt
    traces = read(path)  # format "auto"
    assert traces and all(t.meta["format"] == fmt and len(t) > 0 for t in traces)
    for row in LABELLED[rel]:
        where = f"{rel} gpu {row['gpu_index']}"
        if row["gpu_index"].isdigit():
            mine = [t for t in traces if t.device.index == int(row["gpu_index"])]
            assert len(mine) == 1, (where, [t.device.index for t in traces])
        else:  # "all" or "per container_ip": every device of the file
            mine = traces
        for t in mine:
            if row["t_from"]:
                start, end = float(row["t_from"]), float(row["t_to"])
                assert t.time[0] - SPAN_SLACK_S <= start < end <= t.time[-1] + SPAN_SLACK_S, where
                assert ((t.time >= start) & (t.time <= end)).sum() >= 2, where
        wanted = _signals(row["signals"])
        assert all(any(t.has(s) for t in mine) for s in wanted), (where, wanted, mine[0].present_signals())
