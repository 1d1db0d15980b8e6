"""Overhead of phasescope's PyTorch hooks vs plain PyTorch and vs torch.profiler, in one process.

Two workloads on the CPU, single-threaded: a training step of a small transformer LM (~10 ms: forward,
backward, AdamW step) and an inference call of an MLP under inference_mode (~1 ms). Modes: plain, phasescope's
hooks, torch.profiler, and two no-op global module hooks (torch's own cost of the hook API phasescope uses:
the floor no hook through it can go below). Each repetition runs one block of calls per mode, in a shuffled
order (interleaved, so drift and neighbours hit every mode alike).
Time is this thread's CPU time (`time.thread_time`): torch runs single-threaded here, so the figure is the
work done, not the time other processes on a shared machine took the core away. Per mode we report the median
block (mean time per call); the overhead is the median over repetitions of the paired ratio to plain, and,
as a cross-check, the ratio of the fastest blocks. On a shared machine a few percent of noise remains, so the
script also prints a model of the overhead: the hooks' cost per module call (root and nested, timed on
nn.Identity over many calls) times the module calls each workload makes, over its plain time.
The hooks' one-off FLOP and memory sample is taken during warm-up, as it would be early in a real run.

    .venv/bin/python benchmarks/bench_hooks.py [--reps 15] [--block 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from phasescope.instrument.hooks import Recorder


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        block = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.blocks(self.tok(ids) + self.pos(torch.arange(t)), mask=mask, is_causal=True))


def training_call() -> Callable[[], None]:
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 512, (4, 33))

    def step() -> None:
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 512), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def inference_call() -> Callable[[], None]:
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).eval()
    x = torch.randn(96, 256)

    def call() -> None:
        with torch.inference_mode():
            model(x)

    return call


def block(fn: Callable[[], None], n: int) -> float:
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n


def _noop_global_hooks() -> Callable[[], None]:
    """The same two global hooks phasescope registers, doing nothing: torch's own cost of having them."""
    mm = torch.nn.modules.module
    pre = mm.register_module_forward_pre_hook(lambda m, a: None)
    post = mm.register_module_forward_hook(lambda m, a, k, o=None: None, with_kwargs=True, always_call=True)

    def remove() -> None:
        pre.remove()
        post.remove()

    return remove


def per_call_cost(rec: Recorder, n: int = 20000) -> tuple[float, float, float, float]:
    """Extra seconds per module call, interleaved, best of 5: (outermost, nested) for the hooks, and the
    part of each that is torch's own dispatch of two no-op global hooks."""
    inner = nn.Identity()
    outer = nn.Sequential(*[nn.Identity() for _ in range(9)])  # 1 root + 9 nested calls
    x = torch.ones(1)

    def timed(m: nn.Module) -> float:
        t = time.thread_time()
        for _ in range(n):
            m(x)
        return (time.thread_time() - t) / n

    root: list[float] = []
    nested: list[float] = []
    t_root: list[float] = []
    t_nested: list[float] = []
    for _ in range(5):
        a, b = timed(inner), timed(outer)
        remove = _noop_global_hooks()
        try:
            e, f = timed(inner), timed(outer)
        finally:
            remove()
        rec.install()
        try:
            c, d = timed(inner), timed(outer)
        finally:
            rec.uninstall()
        root.append(c - a)
        nested.append(((d - b) - (c - a)) / 9)
        t_root.append(e - a)
        t_nested.append(((f - b) - (e - a)) / 9)
    return min(root), min(nested), min(t_root), min(t_nested)


def module_calls(fn: Callable[[], None]) -> int:
    count = [0]

    def pre(m: nn.Module, a: object) -> None:
        count[0] += 1

    h = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        fn()
    finally:
        h.remove()
    return count[0]


def measure(name: str, fn: Callable[[], None], reps: int, n: int, rec: Recorder) -> dict[str, float]:
    for _ in range(3):
        fn()
    rec.install()
    for _ in range(4):  # the hooks' one FLOP/memory sample happens here, as early in a real run
        fn()
    rec.uninstall()
    times: dict[str, list[float]] = {"plain": [], "phasescope": [], "torch.profiler": [], "no-op hooks": []}

    def run_mode(mode: str) -> float:
        if mode == "plain":
            return block(fn, n)
        if mode == "no-op hooks":
            remove = _noop_global_hooks()
            try:
                return block(fn, n)
            finally:
                remove()
        if mode == "phasescope":
            rec.install()
            try:
                return block(fn, n)
            finally:
                rec.uninstall()
        with profile(activities=[ProfilerActivity.CPU]):
            return block(fn, n)  # the profiler's trace processing at exit is not counted

    rng = random.Random(0)
    for _ in range(reps):
        modes = list(times)
        rng.shuffle(modes)
        for mode in modes:
            times[mode].append(run_mode(mode))
    med = {m: statistics.median(v) for m, v in times.items()}
    # Paired ratios per repetition are more robust to drift than a ratio of medians.
    plain = times["plain"]
    ratio_hooks = statistics.median(h / p for h, p in zip(times["phasescope"], plain, strict=True))
    ratio_prof = statistics.median(h / p for h, p in zip(times["torch.profiler"], plain, strict=True))
    ratio_noop = statistics.median(h / p for h, p in zip(times["no-op hooks"], plain, strict=True))
    best = {m: min(v) for m, v in times.items()}
    print(f"{name}: plain {med['plain'] * 1e3:.3f} ms | "
          f"phasescope {med['phasescope'] * 1e3:.3f} ms, overhead {100 * (ratio_hooks - 1):+.2f}% "
          f"(fastest blocks {100 * (best['phasescope'] / best['plain'] - 1):+.2f}%) | "
          f"torch.profiler {med['torch.profiler'] * 1e3:.3f} ms, overhead {100 * (ratio_prof - 1):+.2f}% "
          f"(fastest blocks {100 * (best['torch.profiler'] / best['plain'] - 1):+.2f}%)")
    noop_best = 100 * (best["no-op hooks"] / best["plain"] - 1)
    print(f"  torch's own cost of two no-op global module hooks (the floor of this API): "
          f"{100 * (ratio_noop - 1):+.2f}% (fastest blocks {noop_best:+.2f}%)")
    calls = module_calls(fn)
    root_s, nested_s, torch_root_s, torch_nested_s = per_call_cost(rec)
    model = (root_s + (calls - 1) * nested_s) / med["plain"]
    floor = (torch_root_s + (calls - 1) * torch_nested_s) / med["plain"]
    print(f"  model: {calls} module calls per call/step (1 outermost); hooks cost {root_s * 1e6:.2f} us per "
          f"outermost and {nested_s * 1e6:.2f} us per nested module call -> overhead {100 * model:.2f}%")
    print(f"  of which torch's dispatch of two no-op global module hooks: {torch_root_s * 1e6:.2f} us per "
          f"outermost, {torch_nested_s * 1e6:.2f} us per nested call -> {100 * floor:.2f}% (the floor of "
          f"this API)")
    return {"plain": med["plain"], "hooks": ratio_hooks, "profiler": ratio_prof, "noop": ratio_noop,
            "model": model}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--block", type=int, default=20, help="training steps per block (inference: 10x)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, {args.reps} interleaved repetitions, "
          f"{args.block} training steps / {args.block * 10} inference calls per block")
    measure("training step", training_call(), args.reps, args.block, Recorder(None))
    measure("inference call", inference_call(), args.reps, args.block * 10, Recorder(None))


if __name__ == "__main__":
    main()
