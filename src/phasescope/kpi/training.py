"""Training KPIs from the hook timeline: steps, step time, throughput, FLOPs, MFU, stalls, memory multiple."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from phasescope.instrument import events as ev
from phasescope.instrument.timeline import F64, Timeline

# Dense (no structured sparsity) peak tensor/vector throughput, TFLOP/s, from the vendors' datasheets and
# architecture whitepapers; where a datasheet quotes only the sparse figure (marked * there) we halve it.
# - H100 SXM / PCIe / NVL, H200: NVIDIA H100 and H200 Tensor Core GPU datasheets.
# - A100: NVIDIA A100 Tensor Core GPU datasheet (same figures for 40 GB / 80 GB, SXM4 / PCIe).
# - L4, L40S, A10, T4, V100: the respective NVIDIA product datasheets.
# - RTX 3090: NVIDIA Ampere GA102 GPU architecture whitepaper, appendix (FP16/BF16 with FP32 accumulate).
# - RTX 4090: NVIDIA Ada Lovelace GPU architecture whitepaper, appendix table (FP32 accumulate).
# Keys: fp32 (CUDA cores), tf32, bf16, fp16, fp8. Order matters: the first pattern that matches wins.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"h200", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}),
    (r"h100.*pcie", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}),
    (r"h100.*nvl", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}),
    (r"h100", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}),
    (r"a100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"l40s", {"fp32": 91.6, "tf32": 183.0, "bf16": 366.5, "fp16": 366.5, "fp8": 733.0}),
    (r"\bl4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}),
    (r"\ba10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"\bt4\b", {"fp32": 8.1, "fp16": 65.0}),
    (r"v100.*pcie", {"fp32": 14.0, "fp16": 112.0}),
    (r"v100", {"fp32": 15.7, "fp16": 125.0}),
    (r"rtx 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3}),
    (r"rtx 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0}),
)

_DTYPE_KEY = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
              "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def gpu_peak_flops(device_name: str, dtype: str, tf32: bool = False) -> float | None:
    """Peak FLOP/s of a GPU model for a compute dtype, or None when the model or dtype is not in the table."""
    name = device_name.lower()
    key = _DTYPE_KEY.get(dtype.replace("torch.", ""), "")
    if key == "fp32" and tf32:
        key = "tf32"
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, name):
            value = peaks.get(key) or (peaks.get("fp32") if key == "tf32" else None)
            return value * 1e12 if value else None
    return None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phasescope"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Clocks the CPU peak is timed with (module names, so a test can stand in for a busy machine). With one torch
# thread the matmul runs in the calling thread, so its CPU time leaves out the time other processes had the
# core: a peak timed on the wall clock while the cores were shared came out low, and CPU MFU read over 100%.
_wall_clock = time.perf_counter
_thread_clock = time.thread_time
_PEAK_METHOD = "v2"  # in the cache key: peaks cached by the wall-clock-only method are measured again


def cpu_peak_flops(dtype: str = "float32", threads: int | None = None) -> float | None:
    """Best matmul FLOP/s this CPU reaches with `threads` torch threads; measured once, cached on disk.

    One thread is timed on its CPU time (a shared machine does not lower it); more threads on the wall clock
    (their workers' time is not the calling thread's). A cache hit does not import torch (the `phasescope
    run` parent need not load it at all).
    """
    if dtype not in ("float32", "bfloat16", "float16"):
        return None
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = _cache_dir() / "cpu-peak.json"
    cache: dict[str, float] = {}
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    key = f"{_cpu_model()}|threads={threads or os.cpu_count()}|{dtype}|torch={torch_version}|{_PEAK_METHOD}"
    if threads and key in cache:
        return float(cache[key])
    import torch

    threads = int(threads or torch.get_num_threads())
    key = f"{_cpu_model()}|threads={threads}|{dtype}|torch={torch_version}|{_PEAK_METHOD}"
    if key in cache:
        return float(cache[key])
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 1024
        a, b = torch.randn(n, n).to(tdtype), torch.randn(n, n).to(tdtype)
        clock = _thread_clock if threads == 1 else _wall_clock
        best = float("inf")
        torch.mm(a, b)
        for _ in range(10):
            t = clock()
            torch.mm(a, b)
            best = min(best, clock() - t)
    finally:
        torch.set_num_threads(old)
    peak = 2.0 * n**3 / best
    cache[key] = peak
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass
    return peak


def _pct(values: F64, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def _merged(t0: F64, t1: F64) -> tuple[F64, F64, F64]:
    """Union of intervals as sorted disjoint [m0, m1] and the cumulative covered length before each."""
    if not t0.size:
        z = np.empty(0)
        return z, z, z
    order = np.argsort(t0)
    s, e = t0[order], np.maximum.accumulate(t1[order])
    new = np.concatenate(([True], s[1:] > e[:-1]))
    grp = np.cumsum(new) - 1
    m0 = s[new]
    m1 = np.zeros(m0.size)
    np.maximum.at(m1, grp, e)
    cum = np.concatenate(([0.0], np.cumsum(m1 - m0)[:-1]))
    return m0, m1, cum


def _covered_upto(x: F64, m0: F64, m1: F64, cum: F64) -> F64:
    if not m0.size:
        return np.zeros_like(x)
    k = np.searchsorted(m0, x, side="right") - 1
    out = np.zeros_like(x)
    ok = k >= 0
    kk = k[ok]
    out[ok] = cum[kk] + np.clip(x[ok] - m0[kk], 0.0, m1[kk] - m0[kk])
    return out


def _compute_dtype(tl: Timeline) -> str:
    flop = tl.meta.get("flop_sample") or {}
    if flop.get("autocast"):
        return str(flop["autocast"])
    roots = tl.meta.get("roots") or []
    trained_roots = np.unique(tl.f_root[tl.f_trained])
    for r in trained_roots:
        if 0 <= r < len(roots) and roots[r].get("dtype"):
            return str(roots[r]["dtype"])
    return "float32"


def peak_for(tl: Timeline, dtype: str) -> tuple[float | None, str]:
    device = tl.device
    if device.startswith(("GPU-", "MIG-")):
        name = str(tl.meta.get("device_name", ""))
        tf32 = bool(tl.meta.get("tf32", False))
        peak = gpu_peak_flops(name, dtype, tf32=tf32)
        return peak, (f"vendor peak for {name} {dtype}" if peak else f"no peak known for {name} {dtype}")
    peak = cpu_peak_flops(dtype, tl.meta.get("torch_threads"))
    return peak, f"measured CPU matmul peak ({dtype}, {tl.meta.get('torch_threads')} threads)"


def _step_starts(tl: Timeline, idle_gap_s: float) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Where each step of the main optimizer starts: at the previous step's end when the two are chained
    (one training stretch: no inference between, a gap under `idle_gap_s`), else at its own window's start;
    and, per step after the first, whether it is chained."""
    w0, w1 = tl.w_t0, tl.w_t1
    inf_t0 = np.sort(tl.f_t0[tl.inference_mask])
    a = w0.copy()
    if w1.size < 2:
        return a, np.zeros(0, dtype=bool)
    prev = w1[:-1]
    n_inf_between = np.searchsorted(inf_t0, w0[1:]) - np.searchsorted(inf_t0, prev)
    chained = (n_inf_between == 0) & (w0[1:] - prev <= idle_gap_s)
    a[1:] = np.where(chained, prev, w0[1:])
    return a, chained


