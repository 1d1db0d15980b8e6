"""MLP classifier trained for exactly N optimizer steps (argv[1], default 12) with SGD and a DataLoader."""

import sys

import torch
from _common import mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
x = torch.randn(steps * 32, 64)
y = torch.randint(0, 10, (steps * 32,))
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model.train()
for xb, yb in loader:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
print(f"done {steps} steps, last loss {loss.item():.3f}")
