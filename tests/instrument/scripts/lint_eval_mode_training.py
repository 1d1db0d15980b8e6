"""Training a model that has dropout. `bug`: the model was left in eval() mode. `clean`: model.train()."""

import sys

import torch
from _common import mlp
from torch import nn

bug = sys.argv[1] == "bug"
model = mlp(dropout=0.3)
model.eval()  # e.g. after a validation pass
if not bug:
    model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    loss = nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
