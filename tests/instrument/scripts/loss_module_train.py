"""The most common training loop, the loss as a module: N steps (argv[1], default 30) of batch 128."""

import sys

import torch
from _common import mlp
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
model = mlp()
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(steps):
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
print(f"done {steps} steps, last loss {loss.item():.3f}")
