"""Two real PyTorch workloads for the demo, each run as its own process:

    python -m phasescope.demo.workloads train --parent PID
    python -m phasescope.demo.workloads infer --parent PID --rate 20

`train` is an endless training loop (MLP, AdamW, synthetic data with a learnable target); `infer` serves a
small model in eval() + inference_mode to requests that arrive as a Poisson process. Both use one thread,
so the machine stays usable, and both exit on their own when the demo that started them is gone.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

IN_FEATURES = 256
HIDDEN = 512
CLASSES = 10
REPORT_EVERY_S = 10.0
MAX_SLEEP_S = 0.5  # the parent check runs at least this often while idle


class _Stopper:
    """Ends the loop on SIGTERM/SIGINT, or when the process that started us has gone (we were re-parented)."""

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self.stopped = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopped = True

    def should_stop(self) -> bool:
        if self.parent is not None and os.getppid() != self.parent:
            self.stopped = True
        return self.stopped


def _torch(device: str) -> Any:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch, torch.device(device)


def _mlp(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def train(stopper: _Stopper, device: str, batch: int, seed: int) -> int:
    torch, dev = _torch(device)
    torch.manual_seed(seed)
    # A fixed random "teacher" makes the labels learnable, so the loss really falls.
    teacher = torch.randn(IN_FEATURES, CLASSES, device=dev)
    model = _mlp(torch).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    step, t_report = 0, time.monotonic()
    print(f"train: pid {os.getpid()} on {dev}, batch {batch}", file=sys.stderr, flush=True)
    while not stopper.should_stop():
        x = torch.randn(batch, IN_FEATURES, device=dev)
        y = (x @ teacher).argmax(dim=1)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        now = time.monotonic()
        if now - t_report >= REPORT_EVERY_S:
            print(f"train: step {step} loss {loss.item():.3f}", file=sys.stderr, flush=True)
            t_report = now
    return 0


def infer(stopper: _Stopper, device: str, rate: float, seed: int) -> int:
    torch, dev = _torch(device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = _mlp(torch).to(dev).eval()
    latencies: list[float] = []
    served, t_report = 0, time.monotonic()
    next_arrival = time.monotonic() + rng.expovariate(rate)
    print(f"infer: pid {os.getpid()} on {dev}, {rate:g} req/s Poisson", file=sys.stderr, flush=True)
    while not stopper.should_stop():
        now = time.monotonic()
        if now < next_arrival:
            time.sleep(min(next_arrival - now, MAX_SLEEP_S))
            continue
        # One request: 1-8 inputs. Latency counts from its arrival, so queueing behind a slow one shows.
        x = torch.randn(rng.randint(1, 8), IN_FEATURES, device=dev)
        with torch.inference_mode():
            model(x).argmax(dim=1)
        done = time.monotonic()
        latencies.append(done - next_arrival)
        served += 1
        next_arrival += rng.expovariate(rate)
        if done - t_report >= REPORT_EVERY_S and latencies:
            latencies.sort()
            p50 = latencies[len(latencies) // 2]
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(f"infer: {served} served, p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms",
                  file=sys.stderr, flush=True)
            latencies.clear()
            t_report = done
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phasescope.demo.workloads")
    parser.add_argument("kind", choices=("train", "infer"))
    parser.add_argument("--parent", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--batch", type=int, default=64, help="training batch size")
    parser.add_argument("--rate", type=float, default=20.0, help="mean inference requests per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nice", type=int, default=0, help="lower our own priority by this much")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.batch <= 0:
        parser.error("--rate and --batch must be positive")
    stopper = _Stopper(args.parent)
    if args.nice > 0 and hasattr(os, "nice"):
        os.nice(args.nice)  # yield to anything interactive on the box
    if args.kind == "train":
        return train(stopper, args.device, args.batch, args.seed)
    return infer(stopper, args.device, args.rate, args.seed)


if __name__ == "__main__":
    sys.exit(main())
