"""Train (`train`) or serve (`infer`) the MLP for argv[2] seconds, then exit with code argv[3] (default 0)."""

import sys
import time

import torch
from _common import mlp
from torch import nn

mode, seconds = sys.argv[1], float(sys.argv[2])
code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
end = time.monotonic() + seconds
n = 0
if mode == "train":
    while time.monotonic() < end:
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,))).backward()
        opt.step()
        n += 1
else:
    model.eval()
    with torch.inference_mode():
        while time.monotonic() < end:
            model(torch.randn(16, 64))
            n += 1
print(f"{mode}: {n} iterations")
sys.exit(code)
