"""Recording battery (v2): real workloads on one lent GPU, each recorded by phasescope's NVML source at 1 Hz
and 10 Hz, plus NVML's own sample buffers.

    python benchmarks/device/battery.py --out $OUT          # on a GPU: a rotating subset, ~480 s in all
    python benchmarks/device/battery.py --dry-run --out DIR  # same code on the CPU, tiny sizes, fake NVML

Rotation: each run records a different subset of the workloads below, each for >= 90 s (--active-s), so that
successive lent devices add up. The order is least represented first (seconds of labelled windows per
workload in data/*/labels.csv, --data), ties broken by a rotation key (--rotation, default: the UTC minute);
the subset is one workload of each label class (idle, training, inference, other) in that order, then more
while the estimate fits --budget-s (default 480 s, inside one 600 s device command with start-up; --only
runs the given workloads instead). The chosen subset is printed and recorded in battery.json ("rotation").

One worker process (PyTorch, with phasescope's hooks installed) runs the workloads one after another, told
what to run over a pipe; this process samples the GPU with two `NvmlSource`s at once (1 Hz and 10 Hz) and
writes one recording per workload and rate. Each recording holds ~1.5 s of idle before the workload and
the rest of the gap after it. Labels: the hook segments of the worker (training / inference) clipped to the
workload's window; workloads the hooks cannot see (GEMM, FFT, stencil, memory-bound, idle) take their
declared label; train_eval_mixed keeps both its training and its evaluation (inference) segments; the gaps
are idle. Both rates of one workload share one `run`, so grouped splits never split them. The 1 Hz recorder
also polls nvmlDeviceGetSamples every tick (the driver's buffered GPU-utilisation and total-power samples at
their own timestamps, each recorded once) into <workload>.samples.parquet; NotSupported is noted, not fatal.

Output: DEV is named from the GPU model (h100, h200, ...; `dryrun` for the fake NVML; --device-dir sets it):
    WORK/DEV/{1hz,10hz}/<workload>.parquet (+ .manifest.json, .processes.parquet), DEV/samples/
    <workload>.samples.parquet (time_s: Unix s, kind: gpu_util | power, value: ratio | W), labels.csv,
    battery.json, battery.log, and first nvml_check.json/.txt (nvml_check.py's report; --skip-nvml-check).
Everything is packed into DIR/battery.tar.gz after every workload, so a timeout keeps what was done. WORK is
DIR in a dry run; on a GPU it is a temporary folder (--work) and DIR receives only battery.tar.gz,
battery.json, battery.log and nvml_check.{json,txt}: the device tool brings back at most 8 files.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import faulthandler
import hashlib
import heapq
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "src") not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, str(REPO / "src"))

# name, declared label, what it is
WORKLOADS: tuple[tuple[str, str, str], ...] = (
    ("idle_released", "idle", "worker holds only its CUDA context"),
    ("idle_held", "idle", "a loaded GPT (bf16) resident in GPU memory plus a preallocated KV-cache-like "
                          "block, no traffic"),
    ("train_mlp", "training", "4-layer MLP, AdamW, bf16 autocast"),
    ("train_cnn", "training", "small CNN with BatchNorm, SGD momentum"),
    ("train_gpt_adamw", "training", "GPT-style transformer, AdamW"),
    ("train_gpt_sgd", "training", "GPT-style transformer, SGD"),
    ("train_gpt_ckpt", "training", "GPT-style transformer, AdamW, gradient checkpointing"),
    ("train_gpt_lora", "training", "GPT-style transformer, only LoRA adapters trainable"),
    ("train_small_batch", "training", "GPT-style transformer, batch 1, short sequences"),
    ("train_lora_finetune", "training",
     "LoRA fine-tuning: rank-16 adapters on every linear of a larger frozen bf16 GPT (1.5x wider, "
     "4/3 deeper), 2x longer sequences"),
    ("train_eval_mixed", "training",
     "GPT training (AdamW) with an evaluation pass under inference_mode after every ~9 s of steps "
     "(6 s of it)"),
    ("infer_batched", "inference", "GPT forward passes at a large batch, inference_mode"),
    ("infer_poisson_low", "inference", "Poisson arrivals, 4 requests/s, prefill + 16 decoded tokens"),
    ("infer_poisson_high", "inference", "Poisson arrivals, 40 requests/s, prefill + 16 decoded tokens"),
    ("infer_generate_kv", "inference", "autoregressive generation with a growing KV cache"),
    ("infer_serve_poisson", "inference",
     "LLM decode server: continuous batching of prefills and decode steps over a preallocated KV cache, "
     "Poisson arrivals, 12 requests/s"),
    ("infer_serve_bursty", "inference", "the same server under bursty arrivals: a two-state Markov-modulated "
                                        "Poisson process, 40 requests/s on, 1 request/s off"),
    ("other_gemm", "other", "bf16 matrix products in a loop"),
    ("other_fft", "other", "torch.fft.fftn on complex tensors in a loop"),
    ("other_memcpy", "other", "device-to-device and pinned host<->device copies"),
    ("other_bursty", "other", "bursts of matrix products with random gaps"),
    ("other_stencil", "other", "HPC stencil: 3-D 7-point Jacobi sweeps with a convergence check every 20"),
    ("other_membound", "other", "memory-bound: STREAM copy/scale/add/triad over large vectors, reductions"),
)
NAMES = [w[0] for w in WORKLOADS]
LABEL_OF = {w[0]: w[1] for w in WORKLOADS}
ABOUT = {w[0]: w[2] for w in WORKLOADS}
LABEL_CLASSES = ("idle", "training", "inference", "other")
# Idle workloads whose worker holds a model and memory (the manifest says held: true).
HELD = frozenset({"idle_held"})
# Workloads whose hook segments of more than their declared label are ground truth too.
HOOK_LABELS: dict[str, frozenset[str]] = {"train_eval_mixed": frozenset({"training", "inference"})}
RATES_HZ = (1.0, 10.0)
PRE_IDLE_S = 1.5
IDLE_SHARE = 0.65
MIN_WINDOW_S = 90.0  # the floor: idle workloads are not shortened below it
DEFAULT_ACTIVE_S = 90.0
DEFAULT_BUDGET_S = 480.0  # one 600 s device command: start-up, nvml_check, four 90 s workloads, packing
# Planning estimates (seconds), from the H200 run: recorder start and stop, labels and packing per workload;
# the worker's torch and CUDA start plus the GPU-name probe; nvml_check.py.
PER_WORKLOAD_OVERHEAD_S = 4.0
STARTUP_EST_S = 20.0
NVML_CHECK_EST_S = 45.0
DRY_RUN_GPU = "NVIDIA DryRun (fake NVML)"


# =============================================================================================
# Worker: runs in its own process with torch and phasescope's hooks.
# =============================================================================================


@dataclass
class Sizes:
    d_model: int
    layers: int
    heads: int
    vocab: int
    seq: int
    batch: int
    mlp_width: int
    mlp_batch: int
    img: int
    cnn_batch: int
    gemm: int
    fft_shape: tuple[int, ...]
    copy_bytes: int
    held_bytes: int
    gen_tokens: int
    infer_batch: int
    serve_slots: int  # sequences the decode server batches (its KV cache rows)
    serve_out: int  # most tokens a served request asks for
    stencil: int  # side of the Jacobi cube
    stream_elems: int  # float32 elements per STREAM vector


FULL = Sizes(d_model=1024, layers=12, heads=16, vocab=32000, seq=512, batch=16, mlp_width=8192,
             mlp_batch=4096,
             img=128, cnn_batch=256, gemm=8192, fft_shape=(32, 1024, 1024), copy_bytes=2 << 30,
             held_bytes=40 << 30, gen_tokens=1536, infer_batch=64, serve_slots=64, serve_out=256, stencil=512,
             stream_elems=1 << 28)
TINY = Sizes(d_model=64, layers=2, heads=4, vocab=256, seq=32, batch=4, mlp_width=128, mlp_batch=32, img=16,
             cnn_batch=8, gemm=128, fft_shape=(2, 64, 64), copy_bytes=1 << 20, held_bytes=8 << 20,
             gen_tokens=48, infer_batch=4, serve_slots=4, serve_out=16, stencil=24, stream_elems=1 << 16)


def _worker_main(args: argparse.Namespace) -> int:
    import torch

    import phasescope.instrument as instrument

    dev = torch.device(args.device)
    sizes = TINY if args.tiny else FULL
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(1)
    instrument.install(events_dir=args.events, flush_s=1.0)
    # Warm up the libraries once so the first workload's window does not hold their start-up.
    a = torch.randn(256, 256, device=dev)
    (a @ a).sum().item()
    _send({"event": "ready", "t": time.time(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "device": _device_name(torch, dev)})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        name, seconds = msg["name"], float(msg["seconds"])
        t0 = time.time()
        try:
            info = RUNNERS[name](torch, dev, sizes, seconds)
            error = None
        except Exception as exc:  # a failed workload must not end the battery
            info, error = {}, f"{type(exc).__name__}: {exc}"
        _sync(torch, dev)
        t1 = time.time()
        _release(torch, dev)
        recorder = instrument.current()
        if recorder is not None:  # the orchestrator reads this workload's events right after "done"
            recorder.flush()
        _send({"event": "done", "name": name, "t0": t0, "t1": t1, "info": info, "error": error})
    instrument.uninstall()
    return 0


def _send(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _device_name(torch: Any, dev: Any) -> str:
    return str(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else platform.processor() or "cpu"


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _release(torch: Any, dev: Any) -> None:
    import gc

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _until(seconds: float) -> Iterator[int]:
    """Yields iteration numbers until `seconds` have passed (checked before each iteration)."""
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        yield i
        i += 1


def _autocast(torch: Any, dev: Any) -> Any:
    return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)


def _gpt_classes(torch: Any) -> tuple[type, type]:
    nn: Any = torch.nn
    F = torch.nn.functional

    class LoRALinear(nn.Module):
        """A frozen Linear plus a trainable low-rank update (B starts at zero: training starts at base)."""

        def __init__(self, base: Any, rank: int = 8) -> None:
            super().__init__()
            self.base = base
            self.a = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device) * 0.01)
            self.b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))

        def forward(self, x: Any) -> Any:
            return self.base(x) + (x @ self.a.t()) @ self.b.t()

    class Block(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x: Any, cache: dict[str, Any] | None = None) -> Any:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
            if cache is not None:
                if "k" in cache:  # decoding: the new positions attend to every cached one
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
            y = F.scaled_dot_product_attention(q, k, v, is_causal=k.shape[2] == t and t > 1)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, s: Sizes, checkpointing: bool = False) -> None:
            super().__init__()
            self.tok = nn.Embedding(s.vocab, s.d_model)
            self.pos = nn.Embedding(s.seq + s.gen_tokens + 64, s.d_model)
            self.blocks = nn.ModuleList(Block(s.d_model, s.heads) for _ in range(s.layers))
            self.ln = nn.LayerNorm(s.d_model)
            self.head = nn.Linear(s.d_model, s.vocab, bias=False)
            self.checkpointing = checkpointing

        def forward(self, idx: Any, caches: list[dict[str, Any]] | None = None, pos0: int = 0) -> Any:
            pos = torch.arange(pos0, pos0 + idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for i, blk in enumerate(self.blocks):
                if self.checkpointing and self.training:
                    x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x, None if caches is None else caches[i])
            return self.head(self.ln(x))

    return GPT, LoRALinear


def _train_loop(torch: Any, dev: Any, model: Any, opt: Any, batch: Callable[[], tuple[Any, Any]],
                loss_fn: Callable[[Any, Any], Any], seconds: float) -> dict[str, Any]:
    model.train()
    steps = 0
    for _ in _until(seconds):
        x, y = batch()
        with _autocast(torch, dev):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if steps % 4 == 0:
            loss.item()  # keeps the host within a few steps of the GPU, so the window ends on time
    return {"steps": steps, "loss": float(loss.item()) if steps else None}


def _lm_batch(torch: Any, dev: Any, s: Sizes, batch: int, seq: int) -> Callable[[], tuple[Any, Any]]:
    def make() -> tuple[Any, Any]:
        x = torch.randint(0, s.vocab, (batch, seq + 1), device=dev)
        return x[:, :-1], x[:, 1:]

    return make


def _lm_loss(torch: Any) -> Callable[[Any, Any], Any]:
    return lambda logits, y: torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def run_train_mlp(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    nn = torch.nn
    w = s.mlp_width
    model = nn.Sequential(nn.Linear(w // 2, w), nn.GELU(), nn.Linear(w, w), nn.GELU(), nn.Linear(w, w),
                          nn.GELU(), nn.Linear(w, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    target = torch.randn(w // 2, 10, device=dev)

    def batch() -> tuple[Any, Any]:
        x = torch.randn(s.mlp_batch, w // 2, device=dev)
        return x, (x @ target).argmax(1)

    return _train_loop(torch, dev, model, opt, batch, lambda o, y: nn.functional.cross_entropy(o.float(), y),
                       seconds)


def run_train_cnn(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    nn = torch.nn

    def conv(i: int, o: int) -> list[Any]:
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]

    model = nn.Sequential(*conv(3, 64), *conv(64, 128), *conv(128, 256), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(),
                          nn.Dropout(0.1), nn.Linear(256, 100)).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def batch() -> tuple[Any, Any]:
        x = torch.randn(s.cnn_batch, 3, s.img, s.img, device=dev).to(memory_format=torch.channels_last)
        return x, torch.randint(0, 100, (s.cnn_batch,), device=dev)

    return _train_loop(torch, dev, model, opt, batch, lambda o, y: nn.functional.cross_entropy(o.float(), y),
                       seconds)


def _gpt_train(torch: Any, dev: Any, s: Sizes, seconds: float, optim: str, checkpointing: bool = False,
               lora: bool = False, batch: int | None = None, seq: int | None = None) -> dict[str, Any]:
    GPT, LoRALinear = _gpt_classes(torch)
    model = GPT(s, checkpointing=checkpointing).to(dev)
    if lora:
        for p in model.parameters():
            p.requires_grad_(False)
        for blk in model.blocks:
            blk.qkv = LoRALinear(blk.qkv)
            blk.proj = LoRALinear(blk.proj)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (torch.optim.AdamW(params, lr=1e-4) if optim == "adamw"
           else torch.optim.SGD(params, lr=1e-2, momentum=0.9))
    info = _train_loop(torch, dev, model, opt, _lm_batch(torch, dev, s, batch or s.batch, seq or s.seq),
                       _lm_loss(torch), seconds)
    info["trainable_params"] = sum(p.numel() for p in params)
    return info


def run_train_gpt_adamw(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    return _gpt_train(torch, dev, s, seconds, "adamw")


def run_train_gpt_sgd(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    return _gpt_train(torch, dev, s, seconds, "sgd")


def run_train_gpt_ckpt(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    return _gpt_train(torch, dev, s, seconds, "adamw", checkpointing=True)


def run_train_gpt_lora(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    return _gpt_train(torch, dev, s, seconds, "adamw", lora=True)


def run_train_small_batch(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    return _gpt_train(torch, dev, s, seconds, "adamw", batch=1, seq=max(8, s.seq // 4))


def run_train_lora_finetune(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    """Unlike train_gpt_lora (fp32 base, adapters on attention only): a larger base held frozen in bf16,
    rank-16 adapters on all four linears of every block, sequences twice as long at half the batch."""
    big = dataclasses.replace(s, d_model=s.d_model * 3 // 2, layers=s.layers + s.layers // 3, seq=2 * s.seq,
                              batch=max(1, s.batch // 2))
    GPT, LoRALinear = _gpt_classes(torch)
    model = GPT(big).to(dev).to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for attr in ("qkv", "proj", "fc1", "fc2"):
            setattr(blk, attr, LoRALinear(getattr(blk, attr), rank=16))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4)
    batch = _lm_batch(torch, dev, big, big.batch, big.seq)
    info = _train_loop(torch, dev, model, opt, batch, _lm_loss(torch), seconds)
    info["trainable_params"] = sum(p.numel() for p in params)
    info["frozen_params"] = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    info["seq"], info["batch"] = big.seq, big.batch
    return info


def run_train_eval_mixed(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    """Cycles of ~15 s (scaled down with `seconds`): 60 % training steps, then 40 % evaluation forwards under
    inference_mode at twice the batch, as a training job that evaluates on a held-out set every epoch."""
    GPT, _ = _gpt_classes(torch)
    model = GPT(s).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = _lm_loss(torch)
    train_batch = _lm_batch(torch, dev, s, s.batch, s.seq)
    eval_batch = _lm_batch(torch, dev, s, 2 * s.batch, s.seq)
    cycles = max(1, round(seconds / 15.0))
    cycle = seconds / cycles
    start = time.monotonic()
    steps = evals = 0
    eval_loss: float | None = None
    for c in range(cycles):
        train_end = start + c * cycle + 0.6 * cycle
        trained = _train_loop(torch, dev, model, opt, train_batch, loss_fn, train_end - time.monotonic())
        steps += trained["steps"]
        model.eval()
        total = None
        n = 0
        with torch.inference_mode(), _autocast(torch, dev):
            for i in _until(start + (c + 1) * cycle - time.monotonic()):
                x, y = eval_batch()
                loss = loss_fn(model(x), y)
                total = loss if total is None else total + loss
                n += 1
                if i % 4 == 0:
                    loss.item()
        if total is not None:
            eval_loss = float(total.item()) / n
        evals += n
        model.train()
    return {"cycles": cycles, "train_steps": steps, "eval_batches": evals, "eval_loss": eval_loss}


def _inference_model(torch: Any, dev: Any, s: Sizes) -> Any:
    GPT, _ = _gpt_classes(torch)
    return GPT(s).to(dev).to(torch.bfloat16).eval()


def run_infer_batched(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    model = _inference_model(torch, dev, s)
    n = 0
    with torch.inference_mode():
        for i in _until(seconds):
            x = torch.randint(0, s.vocab, (s.infer_batch, s.seq), device=dev)
            out = model(x)
            n += 1
            if i % 4 == 0:
                out[0, -1, 0].item()
    return {"batches": n, "sequences": n * s.infer_batch}


def _generate(model: Any, prompt: Any, decode_steps: int, s: Sizes, end: float = math.inf) -> int:
    """Prefill, then up to `decode_steps` single-token steps (the KV cache grows by one position each),
    stopping early at monotonic time `end`; returns the decode steps done."""
    caches: list[dict[str, Any]] = [{} for _ in range(s.layers)]
    logits = model(prompt, caches=caches, pos0=0)
    pos = prompt.shape[1]
    tok = logits[:, -1:].argmax(-1)
    done = 0
    for _ in range(decode_steps):
        if time.monotonic() >= end:
            break
        logits = model(tok, caches=caches, pos0=pos)
        pos += 1
        done += 1
        tok = logits[:, -1:].argmax(-1)
    tok.cpu()
    return done


def _poisson(torch: Any, dev: Any, s: Sizes, seconds: float, rate: float) -> dict[str, Any]:
    model = _inference_model(torch, dev, s)
    rng = random.Random(1)
    latencies: list[float] = []
    start = time.monotonic()
    next_arrival = start + rng.expovariate(rate)
    end = start + seconds
    with torch.inference_mode():
        # Stops at the window's end even when behind: a saturated queue must not overrun the time budget.
        while next_arrival < end and time.monotonic() < end:
            now = time.monotonic()
            if now < next_arrival:
                time.sleep(next_arrival - now)
            prompt = torch.randint(0, s.vocab, (1, max(8, s.seq // 2)), device=dev)
            _generate(model, prompt, 15, s)  # 16 tokens: one from the prefill, 15 decoded
            latencies.append(time.monotonic() - next_arrival)  # queueing included, as a client sees it
            next_arrival += rng.expovariate(rate)
    unserved = 0
    while next_arrival < end:
        unserved += 1
        next_arrival += rng.expovariate(rate)
    return {"requests": len(latencies), "rate_per_s": rate, "unserved": unserved, **_quantiles(latencies)}


def _quantiles(values: list[float], prefix: str = "") -> dict[str, float | None]:
    v = sorted(values)
    return {f"{prefix}p50_s": v[len(v) // 2] if v else None,
            f"{prefix}p99_s": v[min(len(v) - 1, int(len(v) * 0.99))] if v else None}


def run_infer_poisson_low(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    return _poisson(torch, dev, s, seconds, 4.0)


def run_infer_poisson_high(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    return _poisson(torch, dev, s, seconds, 40.0)


def run_infer_generate_kv(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    model = _inference_model(torch, dev, s)
    tokens = 0
    end = time.monotonic() + seconds
    with torch.inference_mode():
        while time.monotonic() < end:
            prompt = torch.randint(0, s.vocab, (8, max(8, s.seq // 4)), device=dev)
            tokens += 8 * _generate(model, prompt, s.gen_tokens, s, end)
    return {"tokens": tokens}


# ---- LLM serving: continuous batching over a preallocated KV cache ---------------------------------------


def _serve_class(torch: Any) -> type:
    nn: Any = torch.nn
    F = torch.nn.functional

    class ServeLM(nn.Module):
        """A GPT behind a decode server: a KV cache of `slots` sequences allocated once. A prefill (slot >= 0)
        runs one request's prompt and writes its keys and values into its cache row from position 0; a decode
        step (slot < 0) advances cache rows 0..n-1 by one token each, every row at its own position `lens[i]`,
        attending to the first `span` cached positions under a per-row mask. Returns each row's next token."""

        def __init__(self, gpt: Any, slots: int, max_len: int) -> None:
            super().__init__()
            self.gpt = gpt
            blk = gpt.blocks[0]
            d, heads = blk.qkv.in_features, blk.heads
            w = gpt.head.weight
            shape = (len(gpt.blocks), slots, heads, max_len, d // heads)
            self.register_buffer("kc", torch.zeros(shape, dtype=w.dtype, device=w.device), persistent=False)
            self.register_buffer("vc", torch.zeros(shape, dtype=w.dtype, device=w.device), persistent=False)

        def forward(self, tokens: Any, lens: Any, slot: int = -1, span: int = 0) -> Any:
            g = self.gpt
            n, t = tokens.shape
            if slot >= 0:
                x = g.tok(tokens) + g.pos(torch.arange(t, device=tokens.device))
            else:
                x = g.tok(tokens) + g.pos(lens)[:, None, :]
                rows = torch.arange(n, device=tokens.device)
                keys = torch.arange(span, device=tokens.device)
                mask = (keys[None, :] <= lens[:, None])[:, None, None, :]
            for i, blk in enumerate(g.blocks):
                c = x.shape[-1]
                q, k, v = blk.qkv(blk.ln1(x)).split(c, dim=2)
                q, k, v = (z.view(n, t, blk.heads, c // blk.heads).transpose(1, 2) for z in (q, k, v))
                if slot >= 0:
                    self.kc[i, slot, :, :t] = k[0]
                    self.vc[i, slot, :, :t] = v[0]
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
                else:
                    self.kc[i][rows, :, lens] = k[:, :, 0]
                    self.vc[i][rows, :, lens] = v[:, :, 0]
                    y = F.scaled_dot_product_attention(q, self.kc[i, :n, :, :span], self.vc[i, :n, :, :span],
                                                       attn_mask=mask)
                x = x + blk.proj(y.transpose(1, 2).reshape(n, t, c))
                x = x + blk.fc2(F.gelu(blk.fc1(blk.ln2(x))))
            return g.head(g.ln(x[:, -1])).argmax(-1)

    return ServeLM


def poisson_arrivals(rng: random.Random, rate: float) -> Iterator[float]:
    """Arrival times (s from the start) of a Poisson process of `rate` per second."""
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        yield t


def mmpp_arrivals(rng: random.Random, rates: tuple[float, float],
                  dwell_s: tuple[float, float]) -> Iterator[float]:
    """Bursty arrivals: a two-state Markov-modulated Poisson process, starting in state 0 (on). State i lasts
    an exponential time of mean dwell_s[i] and emits Poisson arrivals at rates[i] per second."""
    t, state = 0.0, 0
    switch = rng.expovariate(1.0 / dwell_s[0])
    while True:
        gap = rng.expovariate(rates[state]) if rates[state] > 0 else math.inf
        if t + gap < switch:
            t += gap
            yield t
        else:  # memoryless: drawing afresh in the new state is exact
            t, state = switch, 1 - state
            switch = t + rng.expovariate(1.0 / dwell_s[state])


ADMIT_PER_STEP = 4  # prefills between two decode steps at most, so a burst cannot stall every stream


def _serve(torch: Any, dev: Any, s: Sizes, seconds: float, arrivals: Iterator[float],
           seed: int) -> dict[str, Any]:
    """A continuous-batching decode server until `seconds` have passed: arrivals queue; between decode steps
    up to ADMIT_PER_STEP queued requests are prefilled into free cache rows (lowest first, so the decode batch
    spans only the rows in use); each decode step advances every active request by one token and hands the
    tokens to the host (one sync per step, as a server streams them); a request leaves after its output
    length. Requests still queued or running at the end are counted, not finished."""
    rng = random.Random(seed)
    max_len = s.seq + s.serve_out
    prompt_len = (max(4, s.seq // 8), s.seq)
    out_len = (max(2, s.serve_out // 8), s.serve_out)
    model = _inference_model(torch, dev, s)
    slots = s.serve_slots
    latencies: list[float] = []
    ttft: list[float] = []
    arrived = steps = batch_sum = prefill_tokens = 0
    with torch.inference_mode():
        server = _serve_class(torch)(model, slots, max_len)
        lens = torch.zeros(slots, dtype=torch.long, device=dev)
        toks = torch.zeros(slots, 1, dtype=torch.long, device=dev)
        host_lens = [0] * slots
        free = list(range(slots))
        active: dict[int, list[float]] = {}  # cache row -> [tokens still to decode, arrival time]
        queue: deque[tuple[float, int, int]] = deque()
        start = time.monotonic()
        end = start + seconds
        next_at = start + next(arrivals)
        while True:
            now = time.monotonic()
            if now >= end:
                break
            while next_at <= now:
                queue.append((next_at, rng.randint(*prompt_len), rng.randint(*out_len)))
                arrived += 1
                next_at = start + next(arrivals)
            admitted = 0
            while queue and free and admitted < ADMIT_PER_STEP:
                t_arr, plen, olen = queue.popleft()
                row = heapq.heappop(free)
                prompt = torch.randint(0, s.vocab, (1, plen), device=dev)
                first = server(prompt, lens[:1], row)
                toks[row, 0] = first[0]
                lens[row] = plen
                first.cpu()
                ttft.append(time.monotonic() - t_arr)
                host_lens[row] = plen
                active[row] = [olen - 1.0, t_arr]
                admitted += 1
                prefill_tokens += plen
            if not active:  # nothing running: wait for the next arrival
                time.sleep(max(0.0, min(next_at, end) - time.monotonic()))
                continue
            n = max(active) + 1
            span = max(host_lens[r] for r in active) + 1
            out = server(toks[:n], lens[:n], -1, span)
            toks[:n, 0] = out
            lens[:n] += 1
            lens.clamp_(max=max_len - 1)  # rows not in use keep writing their own last position
            out.cpu()
            steps += 1
            batch_sum += len(active)
            t = time.monotonic()
            for row in list(active):
                req = active[row]
                req[0] -= 1
                host_lens[row] += 1
                if req[0] <= 0 or host_lens[row] >= max_len - 1:
                    latencies.append(t - req[1])
                    del active[row]
                    heapq.heappush(free, row)
    return {"arrived": arrived, "completed": len(latencies), "unfinished": len(active) + len(queue),
            "decode_steps": steps, "mean_batch": batch_sum / steps if steps else 0.0,
            "prefill_tokens": prefill_tokens, "decoded_tokens": batch_sum, **_quantiles(latencies),
            **_quantiles(ttft, "ttft_")}


def run_infer_serve_poisson(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    info = _serve(torch, dev, s, seconds, poisson_arrivals(random.Random(3), 12.0), seed=4)
    return {"arrivals": "poisson 12/s", **info}


def run_infer_serve_bursty(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    # On/off periods scale with the window: about six bursts in it, 6 s on and 8 s off at 90 s.
    dwell = (seconds / 15.0, seconds / 11.0)
    info = _serve(torch, dev, s, seconds, mmpp_arrivals(random.Random(5), (40.0, 1.0), dwell), seed=6)
    return {"arrivals": f"mmpp 40/s on {dwell[0]:.2g} s, 1/s off {dwell[1]:.2g} s", **info}


def run_other_gemm(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    a = torch.randn(s.gemm, s.gemm, device=dev, dtype=torch.bfloat16)
    b = torch.randn(s.gemm, s.gemm, device=dev, dtype=torch.bfloat16)
    n = 0
    for i in _until(seconds):
        c = a @ b
        n += 1
        if i % 8 == 0:
            c[0, 0].item()
    return {"products": n, "flop": 2.0 * n * s.gemm**3}


def run_other_fft(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    x = torch.randn(*s.fft_shape, device=dev, dtype=torch.complex64)
    n = 0
    for i in _until(seconds):
        y = torch.fft.ifftn(torch.fft.fftn(x, dim=(-2, -1)), dim=(-2, -1))
        n += 1
        if i % 4 == 0:
            y[0, 0, 0].item()
    return {"transforms": 2 * n}


def run_other_memcpy(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    n_el = s.copy_bytes // 4
    src = torch.empty(n_el, device=dev, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    host = torch.empty(n_el // 4, dtype=torch.float32, pin_memory=dev.type == "cuda")
    moved = 0
    for i in _until(seconds):
        if i % 3 == 0:
            dst.copy_(src)
            moved += s.copy_bytes
        elif i % 3 == 1:
            dst[: host.numel()].copy_(host, non_blocking=True)
            moved += host.numel() * 4
        else:
            host.copy_(src[: host.numel()])
            moved += host.numel() * 4
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return {"bytes": moved}


def run_other_bursty(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    rng = random.Random(2)
    a = torch.randn(s.gemm, s.gemm, device=dev, dtype=torch.bfloat16)
    bursts = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        burst_end = min(end, time.monotonic() + rng.uniform(0.2, 1.0))
        while time.monotonic() < burst_end:
            (a @ a)[0, 0].item()
        bursts += 1
        time.sleep(max(0.0, min(end - time.monotonic(), rng.uniform(0.3, 1.5))))
    return {"bursts": bursts}


def run_other_stencil(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    """Jacobi iteration for Laplace's equation on an n^3 grid (one face held at 1): each sweep averages the
    six neighbours of every inner point into the other buffer; every 20 sweeps the largest change is read
    back, as a solver checks convergence."""
    n = s.stencil
    u = torch.zeros(n, n, n, device=dev)
    u[0] = 1.0
    v = u.clone()
    sweeps = 0
    change = math.nan
    for i in _until(seconds):
        inner = v[1:-1, 1:-1, 1:-1]
        torch.add(u[2:, 1:-1, 1:-1], u[:-2, 1:-1, 1:-1], out=inner)
        inner += u[1:-1, 2:, 1:-1]
        inner += u[1:-1, :-2, 1:-1]
        inner += u[1:-1, 1:-1, 2:]
        inner += u[1:-1, 1:-1, :-2]
        inner.mul_(1.0 / 6.0)
        u, v = v, u
        sweeps += 1
        if i % 20 == 19:
            change = float((u - v).abs().max().item())
    return {"sweeps": sweeps, "grid": n, "last_change": change,
            "cell_updates": float(sweeps) * (n - 2) ** 3}


def run_other_membound(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    """STREAM's four kernels in turn (copy c=a, scale b=c/2, add c=a+b, triad a=b+c/3: the values stay put),
    and every 8 kernels three reductions read back (sum, max, norm)."""
    n = s.stream_elems
    a = torch.full((n,), 1.0, device=dev)
    b = torch.full((n,), 2.0, device=dev)
    c = torch.zeros(n, device=dev)
    moved = 0
    for i in _until(seconds):
        k = i % 4
        if k == 0:
            c.copy_(a)
        elif k == 1:
            torch.mul(c, 0.5, out=b)
        elif k == 2:
            torch.add(a, b, out=c)
        else:
            torch.add(b, c, alpha=1.0 / 3.0, out=a)
        moved += (2 if k < 2 else 3) * 4 * n
        if i % 8 == 7:
            torch.stack([a.sum(), b.amax(), c.norm()]).cpu()
            moved += 3 * 4 * n
    return {"bytes": moved, "elems": n}


def run_idle_held(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    """A server that has loaded its model and reserved its KV cache, and gets no requests: weights and a
    KV-cache-like block resident, no kernels (no warm-up forward either, so the hooks see nothing)."""
    model = _inference_model(torch, dev, s)
    kv = torch.empty(s.held_bytes // 2, device=dev, dtype=torch.bfloat16)
    kv[:: max(1, kv.numel() // 1024)].zero_()  # touch it so the allocation is real
    _sync(torch, dev)
    time.sleep(seconds)
    params = sum(p.numel() for p in model.parameters())
    del kv, model
    return {"held_bytes": s.held_bytes, "model_params": params, "model_bytes": 2 * params}


def run_idle_released(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {}


RUNNERS: dict[str, Callable[[Any, Any, Sizes, float], dict[str, Any]]] = {
    name: globals()[f"run_{name}"] for name in NAMES
}


# ---- rotation: which workloads this run records ---------------------------------------------------------


def represented_seconds(data_dir: Path) -> dict[str, float]:
    """Seconds of labelled workload windows per battery workload in data_dir/*/labels.csv (rows whose family
    is a workload name; both rates of one window count once; the idle gaps between workloads do not count)."""
    spans: dict[str, set[tuple[str, str, str, str]]] = {}
    for path in sorted(data_dir.glob("*/labels.csv")):
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                family = row.get("family") or ""
                if family in LABEL_OF:
                    spans.setdefault(family, set()).add((str(path.parent), row.get("t_from") or "",
                                                         row.get("t_to") or "", row.get("label") or ""))
    out: dict[str, float] = {}
    for family, keys in spans.items():
        total = 0.0
        for _, a, b, _ in keys:
            try:
                total += max(0.0, float(b) - float(a))
            except ValueError:
                continue
        out[family] = total
    return out


def rotation_order(names: Iterable[str], key: int, represented: dict[str, float]) -> list[str]:
    """Least represented first, in 10 s steps (a few seconds more or less is a tie); ties in a pseudo-random
    order that the rotation key sets."""
    def tie(name: str) -> str:
        return hashlib.sha256(f"{key}:{name}".encode()).hexdigest()

    return sorted(names, key=lambda n: (round(represented.get(n, 0.0) / 10.0), tie(n)))


def choose_workloads(names: Iterable[str], key: int, represented: dict[str, float], budget_s: float,
                     cost: Callable[[str], float]) -> list[str]:
    """This run's subset, in run order: first one workload of each label class (idle first, then the classes
    in the order their first workload comes in `rotation_order`), each the first of its class in that order
    that still fits `budget_s` (by `cost`); then more in that order while they fit, other idle ones last."""
    order = rotation_order(names, key, represented)
    classes = sorted({LABEL_OF[n] for n in order},
                     key=lambda c: (c != "idle", next(i for i, n in enumerate(order) if LABEL_OF[n] == c)))
    chosen: list[str] = []
    left = budget_s

    def take(name: str) -> None:
        nonlocal left
        chosen.append(name)
        left -= cost(name)

    for label in classes:
        pick = next((n for n in order if LABEL_OF[n] == label and cost(n) <= left), None)
        if pick is not None:
            take(pick)
    for name in sorted(order, key=lambda n: LABEL_OF[n] == "idle"):  # stable: keeps the rotation's order
        if name not in chosen and cost(name) <= left:
            take(name)
    return chosen


def gpu_slug(name: str) -> str:
    """The device folder for a GPU model: "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200,
    "NVIDIA A100-SXM4-80GB" -> a100, "NVIDIA GeForce RTX 3090" -> rtx3090; "gpu" when nothing is left."""
    words = [w for w in re.findall(r"[a-z0-9]+", name.lower()) if w not in ("nvidia", "geforce", "tesla")]
    if not words:
        return "gpu"
    if words[0] in ("rtx", "gtx", "titan") and len(words) > 1:
        return words[0] + words[1]
    return words[0]


# ---- NVML's sample buffers ------------------------------------------------------------------------------

# kind (the schema's signal name), pynvml sampling type, factor to base units (percent -> ratio, mW -> W)
SAMPLE_KINDS: tuple[tuple[str, str, float], ...] = (
    ("gpu_util", "NVML_GPU_UTILIZATION_SAMPLES", 0.01),
    ("power", "NVML_TOTAL_POWER_SAMPLES", 0.001),
)
_VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# NVML codes after which asking again is pointless: NotSupported, NoPermission, InvalidArgument,
# FunctionNotFound
_GIVE_UP = frozenset({3, 4, 2, 13})
_NOT_FOUND = 6  # nothing newer than the timestamp asked for: normal between two polls


class SampleBuffers:
    """nvmlDeviceGetSamples on one GPU, polled once a tick: the driver keeps its own recent samples of GPU
    utilisation and total power, each at its own timestamp (CPU clock, microseconds). Each poll asks for the
    samples newer than the last one seen of that kind and keeps only those, so no sample is recorded twice.
    The first poll gets the whole buffer: samples from before `since_s` (the previous workload's) are dropped
    when the timestamps are Unix time. NotSupported (and the like) stops that kind and is noted; NotFound is
    a poll with nothing new; other errors are counted and the next poll tries again."""

    def __init__(self, handle: Any, since_s: float | None = None) -> None:
        self.handle = handle
        self.since_s = time.time() if since_s is None else since_s
        self.last_us = {kind: 0 for kind, _, _ in SAMPLE_KINDS}
        self.rows: list[tuple[float, str, float]] = []
        self.polls = 0
        self.stats: dict[str, dict[str, Any]] = {
            kind: {"status": "ok", "samples": 0, "duplicates_dropped": 0, "before_start_dropped": 0,
                   "not_found_polls": 0, "errors": {}} for kind, _, _ in SAMPLE_KINDS}

    def poll(self) -> int:
        """One poll of every kind still on; returns the new samples kept."""
        import pynvml

        self.polls += 1
        added = 0
        for kind, sampling, scale in SAMPLE_KINDS:
            st = self.stats[kind]
            if st["status"] != "ok":
                continue
            try:
                value_type, samples = pynvml.nvmlDeviceGetSamples(self.handle, getattr(pynvml, sampling),
                                                                  self.last_us[kind])
            except pynvml.NVMLError as exc:
                code = int(getattr(exc, "value", -1))
                if code == _NOT_FOUND:
                    st["not_found_polls"] += 1
                elif code in _GIVE_UP:
                    st["status"] = f"not recorded: {exc} (NVML code {code})"
                else:
                    st["errors"][str(exc)] = st["errors"].get(str(exc), 0) + 1
                continue
            field_name = _VALUE_FIELD.get(int(value_type))
            if field_name is None:
                st["status"] = f"not recorded: unknown NVML value type {value_type}"
                continue
            for sample in sorted(samples, key=lambda x: int(x.timeStamp)):
                ts = int(sample.timeStamp)
                if ts <= self.last_us[kind]:
                    st["duplicates_dropped"] += 1
                    continue
                self.last_us[kind] = ts
                t = ts / 1e6
                if abs(t - time.time()) < 86400.0 and t < self.since_s:
                    st["before_start_dropped"] += 1
                    continue
                self.rows.append((t, kind, float(getattr(sample.sampleValue, field_name)) * scale))
                st["samples"] += 1
                added += 1
        return added

    def failed(self, exc: BaseException) -> None:
        """A Python error in a poll (not an NVML one): stop polling and say why."""
        for st in self.stats.values():
            if st["status"] == "ok":
                st["status"] = f"not recorded: {type(exc).__name__}: {exc}"

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, Any] = {}
        for kind, _, _ in SAMPLE_KINDS:
            t = sorted(r[0] for r in self.rows if r[1] == kind)
            gaps = sorted(b - a for a, b in itertools.pairwise(t))
            kinds[kind] = {**self.stats[kind], "first_s": t[0] if t else None, "last_s": t[-1] if t else None,
                           "median_period_s": gaps[len(gaps) // 2] if gaps else None,
                           "max_gap_s": gaps[-1] if gaps else None}
        return {"polls": self.polls, "since_s": self.since_s, "kinds": kinds}

    def write(self, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = sorted(self.rows, key=lambda r: r[0])
        table = pa.table({"time_s": pa.array([r[0] for r in rows], pa.float64()),
                          "kind": pa.array([r[1] for r in rows], pa.string()),
                          "value": pa.array([r[2] for r in rows], pa.float64())})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)


# =============================================================================================
# Orchestrator: samples the GPU, drives the worker, writes recordings and labels.
# =============================================================================================


@dataclass
class Battery:
    out: Path
    dry_run: bool
    active_s: float
    gap_s: float
    names: list[str]
    log_lines: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)

    budget_s: float = math.inf
    started: float = field(default_factory=time.monotonic)
    device_dir: str = "gpu"
    work: Path | None = None  # where DEV/ is written; None: `out`
    rotation: dict[str, Any] = field(default_factory=dict)

    def seconds(self, name: str) -> float:
        """Idle workloads need less time than busy ones to show what they are, but not under MIN_WINDOW_S."""
        if LABEL_OF[name] != "idle":
            return self.active_s
        return max(self.active_s * IDLE_SHARE, min(self.active_s, MIN_WINDOW_S))

    def cost(self, name: str) -> float:
        """The planning estimate of one workload's share of the budget."""
        return self.seconds(name) + self.gap_s + PER_WORKLOAD_OVERHEAD_S

    def fits(self, name: str) -> bool:
        return time.monotonic() - self.started + self.seconds(name) + self.gap_s + 3.0 <= self.budget_s

    @property
    def root(self) -> Path:
        return (self.work or self.out) / self.device_dir

    @property
    def events(self) -> Path:
        """The worker's hook events: outside the output folder, packed into the tarball as events/."""
        path = Path(tempfile.gettempdir()) / f"battery-events-{os.getpid()}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def log(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        text = f"[{stamp}] {line}"
        print(text, flush=True)
        self.log_lines.append(text)


def _recorder_main(args: argparse.Namespace) -> int:
    """One rate in its own process (own NVML handle, as two `phasescope record` would be): samples until
    "stop" or end of input arrives on stdin, then closes the recording and says so. With --samples it also
    polls NVML's sample buffers after every tick and writes them there."""
    from phasescope.schema import TickBatch
    from phasescope.sources.nvml import NvmlSource
    from phasescope.sources.sampler import Sampler
    from phasescope.store.recording import RecordingWriter, _atomic_write_json, manifest_path_for

    close_fake = _install_fake_nvml(Path(args.fake_trace)) if args.fake_trace else (lambda: None)
    source = NvmlSource()
    interval = 1.0 / args.rate
    path = Path(args.path)
    writer = RecordingWriter(path, source_spec="nvml" + (" (fake, dry run)" if args.fake_trace else ""),
                             interval_s=interval, overwrite=True)
    buffers: SampleBuffers | None = None
    samples_note: dict[str, Any] = {}
    if args.samples:
        import pynvml

        try:
            buffers = SampleBuffers(pynvml.nvmlDeviceGetHandleByIndex(0))
        except pynvml.NVMLError as exc:
            samples_note = {"status": f"not recorded: no handle for GPU 0 ({exc})"}
    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    def poll() -> None:
        if buffers is None:
            return
        try:
            buffers.poll()
        except Exception as exc:  # the recording must not die of the extra
            buffers.failed(exc)

    def on_tick(batch: TickBatch) -> None:
        writer.write(batch)
        poll()

    threading.Thread(target=watch_stdin, daemon=True).start()
    _send({"event": "recording", "rate_hz": args.rate})
    stats = Sampler(source, interval).run(on_tick, stop=stop)
    poll()  # what came since the last tick
    writer.note_errors(source.error_counts())
    manifest: dict[str, Any] = writer.close()
    manifest["sampler"] = {"ticks": stats.ticks, "skipped": stats.skipped, "max_late_s": stats.max_late_s}
    manifest["nvml"] = _finite_json({"static": source.static_info(), "errors": source.error_counts(),
                                     "unsupported_calls": source.unsupported_calls()})
    if args.samples:
        samples_path = Path(args.samples)
        if buffers is not None:
            buffers.write(samples_path)
            samples_note = buffers.summary()
        manifest["nvml_samples"] = _finite_json({"path": samples_path.name, **samples_note})
    _atomic_write_json(manifest_path_for(path), manifest)
    source.close()
    close_fake()
    _send({"event": "closed", "rows": manifest["rows"]})
    return 0


def _probe_main(args: argparse.Namespace) -> int:
    """The GPU model, for the device folder's name: one JSON line, in a process of its own (a driver that
    hangs costs the probe's timeout, not the battery)."""
    close_fake = _install_fake_nvml(Path(args.fake_trace)) if args.fake_trace else (lambda: None)
    import pynvml

    try:
        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            name = str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))) if count else ""
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        _send({"error": f"NVML: {exc}"})
        return 1
    finally:
        close_fake()
    _send({"name": name, "count": count})
    return 0


def _finite_json(obj: Any) -> Any:
    """NaN and infinity (a static fact the device does not report, no budget) become null: strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    return obj


FAKE_TICK_S = 0.1


def _install_fake_nvml(trace_path: Path) -> Callable[[], None]:
    """Dry run: the fake NVML replays a real trace, one sample per 0.1 s of wall time, as a GPU named
    DRY_RUN_GPU; its sample buffers hold one sample per tick stamped on the wall clock, as the driver's are.
    Returns its uninstaller."""
    sys.path.insert(0, str(REPO))
    from tests.fakes.fake_nvml import FakeNvml

    from phasescope.sources.replay import read

    epoch = time.time()
    fake = FakeNvml([read(trace_path)[0]], mem_total_bytes=24 << 30, power_limit_w=350.0,
                    energy_from_power=True, sample_clock=(epoch, FAKE_TICK_S))
    fake.gpus[0].name = DRY_RUN_GPU
    cm = fake.installed()
    cm.__enter__()
    stop = threading.Event()

    def tick() -> None:
        k = 0
        while True:  # tick k at epoch + k * FAKE_TICK_S: no drift from the sample clock
            k += 1
            if stop.wait(max(0.0, epoch + k * FAKE_TICK_S - time.time())):
                return
            fake.advance()

    threading.Thread(target=tick, daemon=True).start()

    def close() -> None:
        stop.set()
        cm.__exit__(None, None, None)

    return close


def _child_env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _start_recorder(battery: Battery, rate_hz: float, path: Path,
                    samples: Path | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--recorder", "--rate", f"{rate_hz:g}",
           "--path", str(path)]
    if samples is not None:
        cmd += ["--samples", str(samples)]
    if battery.dry_run:
        cmd += ["--fake-trace", str(_dry_run_trace())]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_child_env())


def _dry_run_trace() -> Path:
    base = Path(os.environ.get("PHASESCOPE_SHARED_DATA") or REPO.parent / "shared" / "data")
    found = sorted(base.glob("sensorguard-*/*/nvml.csv"))
    if not found:
        raise SystemExit(f"battery --dry-run: no sensorguard nvml.csv under {base} "
                         "(set PHASESCOPE_SHARED_DATA)")
    return found[0]


def _probe_gpu(battery: Battery) -> tuple[str, str]:
    """(GPU model name, why not) of NVML's GPU 0, from a separate process with a time limit."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe-gpu"]
    if battery.dry_run:
        cmd += ["--fake-trace", str(_dry_run_trace())]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), timeout=60)
    except subprocess.TimeoutExpired:
        return "", "the NVML probe timed out"
    for line in reversed(done.stdout.splitlines()):
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        return str(msg.get("name") or ""), str(msg.get("error") or ("" if msg.get("name") else "no GPU"))
    return "", f"the NVML probe said nothing (exit {done.returncode}): {done.stderr.strip()[-300:]}"


def _start_worker(battery: Battery, events: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--events", str(events),
           "--device", "cpu" if battery.dry_run else "cuda"]
    if battery.dry_run:
        cmd.append("--tiny")
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_child_env())


def _read_msg(worker: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    assert worker.stdout is not None
    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(worker.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    t.start()
    t.join(timeout_s)
    if not result or not result[0]:
        raise RuntimeError(f"worker gave no answer within {timeout_s:.0f} s (exit code {worker.poll()})")
    try:
        msg: dict[str, Any] = json.loads(result[0])
    except json.JSONDecodeError:  # a library printed to stdout: skip the line, keep listening
        print(f"worker said: {result[0].rstrip()}", flush=True)
        return _read_msg(worker, timeout_s)
    return msg


def _label_rows(battery: Battery, events: Path, rec_path: Path, manifest: dict[str, Any], name: str,
                t0: float, t1: float, rate_hz: float) -> tuple[list[dict[str, Any]], str]:
    """Labels for one recording: hook segments clipped to the workload window, declared labels otherwise."""
    from phasescope.instrument.labels import label_rows
    from phasescope.store.recording import read_recording

    devices = [tr.device for tr in read_recording(rec_path)]
    rel = str(rec_path.relative_to(battery.root))
    declared = LABEL_OF[name]
    accepted = HOOK_LABELS.get(name, frozenset({declared}))
    run = f"{battery.device_dir}-{name}"
    common = {"path": rel, "family": name, "source": "phasescope-battery", "rate_hz": f"{rate_hz:g}",
              "signals": "all", "run": run, "gpu": devices[0].name if devices else ""}
    hooks: list[dict[str, Any]] = []
    try:
        hooks = label_rows(events, rel, devices, family=name, run=run, rate_hz=f"{rate_hz:g}", idle_gap_s=2.0)
    except Exception as exc:  # labels from hooks are best effort; the declared label stands
        battery.log(f"  hooks gave no labels for {name}: {type(exc).__name__}: {exc}")
    rows: list[dict[str, Any]] = []
    hook_phases = set()
    # Shorter segments are start-up or tail effects; a mixed workload's phases are short by design.
    shortest = min(1.0, (0.1 if name in HOOK_LABELS else 0.25) * (t1 - t0))
    for r in hooks:
        a, b = max(float(r["t_from"]), t0), min(float(r["t_to"]), t1)
        if b - a < shortest:
            continue
        hook_phases.add(r["label"])
        if r["label"] in accepted:
            rows.append({**r, **common, "t_from": f"{a:.3f}", "t_to": f"{b:.3f}",
                         "notes": f"hooks: {r['notes']}"})
    if not rows:
        source = "declared (hooks saw " + (",".join(sorted(hook_phases)) or "nothing") + ")"
        rows.append({**common, "gpu_index": 0, "t_from": f"{t0:.3f}", "t_to": f"{t1:.3f}", "label": declared,
                     "notes": f"declared by the battery; {source}"})
        how = source
    else:
        how = "hooks" + ("" if hook_phases <= accepted else f" (also saw {','.join(sorted(hook_phases))})")
    # The gaps around the workload: the worker holds its context and runs nothing. A 1 s margin lets the
    # GPU's queue drain and its clocks settle before a window counts as idle.
    start, end = float(manifest["start"]), float(manifest["end"])
    for a, b in ((start, t0 - 0.5), (t1 + 1.0, end)):
        if b - a >= 1.0 and name != "idle_released":
            rows.append({**common, "gpu_index": 0, "t_from": f"{a:.3f}", "t_to": f"{b:.3f}", "label": "idle",
                         "family": "battery_gap", "notes": "gap between workloads, worker holds its context"})
    return rows, how


PUBLISHED = ("battery.json", "battery.log", "nvml_check.json", "nvml_check.txt")


def _pack(battery: Battery) -> None:
    """DEV/ and the hook events into DIR/battery.tar.gz; with a separate work folder, also DIR/PUBLISHED."""
    battery.out.mkdir(parents=True, exist_ok=True)
    tmp = battery.out / "battery.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(battery.root, arcname=battery.device_dir)
        tar.add(battery.events, arcname="events")
    tmp.replace(battery.out / "battery.tar.gz")
    if battery.root.parent.resolve() != battery.out.resolve():
        for name in PUBLISHED:
            if (battery.root / name).exists():
                shutil.copyfile(battery.root / name, battery.out / name)


def run_battery(battery: Battery) -> int:
    from phasescope.instrument.labels import write_labels_csv

    root = battery.root
    for rate in RATES_HZ:
        (root / f"{rate:g}hz").mkdir(parents=True, exist_ok=True)
    labels_path = root / "labels.csv"
    labels_path.unlink(missing_ok=True)
    meta: dict[str, Any] = {"host": socket.gethostname(), "dry_run": battery.dry_run,
                            "device_dir": battery.device_dir, "active_s": battery.active_s,
                            "gap_s": battery.gap_s, "budget_s": battery.budget_s, "rates_hz": list(RATES_HZ),
                            "started_utc": time.time(), "rotation": battery.rotation,
                            "workloads": battery.results}
    worker = _start_worker(battery, battery.events) if battery.names else None
    try:
        if worker is not None:
            ready = _read_msg(worker, 300)
            meta["worker"] = ready
            battery.log(f"worker ready: {ready}")
        for name in battery.names:
            assert worker is not None
            if not battery.fits(name):
                battery.log(f"{name}: skipped, it would overrun the {battery.budget_s:g} s budget")
                battery.results.append({"name": name, "skipped": True})
                continue
            try:
                battery.results.append(_one(battery, name, worker, labels_path, ready))
            except Exception as exc:  # one workload's failure must not cost the others
                battery.log(f"{name}: FAILED in the orchestrator: {type(exc).__name__}: {exc}")
                battery.results.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
                if worker.poll() is not None:
                    break
            _write_meta(battery, meta)
            _pack(battery)
        if worker is not None:
            assert worker.stdin is not None
            worker.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            worker.stdin.flush()
            worker.wait(60)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        _write_meta(battery, meta)
        write_labels_csv([], labels_path)  # the header, even if no workload ran
        _pack(battery)
    failed = [r["name"] for r in battery.results if r.get("error") or r.get("skipped")]
    battery.log(f"done: {len(battery.results)} workloads, failed or skipped: {failed or 'none'}")
    _write_meta(battery, meta)
    _pack(battery)
    return 1 if failed or not battery.names else 0


def _write_meta(battery: Battery, meta: dict[str, Any]) -> None:
    battery.root.mkdir(parents=True, exist_ok=True)
    (battery.root / "battery.json").write_text(json.dumps(_finite_json(meta), indent=1, default=str))
    (battery.root / "battery.log").write_text("\n".join(battery.log_lines) + "\n")


def _stop_recorder(battery: Battery, proc: subprocess.Popen[str], path: Path) -> None:
    """Ask a recorder to close; if it died or hangs, finalise what it left (as `record --recover`)."""
    from phasescope.store.recording import finalize, partial_dir_for

    try:
        assert proc.stdin is not None
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        msg = _read_msg(proc, 60)
        if msg.get("event") != "closed":
            raise RuntimeError(f"recorder said {msg}")
        proc.wait(10)
    except Exception as exc:
        battery.log(f"  recorder for {path.name} failed ({type(exc).__name__}: {exc}; exit {proc.poll()})")
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if partial_dir_for(path).exists():
            finalize(partial_dir_for(path))
            battery.log(f"  recovered {path.name} from its partial directory")


def _samples_line(summary: dict[str, Any] | None) -> str:
    if not summary or "kinds" not in summary:
        return f"samples: {(summary or {}).get('status', 'none')}"
    parts = []
    for kind, k in summary["kinds"].items():
        period = k.get("median_period_s")
        parts.append(f"{kind} {k['samples']}" + (f" every {period:.3g} s" if period else "")
                     + ("" if k["status"] == "ok" else f" ({k['status']})"))
    return "samples: " + ", ".join(parts)


def _one(battery: Battery, name: str, worker: subprocess.Popen[str], labels_path: Path,
         ready: dict[str, Any]) -> dict[str, Any]:
    from phasescope.instrument.labels import write_labels_csv
    from phasescope.store.recording import _atomic_write_json, manifest_path_for, read_manifest

    paths = {rate: battery.root / f"{rate:g}hz" / f"{name}.parquet" for rate in RATES_HZ}
    samples = battery.root / "samples" / f"{name}.samples.parquet"
    procs = {rate: _start_recorder(battery, rate, path, samples if rate == RATES_HZ[0] else None)
             for rate, path in paths.items()}
    for proc in procs.values():
        msg = _read_msg(proc, 120)
        if msg.get("event") != "recording":
            raise RuntimeError(f"recorder did not start: {msg}")
    time.sleep(PRE_IDLE_S)
    assert worker.stdin is not None
    seconds = battery.seconds(name)
    worker.stdin.write(json.dumps({"cmd": "run", "name": name, "seconds": seconds}) + "\n")
    worker.stdin.flush()
    done = _read_msg(worker, seconds + 180)
    # The idle tail; it is also longer than the worker's event flush period, so the hook events of this
    # workload are on disk before labels are read from them.
    time.sleep(max(1.1, battery.gap_s - PRE_IDLE_S))
    for rate, proc in procs.items():
        _stop_recorder(battery, proc, paths[rate])
    result: dict[str, Any] = {"name": name, "label": LABEL_OF[name], "t0": done["t0"], "t1": done["t1"],
                              "info": done["info"], "error": done["error"]}
    for rate, path in paths.items():
        manifest = read_manifest(path)
        if rate == RATES_HZ[0]:
            result["samples"] = manifest.get("nvml_samples")
        manifest["battery"] = {"workload": name, "label": LABEL_OF[name], "about": ABOUT[name],
                               "held": name in HELD, "rate_hz_nominal": rate, "t0": done["t0"],
                               "t1": done["t1"], "info": done["info"], "error": done["error"],
                               "torch": ready.get("torch"), "cuda": ready.get("cuda"),
                               "dry_run": battery.dry_run,
                               "device_dir": battery.device_dir, "rotation_key": battery.rotation.get("key"),
                               "samples": str(samples.relative_to(battery.root))}
        rows, how = _label_rows(battery, battery.events, path, manifest, name, done["t0"], done["t1"], rate)
        manifest["battery"]["label_source"] = how
        _atomic_write_json(manifest_path_for(path), _finite_json(manifest))
        write_labels_csv(rows, labels_path)
        result[f"{rate:g}hz"] = {"rows": manifest["rows"], "rate_hz": manifest["rate_hz"],
                                 "missing_signals": manifest["missing_signals"],
                                 "sampler": manifest.get("sampler"), "label_source": how}
    r1, r10 = result[f"{RATES_HZ[0]:g}hz"], result[f"{RATES_HZ[1]:g}hz"]
    battery.log(f"{name}: {done['t1'] - done['t0']:.1f} s, {done['info']}, error={done['error']}, "
                f"labels: {r1['label_source']}, rows {r1['rows']}/{r10['rows']}, "
                f"missing {r10['missing_signals']}, sampler {r10['sampler']}, "
                f"{_samples_line(result['samples'])}")
    return result


def _nvml_check(battery: Battery) -> None:
    """nvml_check.py first, in a process of its own (a driver call that hangs or crashes there costs only its
    report); into DEV/, so battery.tar.gz carries nvml_check.json back."""
    cmd = [sys.executable, str(Path(__file__).with_name("nvml_check.py")), "--out", str(battery.root)]
    cmd += ["--dry-run"] * battery.dry_run
    try:
        rc: int | str = subprocess.run(cmd, env=_child_env(), timeout=150).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    battery.log(f"nvml_check: exit {rc}, report in {battery.root / 'nvml_check.json'}")


def _plan(battery: Battery, args: argparse.Namespace, names: list[str]) -> None:
    """battery.names and battery.rotation: the --only list as given, or this run's rotation."""
    fixed = STARTUP_EST_S + (0.0 if args.skip_nvml_check else NVML_CHECK_EST_S)
    if names:
        battery.names = names
        battery.rotation = {"key": None, "only": names, "chosen": names}
        battery.log(f"--only: {', '.join(names)}")
        return
    key = args.rotation if args.rotation is not None else int(time.time() // 60)
    represented = represented_seconds(args.data)
    order = rotation_order(NAMES, key, represented)
    chosen = choose_workloads(NAMES, key, represented, battery.budget_s - fixed, battery.cost)
    estimate = fixed + sum(battery.cost(n) for n in chosen)
    battery.names = chosen
    battery.rotation = {
        "key": key, "key_from": "--rotation" if args.rotation is not None else "UTC minute",
        "data": str(args.data), "represented_s": {n: round(represented.get(n, 0.0), 1) for n in order},
        "order": order, "chosen": chosen, "left_out": [n for n in order if n not in chosen],
        "estimate_s": round(estimate, 1)}
    battery.log(f"rotation {key}: chosen {', '.join(chosen) or 'nothing'} (est. {estimate:.0f} s of "
                f"{battery.budget_s:g} s); least represented first: "
                + ", ".join(f"{n} {represented.get(n, 0.0):.0f} s" for n in order[:8]) + " ...")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output folder [default: $OUT]")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, fake NVML: the same code path")
    ap.add_argument("--only", default="", help="comma-separated workload names, run as given (no rotation)")
    ap.add_argument("--rotation", type=int, default=None,
                    help="rotation key: breaks ties between equally represented workloads [the UTC minute]")
    ap.add_argument("--data", type=Path, default=REPO / "data",
                    help="recorded data whose */labels.csv say what is represented already [REPO/data]")
    ap.add_argument("--active-s", type=float, default=None,
                    help=f"seconds per workload [{DEFAULT_ACTIVE_S:g}; dry run 1]; idle ones "
                         f"{IDLE_SHARE:g} of it, not under {MIN_WINDOW_S:g}")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"plan and run within this many seconds from the start [{DEFAULT_BUDGET_S:g}; "
                         "dry run: no limit]")
    ap.add_argument("--gap-s", type=float, default=None, help="idle s between workloads [3.5; dry 1.6]")
    ap.add_argument("--device-dir", default=None, help="device folder name [from the GPU model: h100, h200]")
    ap.add_argument("--work", type=Path, default=None,
                    help="where DEV/ is written [DIR in a dry run, else a temporary folder]")
    ap.add_argument("--skip-nvml-check", action="store_true", help="do not run nvml_check.py first")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--events", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--recorder", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--path", default="", help=argparse.SUPPRESS)
    ap.add_argument("--samples", default="", help=argparse.SUPPRESS)
    ap.add_argument("--probe-gpu", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fake-trace", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    faulthandler.enable()  # a crash in a C library still says where
    if args.worker:
        return _worker_main(args)
    if args.recorder:
        return _recorder_main(args)
    if args.probe_gpu:
        return _probe_main(args)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        ap.error("give --out DIR or set $OUT")
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in LABEL_OF]
    if unknown:
        ap.error(f"unknown workloads {unknown}; expected some of {NAMES}")
    active = args.active_s if args.active_s is not None else (1.0 if args.dry_run else DEFAULT_ACTIVE_S)
    gap = args.gap_s if args.gap_s is not None else (1.6 if args.dry_run else 3.5)
    budget = args.budget_s if args.budget_s is not None else (math.inf if args.dry_run else DEFAULT_BUDGET_S)
    if not (active > 0 and gap >= PRE_IDLE_S and math.isfinite(active + gap) and budget > 0):
        ap.error(f"expected --active-s > 0, --gap-s >= {PRE_IDLE_S} and --budget-s > 0")
    if args.device_dir is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", args.device_dir):
        ap.error("--device-dir: letters, digits, '.', '_' and '-' only")
    work = args.work or (out if args.dry_run else Path(tempfile.mkdtemp(prefix="phasescope-battery-")))
    battery = Battery(out=out, dry_run=args.dry_run, active_s=active, gap_s=gap, names=[], budget_s=budget,
                      work=work)
    gpu_name, why = ("", "") if args.device_dir else _probe_gpu(battery)
    battery.device_dir = args.device_dir or (gpu_slug(gpu_name) if gpu_name else "gpu")
    battery.root.mkdir(parents=True, exist_ok=True)
    battery.log(f"battery v2: GPU {gpu_name or '?'}{f' ({why})' if why else ''} -> {battery.root}, "
                f"{active:g} s per workload + {gap:g} s gap, rates {RATES_HZ} Hz, dry run: {args.dry_run}")
    _plan(battery, args, names)
    if not args.skip_nvml_check:
        _nvml_check(battery)
    return run_battery(battery)


if __name__ == "__main__":
    sys.exit(main())
