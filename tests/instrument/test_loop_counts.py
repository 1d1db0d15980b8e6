"""Steps, trained forwards and samples/s of the common training loops, on real PyTorch (CPU, tiny models).

A loss or metric module, or any module called on a forward's output, is no forward of its own and carries no
batch (issue 19): with `criterion(model(x), y)` the hooks used to count two trained forwards a step and twice
the samples.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from phasescope.instrument import events as ev
from phasescope.instrument.hooks import Recorder
from phasescope.instrument.timeline import Timeline, build
from phasescope.kpi.training import training_kpis
from tests.instrument import runner

STEPS, BATCH = 6, 16


class _WithLoss(nn.Module):
    """A model that computes its loss inside its forward (one root call)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)


class _Output(OrderedDict[str, Any]):
    """Stands in for Hugging Face's ModelOutput (an OrderedDict subclass holding `loss` and `logits`, read as
    attributes too)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _HFStyle(nn.Module):
    """Returns `outputs.loss` and `outputs.logits` when given labels, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> _Output:
        logits = self.head(self.emb(input_ids))
        return _Output(loss=F.cross_entropy(logits.flatten(0, 1), labels.flatten()), logits=logits)


class _LightningStyle(nn.Module):
    """A LightningModule's shape: the loss module is a submodule, called from `training_step` on the
    model's output."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return self.criterion(self(x), y)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _xy() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(BATCH, 8), torch.randint(0, 4, (BATCH,))


def _loss_module() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    criterion = nn.CrossEntropyLoss()

    def step(model: nn.Module) -> torch.Tensor:
        x, y = _xy()
        return criterion(model(x), y)
    return _mlp(), step


def _functional() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    def step(model: nn.Module) -> torch.Tensor:
        x, y = _xy()
        return F.cross_entropy(model(x), y)
    return _mlp(), step


def _loss_in_forward() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    return _WithLoss(), lambda model: model(*_xy())


def _hf_style() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    def step(model: nn.Module) -> torch.Tensor:
        ids = torch.randint(0, 32, (BATCH, 5))
        outputs = model(input_ids=ids, labels=ids)
        return outputs.loss
    return _HFStyle(), step


def _lightning_style() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    model = _LightningStyle()
    return model, lambda m: model.training_step(_xy())


def _loss_module_with_metric() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """A loss module, then a stateless "metric" module on the detached output (no graph there: the
    stateless rule)."""
    criterion, metric = nn.CrossEntropyLoss(), nn.Softmax(dim=-1)

    def step(model: nn.Module) -> torch.Tensor:
        x, y = _xy()
        out = model(x)
        metric(out.detach())
        return criterion(out, y)
    return _mlp(), step


LOOPS = {"loss_module": _loss_module, "functional_loss": _functional, "loss_in_forward": _loss_in_forward,
         "hugging_face_outputs_loss": _hf_style, "lightning_training_step": _lightning_style,
         "loss_module_and_metric": _loss_module_with_metric}


def _record(make: Callable[[], tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]]) -> Timeline:
    torch.manual_seed(0)
    model, step = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(None, flush_s=0, count_flops=False)
    rec.install()
    try:
        for _ in range(STEPS):
            opt.zero_grad()
            step(model).backward()
            opt.step()
    finally:
        rec.uninstall()
    return build(rec.process_events())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_each_loop_counts_one_trained_forward_and_one_batch_a_step(loop: str) -> None:
    tl = _record(LOOPS[loop])
    k = training_kpis(tl, with_peak=False)
    assert k is not None
    assert k["steps"] == STEPS
    assert k["trained_forwards"] == STEPS
    assert k["samples"] == STEPS * BATCH
    assert k["samples_per_s"] == pytest.approx(STEPS * BATCH / k["time_s"])
    assert [s.phase for s in tl.segments] == ["training"]  # the loss call is no inference request either
    assert tl.segments[0].forwards == STEPS


def test_loss_module_counts_once_with_global_hooks_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Roots followed by the global hooks (a torch without the slot, a scripted root) end in the same row."""
    from phasescope.instrument import hooks

    monkeypatch.setattr(hooks, "_HAS_SLOT", False)
    k = training_kpis(_record(_loss_module), with_peak=False)
    assert k is not None and k["trained_forwards"] == STEPS and k["samples"] == STEPS * BATCH


def test_loss_module_calls_are_work_not_forwards() -> None:
    """The loss module's calls stay in the log (flagged DOWNSTREAM) and count as busy time, not stall."""
    tl = _record(_loss_module)
    assert tl.x_t0.size == STEPS and (tl.x_t1 >= tl.x_t0).all()
    k = training_kpis(tl, with_peak=False)
    assert k is not None and k["data_stall_fraction"] is not None
    # every loss call lies inside its step window
    win = ((tl.w_t0[:, None] <= tl.x_t0[None, :]) & (tl.x_t1[None, :] <= tl.w_t1[:, None])).any(axis=0)
    assert win.all()


def test_metric_module_in_evaluation_is_not_an_inference_request() -> None:
    """Under no_grad there is no graph to follow: a stateless module on the output is still no request."""
    model, metric = _mlp(), nn.Softmax(dim=-1)
    model.eval()
    rec = Recorder(None, flush_s=0, count_flops=False)
    rec.install()
    try:
        with torch.no_grad():
            for _ in range(4):
                metric(model(torch.randn(BATCH, 8)))
    finally:
        rec.uninstall()
    tl = build(rec.process_events())
    assert int(tl.inference_mask.sum()) == 4 and tl.f_batch.tolist() == [BATCH] * 4
    assert tl.x_t0.size == 4
    assert [r["stateless"] for r in rec.roots] == [False, True]


def test_a_quantized_model_without_parameters_is_still_a_model() -> None:
    """Dynamic quantization keeps the weights as packed state, not parameters: its calls stay forwards."""
    quantize = getattr(torch.ao.quantization, "quantize_dynamic", None)
    if quantize is None:
        pytest.skip("this torch has no eager dynamic quantization")
    with warnings.catch_warnings():  # its deprecation warnings vary across torch versions
        warnings.simplefilter("ignore")
        q = quantize(_mlp().eval(), {nn.Linear}, dtype=torch.qint8)
    assert next(q.parameters(), None) is None
    rec = Recorder(None, flush_s=0, count_flops=False)
    rec.install()
    try:
        with torch.no_grad():
            for _ in range(3):
                q(torch.randn(BATCH, 8))
    finally:
        rec.uninstall()
    tl = build(rec.process_events())
    assert tl.f_idx.size == 3 and tl.x_t0.size == 0
    assert not (tl.f_flags & ev.DOWNSTREAM).any()



def test_phasescope_run_counts_a_loss_module_loop_once(tmp_path: Path) -> None:
    """The loop of issue 19 end to end under `phasescope run`: 30 steps of batch 128, one trained forward and
    128 samples a step (it read 60 forwards and twice the samples/s)."""
    env = runner.run_env(tmp_path / "cache")
    proc, doc = runner.phasescope_run(tmp_path, env, "loss_module_train.py", "30")
    assert proc.returncode == 0, proc.stderr
    (p,) = doc["processes"]
    t = p["training"]
    assert t["steps"] == 30 and t["trained_forwards"] == 30 and t["backward_passes"] == 30
    assert t["samples"] == 30 * 128
    assert t["samples_per_s"] == pytest.approx(30 * 128 / t["time_s"])
    assert doc["requests"] == 0  # the loss module's calls are no inference requests either