SERIES_POINTS = 2000  # per series in a run summary: enough for a chart, bounded for a week-long run


def _thin(n: int) -> npt.NDArray[np.int64]:
    return np.unique(np.linspace(0, n - 1, SERIES_POINTS).round().astype(np.int64)) if n > SERIES_POINTS \
        else np.arange(n)


def step_series(tl: Timeline, idle_gap_s: float = 10.0) -> dict[str, list[float | None]]:
    """Per step of the main optimizer, over time (Unix seconds at the step's end): its time and samples/s;
    and the loss of each backward pass. At most SERIES_POINTS each (evenly thinned); None where a step has
    no figure (no batch seen), never 0; empty lists where there are no steps or losses."""
    a, _ = _step_starts(tl, idle_gap_s)
    w1 = tl.w_t1
    dur = w1 - a
    samples: F64 = np.zeros(w1.size)
    counted = tl.f_trained & tl.f_in_window
    if w1.size and counted.any():
        k = np.searchsorted(tl.w_t0, tl.f_t0[counted], side="right") - 1
        ok = k >= 0
        per_step = np.bincount(k[ok], weights=tl.f_batch[counted][ok], minlength=w1.size)
        samples = per_step[: w1.size].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where((dur > 0) & (samples > 0), samples / dur, np.nan)
    s = _thin(w1.size)
    ls = _thin(tl.l_t.size)

    def floats(x: F64) -> list[float | None]:
        return [float(v) if np.isfinite(v) else None for v in x]

    return {
        "step_t": floats(w1[s] + tl.wall_offset), "step_time_s": floats(dur[s]),
        "samples_per_s": floats(rate[s]),
        "loss_t": floats(tl.l_t[ls] + tl.wall_offset), "loss": floats(tl.l_v[ls]),
    }


