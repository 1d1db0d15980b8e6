"""Tiny transformer LM trained with AdamW on random token IDs for N steps (argv[1], default 8)."""

import sys

import torch
from _common import TinyLM
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
model = TinyLM()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model.train()
for _ in range(steps):
    ids = torch.randint(0, 97, (4, 17))
    logits = model(ids[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"done {steps} steps")
