"""Idle that is held, judged on recorded spans (classify/held.py): real idle spans from labels.csv, the
memory bar shared with the live view, and the processes a recording kept."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np

from phasescope.classify.held import DeviceProcesses, judge_spans, memory_held
from phasescope.schema import HELD_MEM_BYTES, DeviceInfo, Trace
from phasescope.sources.replay import read

GIB = 1024.0**3
LLAMA_CPP = "formats/nvidia-smi-csv-noheader/dst915__llama.cpp__gpu_stats.csv"


def _idle_rows(shared_data: Path, folder: str) -> list[tuple[Trace, float, float]]:
    """(the labelled GPU's trace, t_from, t_to) of every labels.csv idle row under `folder`."""
    with open(shared_data / "labels.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["label"] == "idle" and r["path"].startswith(folder + "/")]
    out = []
    cache: dict[str, list[Trace]] = {}
    for r in rows:
        if r["path"] not in cache:
            cache[r["path"]] = read(shared_data / r["path"])
        trace = next(t for t in cache[r["path"]] if t.device.index == int(r["gpu_index"]))
        whole = not r["t_from"]  # an empty span: the whole trace
        out.append((trace, trace.time[0] if whole else float(r["t_from"]),
                    trace.time[-1] if whole else float(r["t_to"])))
    return out


def _median_gib(trace: Trace, start: float, end: float) -> float:
    inside = (trace.time >= start) & (trace.time <= end)
    return float(np.nanmedian(trace["mem_used"][inside])) / GIB


def test_vllm_idle_spans_hold_the_loaded_model(shared_data: Path) -> None:
    """Before the first request and after the last, the vLLM server holds the loaded model: held."""
    rows = _idle_rows(shared_data, "powertrace-vllm")
    assert len(rows) == 8
    for trace, start, end in rows:
        assert memory_held(trace, [(start, end)]) is True
        assert 70 < _median_gib(trace, start, end) < 75  # Qwen3-8B / GPT-OSS-20B with vLLM's KV cache


def test_sensorguard_idle_bystanders_hold_little(shared_data: Path) -> None:
    """The bystander RTX 3090s beside a run hold only the driver's context (~0.45-0.7 GiB): not held."""
    rows = _idle_rows(shared_data, "sensorguard-rtx3090")
    assert len(rows) >= 20
    for trace, start, end in rows:
        assert memory_held(trace, [(start, end)]) is False
        assert 0.3 < _median_gib(trace, start, end) < 0.75


def test_llama_cpp_capture_holds_its_model(shared_data: Path) -> None:
    """llama.cpp's server on 4 RTX 4090s: 0% utilisation all along, 10-13 GiB of model loaded on each."""
    traces = read(shared_data / LLAMA_CPP)
    assert len(traces) == 4
    for t in traces:
        assert float(np.nanmax(t["gpu_util"])) == 0.0
        assert memory_held(t, [(t.time[0], t.time[-1])]) is True
        assert 10 < _median_gib(t, t.time[0], t.time[-1]) < 13.5


def test_no_memory_reading_cannot_be_told(shared_data: Path) -> None:
    """energy-inference logs carry no memory: their labelled idle spans are neither held nor free: unknown."""
    rows = _idle_rows(shared_data, "energy-inference")
    assert rows
    for trace, start, end in rows:
        assert not trace.has("mem_used")
        assert memory_held(trace, [(start, end)]) is None
        assert judge_spans(trace, [(start, end)]).held is None
    trace, start, end = _idle_rows(shared_data, "powertrace-vllm")[0]
    assert memory_held(trace.without("mem_used"), [(start, end)]) is None
    assert memory_held(trace, [(trace.time[-1] + 10, trace.time[-1] + 20)]) is None  # no sample in the span


def _trace(mem: list[float]) -> Trace:
    return Trace(DeviceInfo("GPU-x"), np.arange(len(mem), dtype=float), {"mem_used": mem})


def test_the_bar_is_the_median_over_the_spans_at_the_live_views_threshold() -> None:
    from phasescope.fleet import judge
    from phasescope.live import state as live_state

    assert live_state.HELD_MEM_BYTES == HELD_MEM_BYTES == judge.DEFAULT_HELD_MEM_BYTES == GIB
    t = _trace([0.5 * GIB, 0.5 * GIB, 8 * GIB, HELD_MEM_BYTES, HELD_MEM_BYTES, np.nan])
    assert memory_held(t, [(0, 2)]) is False  # one spike (a model loading) does not hold the span
    assert memory_held(t, [(3, 5)]) is True  # exactly at the bar: held
    assert memory_held(t, [(0, 0), (3, 4)]) is True  # the median over both spans: 0.5, 1, 1 GiB
    assert memory_held(t, [(0, 1), (3, 4)]) is False  # 0.5, 0.5, 1, 1 GiB: median 0.75
    assert memory_held(t, [(5, 5)]) is None  # only a NaN inside
    assert memory_held(t, [(3, 4)], threshold=2 * GIB) is False


def test_a_recorded_process_holds_the_device_and_is_named() -> None:
    t = _trace([0.4 * GIB] * 10)
    procs = DeviceProcesses(np.array([6.0, 7.0, 7.0]), np.array([41, 41, 42]), ["vllm", "vllm", "python"])
    held = judge_spans(t, [(5, 9)], procs)
    assert held.held is True and held.by == [{"pid": 41, "name": "vllm"}, {"pid": 42, "name": "python"}]
    free = judge_spans(t, [(0, 4)], procs)
    assert free.held is False and free.by == []  # recorded, and none was on it
    assert judge_spans(t, [(0, 4)]).by is None  # processes not recorded: not known
    bare = Trace(DeviceInfo("GPU-x"), t.time, {})
    assert judge_spans(bare, [(0, 4)], procs).held is False  # no memory, but processes recorded: none there
    assert judge_spans(bare, [(0, 4)]).held is None


def test_classify_does_not_import_the_live_code() -> None:
    code = (
        "import sys, phasescope.cli.classify, phasescope.fleet.judge;"
        "live = sorted(m for m in sys.modules if m.startswith('phasescope.live'));"
        "assert not live, live"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
