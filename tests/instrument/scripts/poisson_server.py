"""A "server": M requests (argv[1], default 30) arriving as a Poisson process at RATE/s (argv[2], 100)."""

import random
import sys
import time

import torch
from _common import mlp

requests = int(sys.argv[1]) if len(sys.argv) > 1 else 30
rate = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
rng = random.Random(7)
model = mlp().eval()
next_arrival = time.monotonic()
with torch.no_grad():
    for _ in range(requests):
        next_arrival += rng.expovariate(rate)
        delay = next_arrival - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        model(torch.randn(1, 64))
print(f"served {requests} requests")
