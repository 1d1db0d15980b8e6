"""Recording battery: real workloads on one GPU, each recorded by phasescope's NVML source at 1 Hz and 10 Hz.

    python benchmarks/device/battery.py [--out DIR]          # on a GPU; DIR defaults to $OUT
    python benchmarks/device/battery.py --dry-run --out DIR  # same code on the CPU, tiny sizes, fake NVML

One worker process (PyTorch, with phasescope's hooks installed) runs the workloads one after another, told
what to run over a pipe; this process samples the GPU with two `NvmlSource`s at once (1 Hz and 10 Hz) and
writes one recording per workload and rate. Each recording holds ~1.5 s of idle before the workload and
the rest of the gap after it. Labels: the hook segments of the worker (training / inference) clipped to the
workload's window; workloads the hooks cannot see (GEMM, FFT, memcpy, idle) take their declared label; the
gaps are idle. Both rates of one workload share one `run`, so grouped splits never split them.

Output (also packed into DIR/battery.tar.gz after every workload, so a timeout keeps what was done):
    DIR/h200/{1hz,10hz}/<workload>.parquet (+ .manifest.json, .processes.parquet), labels.csv, battery.json,
    battery.log, and first nvml_check.json/.txt (nvml_check.py's NVML report; --skip-nvml-check skips it)
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import platform
import random
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "src") not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, str(REPO / "src"))

# name, declared label, what it is
WORKLOADS: tuple[tuple[str, str, str], ...] = (
    ("idle_released", "idle", "worker holds only its CUDA context"),
    ("train_mlp", "training", "4-layer MLP, AdamW, bf16 autocast"),
    ("train_cnn", "training", "small CNN with BatchNorm, SGD momentum"),
    ("train_gpt_adamw", "training", "GPT-style transformer, AdamW"),
    ("train_gpt_sgd", "training", "GPT-style transformer, SGD"),
    ("train_gpt_ckpt", "training", "GPT-style transformer, AdamW, gradient checkpointing"),
    ("train_gpt_lora", "training", "GPT-style transformer, only LoRA adapters trainable"),
    ("train_small_batch", "training", "GPT-style transformer, batch 1, short sequences"),
    ("infer_batched", "inference", "GPT forward passes at a large batch, inference_mode"),
    ("infer_poisson_low", "inference", "Poisson arrivals, 4 requests/s, prefill + 16 decoded tokens"),
    ("infer_poisson_high", "inference", "Poisson arrivals, 40 requests/s, prefill + 16 decoded tokens"),
    ("infer_generate_kv", "inference", "autoregressive generation with a growing KV cache"),
    ("other_gemm", "other", "bf16 matrix products in a loop"),
    ("other_fft", "other", "torch.fft.fftn on complex tensors in a loop"),
    ("other_memcpy", "other", "device-to-device and pinned host<->device copies"),
    ("other_bursty", "other", "bursts of matrix products with random gaps"),
    ("idle_held", "idle", "a large allocation held, no kernels"),
)
NAMES = [w[0] for w in WORKLOADS]
LABEL_OF = {w[0]: w[1] for w in WORKLOADS}
RATES_HZ = (1.0, 10.0)
PRE_IDLE_S = 1.5
IDLE_SHARE = 0.65


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


FULL = Sizes(d_model=1024, layers=12, heads=16, vocab=32000, seq=512, batch=16, mlp_width=8192,
             mlp_batch=4096,
             img=128, cnn_batch=256, gemm=8192, fft_shape=(32, 1024, 1024), copy_bytes=2 << 30,
             held_bytes=40 << 30, gen_tokens=1536, infer_batch=64)
TINY = Sizes(d_model=64, layers=2, heads=4, vocab=256, seq=32, batch=4, mlp_width=128, mlp_batch=32, img=16,
             cnn_batch=8, gemm=128, fft_shape=(2, 64, 64), copy_bytes=1 << 20, held_bytes=8 << 20,
             gen_tokens=48, infer_batch=4)


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
    nn = torch.nn
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
    with torch.inference_mode():
        while next_arrival < start + seconds:
            now = time.monotonic()
            if now < next_arrival:
                time.sleep(next_arrival - now)
            prompt = torch.randint(0, s.vocab, (1, max(8, s.seq // 2)), device=dev)
            _generate(model, prompt, 15, s)  # 16 tokens: one from the prefill, 15 decoded
            latencies.append(time.monotonic() - next_arrival)  # queueing included, as a client sees it
            next_arrival += rng.expovariate(rate)
    lat = sorted(latencies)
    return {"requests": len(lat), "rate_per_s": rate,
            "p50_s": lat[len(lat) // 2] if lat else None, "p99_s": lat[int(len(lat) * 0.99)] if lat else None}


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


def run_idle_held(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    held = torch.empty(s.held_bytes // 4, device=dev, dtype=torch.float32)
    held[:: max(1, held.numel() // 1024)].zero_()  # touch it so the allocation is real
    _sync(torch, dev)
    time.sleep(seconds)
    del held
    return {"held_bytes": s.held_bytes}


def run_idle_released(torch: Any, dev: Any, s: Sizes, seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {}


RUNNERS: dict[str, Callable[[Any, Any, Sizes, float], dict[str, Any]]] = {
    name: globals()[f"run_{name}"] for name in NAMES
}


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

    def seconds(self, name: str) -> float:
        """Idle workloads need less time than busy ones to show what they are."""
        return self.active_s * (IDLE_SHARE if LABEL_OF[name] == "idle" else 1.0)

    def fits(self, name: str) -> bool:
        return time.monotonic() - self.started + self.seconds(name) + self.gap_s + 3.0 <= self.budget_s

    @property
    def root(self) -> Path:
        return self.out / "h200"

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
    "stop" or end of input arrives on stdin, then closes the recording and says so."""
    from phasescope.recording import RecordingWriter, _atomic_write_json, manifest_path_for
    from phasescope.sampler import Sampler
    from phasescope.sources.nvml import NvmlSource

    close_fake = _install_fake_nvml(Path(args.fake_trace)) if args.fake_trace else (lambda: None)
    source = NvmlSource()
    interval = 1.0 / args.rate
    path = Path(args.path)
    writer = RecordingWriter(path, source_spec="nvml" + (" (fake, dry run)" if args.fake_trace else ""),
                             interval_s=interval, overwrite=True)
    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    _send({"event": "recording", "rate_hz": args.rate})
    stats = Sampler(source, interval).run(writer.write, stop=stop)
    writer.note_errors(source.error_counts())
    manifest: dict[str, Any] = writer.close()
    manifest["sampler"] = {"ticks": stats.ticks, "skipped": stats.skipped, "max_late_s": stats.max_late_s}
    manifest["nvml"] = _finite_json({"static": source.static_info(), "errors": source.error_counts(),
                                     "unsupported_calls": source.unsupported_calls()})
    _atomic_write_json(manifest_path_for(path), manifest)
    source.close()
    close_fake()
    _send({"event": "closed", "rows": manifest["rows"]})
    return 0


