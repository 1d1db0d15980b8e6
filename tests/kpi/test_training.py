"""Training KPI arithmetic on hand-built event logs, the peak table, and the cached CPU peak."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phasescope.instrument import events as ev
from phasescope.instrument.timeline import build
from phasescope.kpi import training as tk
from tests.hook_events import as_version1

META = {"roots": [{"name": "M", "params": 10, "param_bytes": 40, "dtype": "float32", "device": "cpu",
                   "mode_sensitive_layers": [], "saved_bytes": 8}]}


def _row(kind: float, t: float, a: float = 0, b: float = 0, c: float = 0, d: float = 0,
         f: int = 0, e: float = 0) -> list[float]:
    return [kind, t, a, b, c, d, float(f), e]


def training_log(steps: int, load_s: float = 1.0, fwd_s: float = 1.0, bwd_s: float = 1.0,
                 opt_s: float = 0.5, batch: int = 8, seq: int = 0,
                 loads: list[float] | None = None) -> ev.ProcessEvents:
    """`steps` iterations of: data loading (`loads[k]`, else `load_s`), forward, backward, optimizer step
    (all times exact)."""
    rows = []
    t = 100.0
    flags = ev.GRAD_ENABLED | ev.MODULE_TRAINING | ev.HAS_GRAPH | (ev.TOKEN_INPUT if seq else 0)
    for k in range(steps):
        t += load_s if loads is None else loads[k]
        rows.append(_row(ev.FWD, t, 0, k, batch, seq, flags, t + fwd_s))
        t += fwd_s
        rows += [_row(ev.BWD_BEGIN, t, k), _row(ev.BWD_FWD, t, k), _row(ev.BWD_END, t + bwd_s)]
        t += bwd_s
        rows += [_row(ev.OPT_BEGIN, t, 0, k), _row(ev.OPT_END, t + opt_s, 0, k)]
        t += opt_s
    return ev.ProcessEvents(1, np.array(rows), 1000.0, dict(META))


def test_step_time_throughput_and_stall_are_exact() -> None:
    tl = build(training_log(3, batch=8, seq=16))
    k = tk.training_kpis(tl, with_peak=False)
    assert k is not None
    assert k["steps"] == 3
    assert k["step_time_p50_s"] == pytest.approx(3.5)  # step ends are 3.5 s apart
    # The first window starts at the first forward (2.5 s busy); each later one has 1 s of loading in 3.5 s.
    assert k["data_stall_fraction"] == pytest.approx(2 / 9.5)
    assert k["time_s"] == pytest.approx(9.5)
    assert k["samples_per_s"] == pytest.approx(24 / 9.5)
    assert k["tokens_per_s"] == pytest.approx(3 * 8 * 16 / 9.5)
    assert [s.phase for s in tl.segments] == ["training"]


@pytest.mark.parametrize("saved, expected", [(0, 0), (8, 8), (-1, None), (None, None)])
def test_activation_bytes_of_zero_is_a_measurement(saved: int | None, expected: int | None) -> None:
    """A forward that saves nothing for backward (y = x + b) measures 0 bytes: 0, not unknown."""
    log = training_log(2)
    log.meta["roots"] = [dict(META["roots"][0], saved_bytes=saved)]
    k = tk.training_kpis(build(log), with_peak=False)
    assert k is not None and k["activation_bytes_per_forward"] == expected


def test_mfu_uses_sampled_flops_and_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    pe = training_log(4, load_s=0.0)
    pe.meta = dict(META, flop_sample={"step": 1, "flops": 7e9, "autocast": None},
                   memory_sample={"param_bytes": 40, "grad_bytes": 40, "optimizer_state_bytes": 80})
    rows = pe.rows.tolist()
    t_end1 = next(r[1] for r in rows if r[0] == ev.OPT_END and r[3] == 1)
    rows.append(_row(ev.FLOP_SAMPLE_END, t_end1, 0, 1))
    pe.rows = np.array(rows)
    monkeypatch.setattr(tk, "cpu_peak_flops", lambda dtype, threads: 1e10)
    k = tk.training_kpis(build(pe))
    assert k is not None
    assert k["step_time_p50_s"] == pytest.approx(2.5)  # the sampled step is left out, the rest are 2.5 s
    assert k["mfu"] == pytest.approx(7e9 / 2.5 / 1e10)
    assert k["memory_multiple"] == pytest.approx(4.0)
    assert k["activation_bytes_per_forward"] == 8


def test_eval_between_steps_splits_the_timeline() -> None:
    pe = training_log(2)
    rows = pe.rows.tolist()
    t = max(r[1] for r in rows) + 0.5
    for i in range(3):  # evaluation forwards under no_grad
        rows.append(_row(ev.FWD, t, 0, 100 + i, 8, 0, 0, t + 0.1))
        t += 0.2
    pe.rows = np.array(rows)
    later = training_log(2)
    shift = t + 1 - later.rows[:, 1].min()
    extra = later.rows.copy()
    extra[:, 1] += shift
    extra[:, 7] = np.where(extra[:, 0] == ev.FWD, extra[:, 7] + shift, extra[:, 7])  # a forward's end
    extra[:, 3] = np.where(extra[:, 0] == ev.FWD, extra[:, 3] + 200, extra[:, 3])
    extra[:, 2] = np.where(extra[:, 0] == ev.BWD_FWD, extra[:, 2] + 200, extra[:, 2])
    extra[:, 2] = np.where(extra[:, 0] == ev.BWD_BEGIN, extra[:, 2] + 200, extra[:, 2])
    extra[:, 3] = np.where(np.isin(extra[:, 0], (ev.OPT_BEGIN, ev.OPT_END)), extra[:, 3] + 2, extra[:, 3])
    pe.rows = np.concatenate([pe.rows, extra])
    tl = build(pe)
    assert [(s.phase, s.steps, s.forwards) for s in tl.segments] == [
        ("training", 2, 2), ("inference", 0, 3), ("training", 2, 2)]
    k = tk.training_kpis(tl, with_peak=False)
    assert k is not None and k["steps"] == 4
    # Step time is measured only between steps of one stretch, never across the evaluation.
    assert k["step_time_p50_s"] == k["step_time_p95_s"] == k["step_time_mean_s"] == pytest.approx(3.5)


def test_step_time_percentiles_of_uneven_steps() -> None:
    # 21 steps: 20 step-to-step periods of 2.5 s, the last four with 1-4 s of extra data loading.
    k = tk.training_kpis(build(training_log(21, loads=[1.0] + [0.0] * 16 + [1.0, 2.0, 3.0, 4.0])),
                         with_peak=False)
    assert k is not None
    assert k["step_time_p50_s"] == pytest.approx(2.5)
    assert k["step_time_mean_s"] == pytest.approx(3.0)  # (16 x 2.5 + 3.5 + 4.5 + 5.5 + 6.5) / 20
    assert k["step_time_p95_s"] == pytest.approx(5.55)  # linear interpolation at rank 0.95 x 19 = 18.05


def test_flop_sampled_step_is_left_out_of_step_times() -> None:
    pe = training_log(4, loads=[0.0, 5.0, 0.0, 0.0])  # the sampled step (step 1) is slow
    pe.meta = dict(META, flop_sample={"step": 1, "flops": 7e9, "autocast": None})
    rows = pe.rows.tolist()
    t_end1 = next(r[1] for r in rows if r[0] == ev.OPT_END and r[3] == 1)
    rows.append(_row(ev.FLOP_SAMPLE_END, t_end1, 0, 1))
    pe.rows = np.array(rows)
    k = tk.training_kpis(build(pe), with_peak=False)
    assert k is not None
    assert k["step_time_mean_s"] == k["step_time_p95_s"] == pytest.approx(2.5)
    # Throughput is over the whole training time, the sampled step included.
    assert k["time_s"] == pytest.approx(15.0) and k["samples_per_s"] == pytest.approx(32 / 15.0)


def test_steps_are_the_main_optimizers() -> None:
    # A second optimizer (id 1) that steps every other iteration, inside the main one's step time.
    pe = training_log(4)
    rows = pe.rows.tolist()
    for step in (0, 2):
        t = next(r[1] for r in rows if r[0] == ev.OPT_BEGIN and r[2] == 0 and r[3] == step)
        rows += [_row(ev.OPT_BEGIN, t + 0.1, 1, step // 2), _row(ev.OPT_END, t + 0.2, 1, step // 2)]
    pe.rows = np.array(rows)
    tl = build(pe)
    assert tl.main_opt == 0 and tl.steps == 4
    k = tk.training_kpis(tl, with_peak=False)
    assert k is not None and k["steps"] == 4 and k["step_time_p50_s"] == pytest.approx(3.5)


def test_version1_log_builds_the_same_timeline(tmp_path: Path) -> None:
    pe = training_log(3, batch=8, seq=16)
    rows = pe.rows.tolist()
    t = max(r[1] for r in rows) + 0.5
    rows.append(_row(ev.FWD, t, 0, 50, 4, 0, ev.INFERENCE_MODE, t + 0.3))  # an evaluation forward
    pe.rows = np.array(rows)
    old = tmp_path / "v1"
    old.mkdir()
    with open(old / "events-1-000000.npz", "wb") as fh:
        np.savez(fh, rows=as_version1(pe.rows), anchor=np.array([1000.0, 0.0]))
    (old / "meta-1.json").write_text(json.dumps({"format": ev.FORMAT, "version": 1, "pid": 1,
                                                 "anchor": [1000.0, 0.0], **META}))
    (pe1,) = ev.load_events(old)
    assert pe1.rows.shape[1] == ev.ROW
    new, legacy = build(pe), build(pe1)
    assert legacy.f_idx.size == new.f_idx.size == 4
    for name in ("f_idx", "f_root", "f_t0", "f_t1", "f_batch", "f_seq", "f_flags", "f_trained", "w_t0",
                 "w_t1"):
        np.testing.assert_array_equal(getattr(legacy, name), getattr(new, name), err_msg=name)
    assert [(s.phase, s.steps, s.forwards) for s in legacy.segments] == [
        ("training", 3, 3), ("inference", 0, 1)]


def test_idle_gap_becomes_an_idle_segment() -> None:
    pe = training_log(2, load_s=30.0)
    tl = build(pe, idle_gap_s=10.0)
    assert [s.phase for s in tl.segments] == ["training", "idle", "training"]


@pytest.mark.parametrize(("name", "dtype", "tf32", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bfloat16", False, 989.5),
    ("NVIDIA H100 PCIe", "float16", False, 756.0),
    ("NVIDIA H200", "float32", True, 494.5),
    ("NVIDIA A100-SXM4-40GB", "float32", True, 156.0),
    ("NVIDIA A100-SXM4-40GB", "float32", False, 19.5),
    ("NVIDIA A10", "bfloat16", False, 125.0),
    ("NVIDIA L4", "bfloat16", False, 121.0),
    ("NVIDIA L40S", "bfloat16", False, 366.5),
    ("Tesla T4", "float16", False, 65.0),
    ("NVIDIA GeForce RTX 3090", "bfloat16", False, 71.0),
    ("NVIDIA GeForce RTX 4090", "float16", False, 165.2),
])
def test_gpu_peak_table(name: str, dtype: str, tf32: bool, tflops: float) -> None:
    assert tk.gpu_peak_flops(name, dtype, tf32=tf32) == pytest.approx(tflops * 1e12)


def test_unknown_gpu_or_dtype_has_no_peak() -> None:
    assert tk.gpu_peak_flops("Tesla T4", "bfloat16") is None  # Turing has no BF16 tensor cores
    assert tk.gpu_peak_flops("Some Future GPU", "float16") is None


def test_one_thread_cpu_peak_leaves_out_time_the_core_was_taken_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On shared cores the wall clock also counts other processes' turns: a peak timed on it came out low and
    CPU MFU read over 100% (`make demo` showed 108%). One thread is timed on its own CPU time."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ticks = iter(range(0, 10**6, 10))  # each wall-clock read 10 s after the last: the core was busy
    monkeypatch.setattr(tk, "_wall_clock", lambda: float(next(ticks)))
    peak = tk.cpu_peak_flops("float32", threads=1)
    assert peak is not None and peak > 1e9  # a 1024^3 matmul in 10 s would be 0.2 GFLOP/s


def test_cpu_peak_is_measured_once_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = tk.cpu_peak_flops("float32", threads=1)
    assert first is not None and first > 1e8  # any CPU does more than 0.1 GFLOP/s on a 1024^3 matmul
    cache = tmp_path / "phasescope" / "cpu-peak.json"
    stored = json.loads(cache.read_text())
    (key,) = stored
    assert "threads=1" in key and stored[key] == first
    stored[key] = 123.0  # a cached value is used as is, not measured again
    cache.write_text(json.dumps(stored))
    assert tk.cpu_peak_flops("float32", threads=1) == 123.0