def training_kpis(tl: Timeline, idle_gap_s: float = 10.0, with_peak: bool = True) -> dict[str, Any] | None:
    """KPIs of the training part of one process, or None if it did not train."""
    trained = tl.f_trained
    if not trained.any() and not tl.steps:
        return None
    train_time = sum(s.end - s.start for s in tl.segments if s.phase == "training")
    w0, w1 = tl.w_t0, tl.w_t1
    a, chained = _step_starts(tl, idle_gap_s)
    keep = ~tl.w_flop_sampled
    period = (w1 - a)[1:][chained & keep[1:]]
    step_times = period if period.size else (w1 - w0)[keep]
    # Busy = union of forwards, loss / metric module calls, backward passes and optimizer steps; the rest of
    # each window is stall.
    m0, m1, cum = _merged(np.concatenate((tl.f_t0[tl.f_in_window | trained], tl.x_t0, tl.b_t0, tl.o_t0)),
                          np.concatenate((tl.f_t1[tl.f_in_window | trained], tl.x_t1, tl.b_t1, tl.o_t1)))
    busy = _covered_upto(w1, m0, m1, cum) - _covered_upto(a, m0, m1, cum)
    win = w1 - a
    total = float(np.sum(win[keep]))
    stall = float(np.sum((win - busy)[keep])) / total if total > 0 else None

    samples = float(tl.f_batch[trained].sum())
    tok = trained & tl.flag(ev.TOKEN_INPUT)
    tokens = float((tl.f_batch[tok] * tl.f_seq[tok]).sum())
    out: dict[str, Any] = {
        "steps": tl.steps,
        "backward_passes": int(tl.b_t0.size),
        "trained_forwards": int(trained.sum()),
        "optimizers": tl.meta.get("optimizers", []),
        "time_s": train_time,
        "step_time_p50_s": _pct(step_times, 50),
        "step_time_p95_s": _pct(step_times, 95),
        "step_time_mean_s": float(step_times.mean()) if step_times.size else None,
        "samples": samples,
        "samples_per_s": samples / train_time if train_time > 0 else None,
        "tokens": tokens if tok.any() else None,
        "tokens_per_s": tokens / train_time if tok.any() and train_time > 0 else None,
        "data_stall_fraction": stall,
    }
    flop = tl.meta.get("flop_sample") or {}
    flops = flop.get("flops")
    out["flops_per_step"] = flops
    out["flops_sampled_step"] = flop.get("step")
    out["mfu"] = None
    dtype = _compute_dtype(tl)
    out["compute_dtype"] = dtype
    if flops and out["step_time_p50_s"] and with_peak:
        peak, source = peak_for(tl, dtype)
        out["peak_flops"] = peak
        out["peak_source"] = source
        out["achieved_flops"] = flops / out["step_time_p50_s"]
        out["mfu"] = out["achieved_flops"] / peak if peak else None
    out.update(_memory(tl))
    return out


def _memory(tl: Timeline) -> dict[str, Any]:
    roots = tl.meta.get("roots") or []
    trained_roots = {int(r) for r in np.unique(tl.f_root[tl.f_trained]) if 0 <= r < len(roots)}
    model_bytes = sum(int(roots[r]["param_bytes"]) for r in trained_roots)
    # saved_bytes: None / -1 = not measured; 0 is a measurement (a forward that saves no activations)
    saved = [roots[r].get("saved_bytes") for r in trained_roots]
    act = [b for b in saved if b is not None and b >= 0]
    mem = tl.meta.get("memory_sample") or {}
    out: dict[str, Any] = {"model_bytes": model_bytes or None,
                           "activation_bytes_per_forward": int(sum(act)) if act else None}
    if mem:
        total = mem["param_bytes"] + mem["grad_bytes"] + mem["optimizer_state_bytes"]
        base = model_bytes or mem["param_bytes"]
        out.update(param_bytes=mem["param_bytes"], grad_bytes=mem["grad_bytes"],
                   optimizer_state_bytes=mem["optimizer_state_bytes"],
                   training_state_bytes=total,
                   memory_multiple=total / base if base else None)
    return out
