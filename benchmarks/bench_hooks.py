"""Overhead of phasescope's PyTorch hooks vs plain PyTorch and vs torch.profiler, in one process.

Two workloads on the CPU, single-threaded: a training step of a small transformer LM (~10 ms: forward,
backward, AdamW step) and an inference call of an MLP under inference_mode (~1 ms). Modes: plain, phasescope's
hooks, torch.profiler, and two no-op global module hooks (what torch charges for any global module hook: every
module call takes `_call_impl`'s slow path; phasescope's root slot keeps its global hook out of torch's dict
during root calls, so no module call pays for hooks). `--compare-with FILE` adds another version of
phasescope/instrument/hooks.py as a fifth mode, e.g. the committed one
(`git show HEAD:src/phasescope/instrument/hooks.py > /tmp/old/hooks.py`; with an events.py in the same folder,
`git show HEAD:src/phasescope/instrument/events.py > /tmp/old/events.py`, that copy writes its own event
format), so a change is measured paired, in the same conditions.
Each repetition runs one block of calls per mode, in a shuffled order (interleaved, so
drift and neighbours hit every mode alike); each block starts with one untimed call (after install(), the
hooks' first call hooks the root again, a cost a real run pays once).
Time is this thread's CPU time (`time.thread_time`): torch runs single-threaded here, so the figure is the
work done, not the time other processes on a shared machine took the core away. Per mode we report the median
block (mean time per call); the overhead is the median over repetitions of the paired ratio to plain, and,
as a cross-check, the ratio of the fastest blocks. On a shared machine a few percent of noise remains, so the
script also prints a model of the overhead: the hooks' cost per module call (root and nested, timed on
nn.Identity over many calls) times the module calls each workload makes, over its plain time.
The hooks' one-off FLOP and memory sample is taken during warm-up, as it would be early in a real run.

A mode that followed a root with the global hooks only (no slot, or another version's hook dicts on it) is
named in a warning.
`--floors REPS` instead times the inference call with phasescope's hooks against bare structures: the slot
phasescope uses (a `_compiled_call_impl` that takes the finder out of torch's dict and calls `_call_impl`,
doing nothing else, or also writing one event row), and the hook structure phasescope used before it (a
finder leaving the dict plus the root's own pre and forward hooks, doing nothing, or writing one row), to
split the cost between getting control around the call and the hooks' own work.

    .venv/bin/python benchmarks/bench_hooks.py [--reps 15] [--block 20] [--fine-reps 400]
        [--compare-with FILE] [--floors REPS]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def inference_workload() -> tuple[nn.Module, Callable[[], None]]:
    """The ~1 ms inference call, with its model (the floors hook it themselves)."""
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).eval()
    x = torch.randn(96, 256)

    def call() -> None:
        with torch.inference_mode():
            model(x)

    return model, call


def block(fn: Callable[[], None], n: int) -> float:
    # One untimed call first, in every mode: the hooks' first call after install() re-slots the root (~30 us),
    # a cost a real run pays once, not once per block.
    fn()
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


def fine(name: str, fn: Callable[[], None], reps: int, n: int, rng: random.Random,
         other: Any = None) -> str:
    """Short blocks (1/10 of the coarse ones), many repetitions, modes interleaved in shuffled order: the
    median of per-repetition paired ratios, with its standard error (from the interquartile range), resolves
    differences the coarse blocks cannot on a loaded machine. No profiler here (its start and stop would
    dominate short blocks). Recorders without the background flusher: its work runs on its own thread, outside
    this thread's CPU time, either way."""
    recs: dict[str, Any] = {"phasescope": Recorder(None, flush_s=0)}
    if other is not None:
        recs["compared hooks"] = type(other)(None, flush_s=0)
    for r in recs.values():  # their one FLOP/memory sample happens here, as in measure()
        r.install()
        for _ in range(4):
            fn()
        r.uninstall()
    times: dict[str, list[float]] = {"plain": [], **{m: [] for m in recs}}
    for _ in range(reps):
        modes = list(times)
        rng.shuffle(modes)
        for mode in modes:
            if mode == "plain":
                times[mode].append(block(fn, n))
                continue
            recs[mode].install()
            try:
                times[mode].append(block(fn, n))
            finally:
                recs[mode].uninstall()

    def paired(a: list[float], b: list[float]) -> str:
        r = sorted(x / y for x, y in zip(a, b, strict=True))
        q1, q3 = r[len(r) // 4], r[(3 * len(r)) // 4]
        se = 1.2533 * (q3 - q1) / 1.349 / len(r) ** 0.5  # SE of a median, sigma from the IQR
        return f"{100 * (statistics.median(r) - 1):+.2f}% +- {100 * se:.2f}%"

    out = (f"  fine: {reps} repetitions of {n}-call blocks: phasescope "
           f"{paired(times['phasescope'], times['plain'])} (paired median +- standard error)")
    if other is not None:
        out += (f"; compared hooks {paired(times['compared hooks'], times['plain'])}; phasescope / compared "
                f"{paired(times['phasescope'], times['compared hooks'])}")
    return out


def measure(name: str, fn: Callable[[], None], reps: int, n: int, rec: Recorder,
            other: Any = None, fine_reps: int = 0) -> dict[str, float]:
    for _ in range(3):
        fn()
    for r in (rec, other) if other is not None else (rec,):
        r.install()
        for _ in range(4):  # the hooks' one FLOP/memory sample happens here, as early in a real run
            fn()
        r.uninstall()
    times: dict[str, list[float]] = {"plain": [], "phasescope": [], "torch.profiler": [], "no-op hooks": []}
    if other is not None:
        times["compared hooks"] = []

    def run_mode(mode: str) -> float:
        if mode == "plain":
            return block(fn, n)
        if mode == "no-op hooks":
            remove = _noop_global_hooks()
            try:
                return block(fn, n)
            finally:
                remove()
        if mode in ("phasescope", "compared hooks"):
            r = rec if mode == "phasescope" else other
            r.install()
            try:
                return block(fn, n)
            finally:
                if False in getattr(r, "_hooked", ()):  # a root followed by the global hooks (slower)
                    unhooked.add(mode)
                r.uninstall()
        with profile(activities=[ProfilerActivity.CPU]):
            return block(fn, n)  # the profiler's trace processing at exit is not counted

    unhooked: set[str] = set()
    rng = random.Random(0)
    for _ in range(reps):
        modes = list(times)
        rng.shuffle(modes)
        for mode in modes:
            times[mode].append(run_mode(mode))
    fine_figures = fine(name, fn, fine_reps, max(1, n // 10), rng, other) if fine_reps else ""
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
    print(f"  torch's own cost of two no-op global module hooks (every module call on the slow path): "
          f"{100 * (ratio_noop - 1):+.2f}% (fastest blocks {noop_best:+.2f}%)")
    if other is not None:
        ratio_other = statistics.median(h / p for h, p in zip(times["compared hooks"], plain, strict=True))
        ratio_pair = statistics.median(h / o for h, o in zip(times["phasescope"], times["compared hooks"],
                                                             strict=True))
        print(f"  compared hooks ({other.__class__.__module__}): {med['compared hooks'] * 1e3:.3f} ms, "
              f"overhead {100 * (ratio_other - 1):+.2f}% (fastest blocks "
              f"{100 * (best['compared hooks'] / best['plain'] - 1):+.2f}%); phasescope / compared, paired: "
              f"{100 * (ratio_pair - 1):+.2f}%")
    for mode in sorted(unhooked):  # e.g. hooks that cannot hook a root another version left its dicts on
        print(f"  warning: {mode} followed a root with the global hooks, not its own: not like for like")
    if fine_figures:
        print(fine_figures)
    calls = module_calls(fn)
    root_s, nested_s, torch_root_s, torch_nested_s = per_call_cost(rec)
    model = (root_s + (calls - 1) * nested_s) / med["plain"]
    floor = (torch_root_s + (calls - 1) * torch_nested_s) / med["plain"]
    print(f"  model: {calls} module calls per call/step (1 outermost); hooks cost {root_s * 1e6:.2f} us per "
          f"outermost and {nested_s * 1e6:.2f} us per nested module call -> overhead {100 * model:.2f}%")
    print(f"  for comparison, torch's dispatch of two no-op global module hooks: {torch_root_s * 1e6:.2f} us "
          f"per outermost, {torch_nested_s * 1e6:.2f} us per nested call -> {100 * floor:.2f}%")
    return {"plain": med["plain"], "hooks": ratio_hooks, "profiler": ratio_prof, "noop": ratio_noop,
            "model": model}


def _noop_root_mode(model: nn.Module, rows: list[tuple[float, ...]] | None) -> Callable[[], None]:
    """The hook structure phasescope used before its slot, doing (almost) nothing: a global pre hook that
    leaves torch's dict during the root call, the root's own pre hook and its own always-called forward hook
    (3 Python frames per root call). With `rows`, the pre hook takes the start time and the forward hook
    appends one event row."""
    gdict = torch.nn.modules.module._global_forward_pre_hooks
    now = time.monotonic
    start = [0.0]

    def finder(m: nn.Module, a: object) -> None:
        gdict.pop(gid, None)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(finder)
    gid = handle.id
    hook = gdict[gid]

    def pre(m: nn.Module, a: object) -> None:
        if rows is not None:
            start[0] = now()

    def post(m: nn.Module, a: object, k: object, o: object = None) -> None:
        if rows is not None:
            rows.append((10.0, start[0], 0, 1, 96, 0, 3, now()))
        gdict[gid] = hook

    own = [model.register_forward_pre_hook(pre),
           model.register_forward_hook(post, with_kwargs=True, always_call=True)]

    def remove() -> None:
        for h in own:
            h.remove()
        gdict.pop(gid, None)

    return remove


def _noop_slot(model: nn.Module, rows: list[tuple[float, ...]] | None) -> Callable[[], None]:
    """phasescope's slot with nothing in it: a finder in torch's global dict between calls, taken out by the
    root's `_compiled_call_impl` around its `_call_impl` (with `rows`: start and end times, one row)."""
    gdict = torch.nn.modules.module._global_forward_pre_hooks
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
    gid = handle.id
    finder = gdict[gid]
    call_impl = model._call_impl
    now = time.monotonic

    def slot(*args: Any, **kwargs: Any) -> Any:
        gdict.pop(gid, None)
        t0 = now() if rows is not None else 0.0
        try:
            return call_impl(*args, **kwargs)
        finally:
            if rows is not None:
                rows.append((10.0, t0, 0, 1, 96, 0, 3, now()))
            gdict[gid] = finder

    model.__dict__["_compiled_call_impl"] = slot

    def remove() -> None:
        del model.__dict__["_compiled_call_impl"]
        handle.remove()

    return remove


def floors(reps: int, rng: random.Random) -> None:
    """Inference call only: phasescope's hooks against bare structures (the slot, the old hooks), paired."""
    model, call = inference_workload()
    rec = Recorder(None, flush_s=0)
    rec.install()
    for _ in range(4):
        call()
    rec.uninstall()
    rows: list[tuple[float, ...]] = []

    def hooks() -> Callable[[], None]:
        rec.install()
        return rec.uninstall

    setups: dict[str, Callable[[], Callable[[], None]]] = {
        "plain": lambda: lambda: None,
        "phasescope": hooks,
        "no-op slot": lambda: _noop_slot(model, None),
        "no-op slot + 1 row": lambda: _noop_slot(model, rows),
        "hooks before the slot: 3 no-op frames": lambda: _noop_root_mode(model, None),
        "hooks before the slot: 3 no-op frames + 1 row": lambda: _noop_root_mode(model, rows),
    }
    times: dict[str, list[float]] = {m: [] for m in setups}
    for _ in range(reps):
        modes = list(times)
        rng.shuffle(modes)
        for mode in modes:
            undo = setups[mode]()
            try:
                times[mode].append(block(call, 20))
            finally:
                undo()
    plain = times["plain"]
    print(f"floors, inference call ({reps} repetitions of 20-call blocks, paired median +- standard error):")
    for mode in list(times)[1:]:
        r = sorted(a / b for a, b in zip(times[mode], plain, strict=True))
        q1, q3 = r[len(r) // 4], r[(3 * len(r)) // 4]
        se = 1.2533 * (q3 - q1) / 1.349 / len(r) ** 0.5
        extra = (statistics.median(r) - 1) * statistics.median(plain)
        print(f"  {mode}: {100 * (statistics.median(r) - 1):+.2f}% +- {100 * se:.2f}% "
              f"({extra * 1e6:.1f} us per call)")


def _import(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--compare-with: cannot import {path} as a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _load_recorder(path: Path) -> Any:
    """The Recorder of another hooks.py; an events.py next to it is the event format that copy writes (its
    rows must match the buffer that compacts them), used in place of phasescope's own while it is imported."""
    if not path.is_file():
        raise SystemExit(f"--compare-with: {path} is not a file (expected a copy of hooks.py)")
    events_py = path.with_name("events.py")
    if not events_py.is_file():
        return _import(path, "compared_hooks").Recorder
    import phasescope.instrument as package

    own = package.events
    package.events = _import(events_py, "compared_events")  # what `from ... import events as ev` binds
    try:
        return _import(path, "compared_hooks").Recorder
    finally:
        package.events = own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--block", type=int, default=20, help="training steps per block (inference: 10x)")
    ap.add_argument("--compare-with", type=Path, default=None, metavar="FILE",
                    help="another version of phasescope/instrument/hooks.py, timed as a fifth mode")
    ap.add_argument("--fine-reps", type=int, default=400,
                    help="repetitions of short (1/10) blocks for the paired fine figures (0: none)")
    ap.add_argument("--floors", type=int, default=0, metavar="REPS",
                    help="only time the inference call against bare slot and hook structures (REPS blocks)")
    args = ap.parse_args()
    if args.floors:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        print(f"{_cpu_model()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
        floors(args.floors, random.Random(0))
        return
    other_cls = _load_recorder(args.compare_with) if args.compare_with else None
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"{_cpu_model()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print(f"torch {torch.__version__}, 1 thread, {args.reps} interleaved repetitions, "
          f"{args.block} training steps / {args.block * 10} inference calls per block")
    measure("training step", training_call(), args.reps, args.block, Recorder(None),
            other_cls(None) if other_cls else None, args.fine_reps)
    measure("inference call", inference_workload()[1], args.reps, args.block * 10, Recorder(None),
            other_cls(None) if other_cls else None, args.fine_reps)
    print(f"load average {os.getloadavg()[0]:.1f} at the end (figures from another CPU or load differ: "
          "compare ratios measured in one run)")


def _cpu_model() -> str:
    """The CPU model as /proc/cpuinfo names it (what `lscpu | grep 'Model name'` prints)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
