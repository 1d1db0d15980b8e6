"""Serving a model that has dropout. `bug`: never calls model.eval(). `clean`: does."""

import sys

import torch
from _common import mlp

bug = sys.argv[1] == "bug"
model = mlp(dropout=0.3)  # a fresh module is in train() mode
if not bug:
    model.eval()
with torch.inference_mode():
    for _ in range(10):
        model(torch.randn(8, 64))
