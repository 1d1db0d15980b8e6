"""Inference loop. `bug`: autograd left on (no no_grad / inference_mode). `clean`: under inference_mode."""

import contextlib
import sys

import torch
from _common import mlp

bug = sys.argv[1] == "bug"
model = mlp().eval()
ctx = contextlib.nullcontext() if bug else torch.inference_mode()
outputs = []
with ctx:
    for _ in range(10):
        outputs.append(model(torch.randn(256, 64)).softmax(dim=1))
