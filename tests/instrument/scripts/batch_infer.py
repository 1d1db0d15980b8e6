"""Batch inference: M batches (argv[1], default 20) of 16 through an eval-mode MLP under inference_mode."""

import sys

import torch
from _common import mlp

requests = int(sys.argv[1]) if len(sys.argv) > 1 else 20
model = mlp(dropout=0.2).eval()
with torch.inference_mode():
    for _ in range(requests):
        model(torch.randn(16, 64)).argmax(dim=1)
print(f"served {requests} batches")
