"""Live (mid-run) KPIs of real CPU loops: a forward whose backward may still come is no inference request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from phasescope.instrument.events import load_events
from phasescope.instrument.hooks import Recorder
from phasescope.instrument.timeline import PENDING_GRACE_S
from phasescope.kpi.run_summary import summarize
from phasescope.live.annotate import INFERENCE_KEYS, HookKpiReader


@pytest.fixture
def rec(tmp_path: Path) -> Iterator[Recorder]:
    torch.manual_seed(0)
    r = Recorder(tmp_path / "events", flush_s=0)
    r.install()
    try:
        yield r
    finally:
        r.uninstall()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _live(rec: Recorder, now: float | None = None) -> dict[str, int]:
    doc = summarize([rec.process_events()], with_peak=False, now=time.time() if now is None else now)
    return {"requests": doc["requests"], "steps": doc["steps"]}


def test_a_training_loop_never_shows_inference_kpis_mid_run(rec: Recorder, tmp_path: Path) -> None:
    reader = HookKpiReader(tmp_path / "events", window_s=3600, every_s=0.0)
    model, loss_fn = _mlp(), nn.CrossEntropyLoss()  # the loss is a root module of its own
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen: list[tuple[str, dict[str, int]]] = []

    def snapshot(tag: str) -> None:
        rec.flush()
        reader.update()
        for kpis in reader.process.values():
            assert not set(kpis) & set(INFERENCE_KEYS), (tag, kpis)
        doc = summarize(load_events(tmp_path / "events"), with_peak=False, now=time.time())
        seen.append((tag, {"requests": doc["requests"], "steps": doc["steps"]}))

    for i in range(4):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        out = model(x)
        snapshot(f"step {i}: forward")
        loss = loss_fn(out, y)
        snapshot(f"step {i}: loss")
        opt.zero_grad()
        loss.backward()
        snapshot(f"step {i}: backward")
        opt.step()
        snapshot(f"step {i}: optimizer step")
    assert reader.process, "the reader saw the training process"
    assert [s for s in seen if s[1]["requests"]] == []
    assert seen[-1][1]["steps"] == 4
    rec.flush()
    final = summarize(load_events(tmp_path / "events"), with_peak=False)  # after the run: nothing pending
    assert (final["requests"], final["steps"]) == (0, 4)


def test_inference_counts_live_at_most_one_request_late(rec: Recorder) -> None:
    model = _mlp().eval()
    with torch.no_grad():  # no graph: no backward can come, each call counts at once
        for _ in range(5):
            model(torch.randn(4, 16))
    assert _live(rec)["requests"] == 5
    for _ in range(3):  # autograd left on by mistake: the newest call waits for the next one
        model(torch.randn(4, 16))
    assert _live(rec)["requests"] == 7
    assert _live(rec, now=time.time() + PENDING_GRACE_S + 1)["requests"] == 8  # or for the grace period
    assert summarize([rec.process_events()], with_peak=False)["requests"] == 8


def test_train_then_eval_counts_exactly_live(rec: Recorder) -> None:
    model, loss_fn = _mlp(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        for _ in range(6):
            model(torch.randn(8, 16))
    assert _live(rec) == {"requests": 6, "steps": 3}
    final = summarize([rec.process_events()], with_peak=False)
    assert (final["requests"], final["steps"]) == (6, 3)
