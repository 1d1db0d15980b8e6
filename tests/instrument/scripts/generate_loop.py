"""Greedy generation, no KV cache: G prompts (argv[1], default 3), K new tokens each (argv[2], default 6)."""

import sys

import torch
from _common import TinyLM

prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 3
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 6
model = TinyLM().eval()
with torch.inference_mode():
    for g in range(prompts):
        ids = torch.randint(0, 97, (2, 5 + 3 * g))  # a different prompt length per request
        for _ in range(new_tokens):
            nxt = model(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
print(f"generated {prompts} x {new_tokens}")
