"""The loss curve with no code change: the scalar each backward pass starts from, on real PyTorch (CPU)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from phasescope.instrument import events as ev
from phasescope.instrument.hooks import Recorder
from phasescope.instrument.timeline import Timeline, build
from phasescope.kpi.run_summary import summarize
from phasescope.kpi.training import SERIES_POINTS, step_series
from tests.instrument.test_loop_counts import BATCH, LOOPS, STEPS, _loss_module, _mlp, _xy


def _train(make: Callable[[], tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]], rec: Recorder,
           scaler: torch.amp.GradScaler | None = None) -> list[float]:
    torch.manual_seed(0)
    model, step = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen: list[float] = []
    rec.install()
    try:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = step(model)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            seen.append(loss.item())  # the test's own read (a sync the hooks never make)
    finally:
        rec.uninstall()
    return seen


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_each_loop_records_its_loss_each_step(loop: str) -> None:
    rec = Recorder(None, flush_s=0, count_flops=False)
    seen = _train(LOOPS[loop], rec)
    tl = build(rec.process_events())
    assert tl.l_v.tolist() == pytest.approx(seen, rel=1e-6)
    assert (np.diff(tl.l_t) > 0).all()
    # each loss lies in its own step's window (backward is called after the forward, before the step ends)
    k = np.searchsorted(tl.w_t0, tl.l_t, side="right") - 1
    assert k.tolist() == list(range(STEPS)) and (tl.l_t < tl.w_t1).all()


def test_an_amp_scaled_loss_is_recorded_unscaled() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    rec = Recorder(None, flush_s=0, count_flops=False)
    seen = _train(_loss_module, rec, scaler)
    assert build(rec.process_events()).l_v.tolist() == pytest.approx(seen, rel=1e-6)


def test_only_scalars_count_and_uninstall_puts_torch_back() -> None:
    backward, scale = torch.autograd.backward, torch.amp.GradScaler.scale
    rec = Recorder(None, flush_s=0, count_flops=False)
    rec.install()
    assert torch.autograd.backward is not backward
    try:
        x = torch.randn(4, requires_grad=True)
        (x * 2).backward(torch.ones(4))  # a vector's backward: no loss
        (x.sum() * 3).backward()
    finally:
        rec.uninstall()
    assert torch.autograd.backward is backward and torch.amp.GradScaler.scale is scale
    assert build(rec.process_events()).l_v.tolist() == pytest.approx([float(x.detach().sum() * 3)])
    x.sum().backward()  # after uninstall: not recorded
    assert build(rec.process_events()).l_v.size == 1


def _timeline() -> Timeline:
    rec = Recorder(None, flush_s=0, count_flops=False)
    _train(_loss_module, rec)
    return build(rec.process_events())


def test_step_series_over_time() -> None:
    tl = _timeline()
    s = step_series(tl)
    assert len(s["step_t"]) == len(s["step_time_s"]) == len(s["samples_per_s"]) == STEPS
    t = np.array(s["step_t"], dtype=float)
    assert (np.diff(t) > 0).all() and abs(t[-1] - (tl.w_t1[-1] + tl.wall_offset)) < 1e-6
    dur = np.array(s["step_time_s"], dtype=float)
    assert (dur > 0).all()
    assert np.array(s["samples_per_s"], dtype=float) == pytest.approx(BATCH / dur)
    assert s["loss"] == pytest.approx(tl.l_v.tolist()) and len(s["loss_t"]) == STEPS


def test_step_series_is_thinned_for_long_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import phasescope.kpi.training as training

    monkeypatch.setattr(training, "SERIES_POINTS", 3)
    s = step_series(_timeline())
    assert len(s["step_t"]) == 3 and len(s["loss"]) == 3
    assert SERIES_POINTS >= 1000  # the real bound keeps a chart's shape


def test_the_run_summary_carries_the_series_through_the_event_files(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_s=0, count_flops=False)
    seen = _train(_loss_module, rec)
    rec.flush()
    doc = summarize(ev.load_events(tmp_path), with_peak=False)
    (proc,) = doc["processes"]
    assert proc["series"]["loss"] == pytest.approx(seen, rel=1e-6)
    json.dumps(doc, allow_nan=False)  # plain JSON: a missing figure is null, never NaN


def test_inference_only_processes_carry_no_series() -> None:
    model = _mlp().eval()
    rec = Recorder(None, flush_s=0, count_flops=False)
    rec.install()
    try:
        with torch.no_grad():
            for _ in range(3):
                model(_xy()[0])
    finally:
        rec.uninstall()
    (proc,) = summarize([rec.process_events()], with_peak=False)["processes"]
    assert proc["series"] is None
