"""Serves forwards until SIGTERM or SIGINT arrives, then writes which one to argv[1] and exits 42.

Writes argv[1] + ".ready" once it is serving, so a test knows when to send the signal.
"""

import signal
import sys
import time
from pathlib import Path

import torch
from _common import mlp

out = Path(sys.argv[1])
got: list[int] = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
signal.signal(signal.SIGINT, lambda s, f: got.append(s))
model = mlp().eval()
deadline = time.monotonic() + 30
with torch.no_grad():
    model(torch.randn(1, 64))
    Path(str(out) + ".ready").write_text("ready")
    while not got and time.monotonic() < deadline:
        model(torch.randn(1, 64))
        time.sleep(0.01)
out.write_text(signal.Signals(got[0]).name if got else "timeout")
sys.exit(42 if got else 1)
