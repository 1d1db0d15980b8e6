"""Train N steps (argv[1], default 10), then evaluate M batches (argv[2], default 6) in eval() + no_grad."""

import sys

import torch
from _common import mlp
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
evals = int(sys.argv[2]) if len(sys.argv) > 2 else 6
model = mlp(dropout=0.1)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model.train()
for _ in range(steps):
    loss = nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
correct = 0
with torch.no_grad():
    for _ in range(evals):
        correct += int((model(torch.randn(64, 64)).argmax(1) == torch.randint(0, 10, (64,))).sum())
print(f"trained {steps} steps, evaluated {evals} batches")
