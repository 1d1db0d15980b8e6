"""A tiny real PyTorch run under the hooks: `steps` training steps, then 4 evaluation forwards."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from phasescope.instrument.hooks import Recorder


def train_then_eval(events_dir: Path, steps: int) -> None:
    """Record the hooks' events of `steps` SGD steps of a 2-layer MLP, then 4 forwards in eval mode."""
    rec = Recorder(events_dir, flush_s=0)
    rec.install()
    try:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(2, 4))
    finally:
        rec.uninstall()
