"""Shared bits of the workload scripts: small, seeded, single-threaded (the CI box has 2 shared cores)."""

from __future__ import annotations

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def mlp(dropout: float = 0.0) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(64, 128), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Linear(128, 10)]
    return nn.Sequential(*layers)


class TinyLM(nn.Module):
    """A two-layer causal transformer language model over a 97-token vocabulary."""

    def __init__(self, vocab: int = 97, dim: int = 32, layers: int = 2, max_len: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        block = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.head(self.blocks(h, mask=mask, is_causal=True))