def _finite_json(obj: Any) -> Any:
    """NaN (a static fact the device does not report) becomes null: manifests are strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    return obj


def _install_fake_nvml(trace_path: Path) -> Callable[[], None]:
    """Dry run: the fake NVML replays a real trace, one sample per 0.1 s; returns its uninstaller."""
    sys.path.insert(0, str(REPO))
    from tests.fakes.fake_nvml import FakeNvml

    from phasescope.sources.replay import read

    fake = FakeNvml([read(trace_path)[0]], mem_total_bytes=24 << 30, power_limit_w=350.0,
                    energy_from_power=True)
    cm = fake.installed()
    cm.__enter__()
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.1):
            fake.advance()

    threading.Thread(target=tick, daemon=True).start()

    def close() -> None:
        stop.set()
        cm.__exit__(None, None, None)

    return close


def _child_env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _start_recorder(battery: Battery, rate_hz: float, path: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--recorder", "--rate", f"{rate_hz:g}",
           "--path", str(path)]
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
    from phasescope.recording import read_recording

    devices = [tr.device for tr in read_recording(rec_path)]
    rel = str(rec_path.relative_to(battery.root))
    declared = LABEL_OF[name]
    common = {"path": rel, "family": name, "source": "phasescope-battery", "rate_hz": f"{rate_hz:g}",
              "signals": "all", "run": f"h200-{name}", "gpu": devices[0].name if devices else ""}
    hooks: list[dict[str, Any]] = []
    try:
        hooks = label_rows(events, rel, devices, family=name, run=f"h200-{name}", rate_hz=f"{rate_hz:g}",
                           idle_gap_s=2.0)
    except Exception as exc:  # labels from hooks are best effort; the declared label stands
        battery.log(f"  hooks gave no labels for {name}: {type(exc).__name__}: {exc}")
    rows: list[dict[str, Any]] = []
    hook_phases = set()
    for r in hooks:
        a, b = max(float(r["t_from"]), t0), min(float(r["t_to"]), t1)
        if b - a < min(1.0, 0.25 * (t1 - t0)):
            continue
        hook_phases.add(r["label"])
        if r["label"] == declared:
            rows.append({**r, **common, "t_from": f"{a:.3f}", "t_to": f"{b:.3f}",
                         "notes": f"hooks: {r['notes']}"})
    if not rows:
        source = "declared (hooks saw " + (",".join(sorted(hook_phases)) or "nothing") + ")"
        rows.append({**common, "gpu_index": 0, "t_from": f"{t0:.3f}", "t_to": f"{t1:.3f}", "label": declared,
                     "notes": f"declared by the battery; {source}"})
        how = source
    else:
        how = "hooks" + ("" if hook_phases == {declared} else f" (also saw {','.join(sorted(hook_phases))})")
    # The gaps around the workload: the worker holds its context and runs nothing. A 1 s margin lets the
    # GPU's queue drain and its clocks settle before a window counts as idle.
    start, end = float(manifest["start"]), float(manifest["end"])
    for a, b in ((start, t0 - 0.5), (t1 + 1.0, end)):
        if b - a >= 1.0 and name != "idle_released":
            rows.append({**common, "gpu_index": 0, "t_from": f"{a:.3f}", "t_to": f"{b:.3f}", "label": "idle",
                         "family": "battery_gap", "notes": "gap between workloads, worker holds its context"})
    return rows, how


def _pack(battery: Battery) -> None:
    tmp = battery.out / "battery.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(battery.root, arcname="h200")
        tar.add(battery.events, arcname="events")
    tmp.replace(battery.out / "battery.tar.gz")


def run_battery(battery: Battery) -> int:
    from phasescope.instrument.labels import write_labels_csv

    root = battery.root
    for rate in RATES_HZ:
        (root / f"{rate:g}hz").mkdir(parents=True, exist_ok=True)
    labels_path = root / "labels.csv"
    labels_path.unlink(missing_ok=True)
    worker = _start_worker(battery, battery.events)
    meta: dict[str, Any] = {"host": socket.gethostname(), "dry_run": battery.dry_run,
                            "active_s": battery.active_s, "gap_s": battery.gap_s, "rates_hz": list(RATES_HZ),
                            "started_utc": time.time(), "workloads": battery.results}
    try:
        ready = _read_msg(worker, 300)
        meta["worker"] = ready
        battery.log(f"worker ready: {ready}")
        for name in battery.names:
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
        assert worker.stdin is not None
        worker.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        worker.stdin.flush()
        worker.wait(60)
    finally:
        if worker.poll() is None:
            worker.kill()
        _write_meta(battery, meta)
        write_labels_csv([], labels_path)  # the header, even if no workload ran
        _pack(battery)
    failed = [r["name"] for r in battery.results if r.get("error") or r.get("skipped")]
    battery.log(f"done: {len(battery.results)} workloads, failed or skipped: {failed or 'none'}")
    _write_meta(battery, meta)
    _pack(battery)
    return 1 if failed else 0


def _write_meta(battery: Battery, meta: dict[str, Any]) -> None:
    (battery.root / "battery.json").write_text(json.dumps(meta, indent=1, default=str))
    (battery.root / "battery.log").write_text("\n".join(battery.log_lines) + "\n")


def _stop_recorder(battery: Battery, proc: subprocess.Popen[str], path: Path) -> None:
    """Ask a recorder to close; if it died or hangs, finalise what it left (as `record --recover`)."""
    from phasescope.recording import finalize, partial_dir_for

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


def _one(battery: Battery, name: str, worker: subprocess.Popen[str], labels_path: Path,
         ready: dict[str, Any]) -> dict[str, Any]:
    from phasescope.instrument.labels import write_labels_csv
    from phasescope.recording import _atomic_write_json, manifest_path_for, read_manifest

    paths = {rate: battery.root / f"{rate:g}hz" / f"{name}.parquet" for rate in RATES_HZ}
    procs = {rate: _start_recorder(battery, rate, path) for rate, path in paths.items()}
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
        manifest["battery"] = {"workload": name, "label": LABEL_OF[name],
                               "about": next(w[2] for w in WORKLOADS if w[0] == name),
                               "rate_hz_nominal": rate, "t0": done["t0"], "t1": done["t1"],
                               "info": done["info"], "error": done["error"], "torch": ready.get("torch"),
                               "cuda": ready.get("cuda"), "dry_run": battery.dry_run}
        rows, how = _label_rows(battery, battery.events, path, manifest, name, done["t0"], done["t1"], rate)
        manifest["battery"]["label_source"] = how
        _atomic_write_json(manifest_path_for(path), manifest)
        write_labels_csv(rows, labels_path)
        result[f"{rate:g}hz"] = {"rows": manifest["rows"], "rate_hz": manifest["rate_hz"],
                                 "missing_signals": manifest["missing_signals"],
                                 "sampler": manifest.get("sampler"), "label_source": how}
    r1, r10 = result[f"{RATES_HZ[0]:g}hz"], result[f"{RATES_HZ[1]:g}hz"]
    battery.log(f"{name}: {done['t1'] - done['t0']:.1f} s, {done['info']}, error={done['error']}, "
                f"labels: {r1['label_source']}, rows {r1['rows']}/{r10['rows']}, "
                f"missing {r10['missing_signals']}, sampler {r10['sampler']}")
    return result


def _nvml_check(battery: Battery) -> None:
    """nvml_check.py first, in a process of its own (a driver call that hangs or crashes there costs only its
    report); into DIR/h200/, so battery.tar.gz carries nvml_check.json back."""
    cmd = [sys.executable, str(Path(__file__).with_name("nvml_check.py")), "--out", str(battery.root)]
    cmd += ["--dry-run"] * battery.dry_run
    try:
        rc: int | str = subprocess.run(cmd, env=_child_env(), timeout=150).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    battery.log(f"nvml_check: exit {rc}, report in {battery.root / 'nvml_check.json'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output folder [default: $OUT]")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, fake NVML: the same code path")
    ap.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    ap.add_argument("--active-s", type=float, default=None,
                    help="seconds per busy workload, idle ones 0.65 of it [28; dry run 1]")
    ap.add_argument("--budget-s", type=float, default=math.inf,
                    help="skip workloads that would end later than this many seconds after the start")
    ap.add_argument("--gap-s", type=float, default=None, help="idle s between workloads [3.5; dry 1.6]")
    ap.add_argument("--skip-nvml-check", action="store_true", help="do not run nvml_check.py first")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--events", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--recorder", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--path", default="", help=argparse.SUPPRESS)
    ap.add_argument("--fake-trace", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    faulthandler.enable()  # a crash in a C library still says where
    if args.worker:
        return _worker_main(args)
    if args.recorder:
        return _recorder_main(args)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        ap.error("give --out DIR or set $OUT")
    names = [n for n in args.only.split(",") if n] or NAMES
    unknown = [n for n in names if n not in LABEL_OF]
    if unknown:
        ap.error(f"unknown workloads {unknown}; expected some of {NAMES}")
    active = args.active_s if args.active_s is not None else (1.0 if args.dry_run else 28.0)
    gap = args.gap_s if args.gap_s is not None else (1.6 if args.dry_run else 3.5)
    if not (active > 0 and gap >= PRE_IDLE_S and math.isfinite(active + gap)):
        ap.error(f"expected --active-s > 0 and --gap-s >= {PRE_IDLE_S}")
    battery = Battery(out=out, dry_run=args.dry_run, active_s=active, gap_s=gap, names=names,
                      budget_s=args.budget_s)
    est = sum(battery.seconds(n) + gap + 1.5 for n in names)
    battery.log(f"battery: {len(names)} workloads x ({active:g} s + {gap:g} s gap), rates {RATES_HZ} Hz, "
                f"dry run: {args.dry_run}, est. {est / 60:.1f} min")
    if not args.skip_nvml_check:
        _nvml_check(battery)
    return run_battery(battery)


if __name__ == "__main__":
    sys.exit(main())
