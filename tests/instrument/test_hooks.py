"""The hooks in-process, on real (small) PyTorch code: what counts as a forward, a backward, a step."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from copy import deepcopy
from time import monotonic
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import phasescope
from phasescope.instrument import events as ev
from phasescope.instrument.hooks import Recorder
from phasescope.instrument.timeline import Timeline, build

torch.manual_seed(0)


@contextmanager
def recording(**kw: Any) -> Iterator[Recorder]:
    rec = Recorder(None, **kw)
    rec.install()
    try:
        yield rec
    finally:
        rec.uninstall()


@pytest.fixture(params=["slot", "global"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with roots followed through their slots, and again with the global hooks only (a torch
    without the slot, a scripted root)."""
    if request.param == "global":
        from phasescope.instrument import hooks

        monkeypatch.setattr(hooks, "_HAS_SLOT", False)
    return str(request.param)


def _slot_of(module: nn.Module) -> Any:
    return module.__dict__.get("_compiled_call_impl")


def timeline(rec: Recorder) -> Timeline:
    return build(rec.process_events())


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, n: int, accumulate: int = 1) -> None:
    for _ in range(n):
        opt.zero_grad()
        for _ in range(accumulate):
            model(torch.randn(5, 8)).square().mean().backward()
        opt.step()


def test_only_the_outermost_call_is_a_forward(mode: str) -> None:
    model = mlp()
    with recording() as rec, torch.no_grad():
        model(torch.randn(3, 8))
        model[0](torch.randn(3, 8))  # a submodule called on its own is its own root
    tl = timeline(rec)
    assert tl.f_idx.size == 2
    assert [rec.roots[r]["name"] for r in tl.f_root] == ["Sequential", "Linear"]
    assert tl.f_batch.tolist() == [3, 3]


def test_gradient_accumulation_and_steps() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording() as rec:
        train_steps(model, opt, 3, accumulate=4)
    tl = timeline(rec)
    assert tl.steps == 3
    assert tl.b_t0.size == 12 and tl.f_trained.sum() == 12
    assert [s.phase for s in tl.segments] == ["training"]
    assert tl.segments[0].steps == 3 and tl.segments[0].forwards == 12


def test_one_backward_through_two_forwards() -> None:
    model = mlp()
    with recording() as rec:
        a, b = model(torch.randn(4, 8)), model(torch.randn(4, 8))
        (a - b).square().sum().backward()
    tl = timeline(rec)
    assert tl.f_trained.tolist() == [True, True]
    assert tl.b_t0.size == 1 and tl.b_t1.size == 1 and tl.b_t1[0] >= tl.b_t0[0]


def test_backward_without_optimizer_is_training_with_zero_steps() -> None:
    model = mlp()
    with recording() as rec:
        for _ in range(3):
            loss = model(torch.randn(4, 8)).sum()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.01 * p.grad)  # type: ignore[operator]
                    p.grad = None
    tl = timeline(rec)
    assert tl.steps == 0
    assert [s.phase for s in tl.segments] == ["training"] and tl.segments[0].forwards == 3


def test_closure_optimizer_counts_forwards_inside_step() -> None:
    model = mlp()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    x = torch.randn(6, 8)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    with recording() as rec:
        for _ in range(2):
            opt.step(closure)
    tl = timeline(rec)
    assert tl.steps == 2
    assert tl.f_trained.all() and tl.f_in_window.all()
    assert [s.phase for s in tl.segments] == ["training"]


def test_checkpoint_recompute_is_not_a_new_forward(mode: str) -> None:
    inner = mlp()

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    model = Outer()
    with recording() as rec:
        model(torch.randn(4, 8)).sum().backward()
    tl = timeline(rec)
    assert tl.f_idx.size == 1 and tl.f_trained.tolist() == [True]


def test_exception_in_forward_keeps_depth_right(mode: str) -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    model = nn.Sequential(nn.Linear(8, 8), Boom())
    with recording() as rec, torch.no_grad():
        with pytest.raises(ValueError):
            model(torch.randn(2, 8))
        model[0](torch.randn(2, 8))
    tl = timeline(rec)
    assert tl.f_idx.size == 2
    assert tl.flag(ev.RAISED).tolist() == [True, False]


def test_state_flags_and_token_inputs(mode: str) -> None:
    emb = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    with recording() as rec:
        emb(torch.randint(0, 50, (3, 7)))
        emb.eval()
        with torch.inference_mode():
            emb(torch.randint(0, 50, (2, 5)))
    tl = timeline(rec)
    assert tl.flag(ev.TOKEN_INPUT).all()
    assert tl.f_seq.tolist() == [7, 5] and tl.f_batch.tolist() == [3, 2]
    assert tl.flag(ev.GRAD_ENABLED).tolist() == [True, False]
    assert tl.flag(ev.INFERENCE_MODE).tolist() == [False, True]
    assert tl.flag(ev.MODULE_TRAINING).tolist() == [True, False]
    assert tl.flag(ev.HAS_GRAPH).tolist() == [True, False]


def test_dict_output_and_keyword_inputs(mode: str) -> None:
    class HFLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(30, 4)

        def forward(self, input_ids: torch.Tensor, labels: Any = None) -> dict[str, torch.Tensor]:
            logits = self.emb(input_ids)
            return {"loss": logits.square().mean(), "logits": logits}

    model = HFLike()
    with recording() as rec:
        model(input_ids=torch.randint(0, 30, (2, 9)), labels=None)["loss"].backward()
    tl = timeline(rec)
    assert tl.f_batch.tolist() == [2] and tl.f_seq.tolist() == [9]
    assert tl.f_trained.tolist() == [True]


def test_forwards_from_threads_are_all_counted(mode: str) -> None:
    """Four threads call one model at once: every outermost forward is counted once, none raises."""
    model = mlp().eval()
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def serve() -> None:
        try:
            start.wait()
            with torch.no_grad():
                for _ in range(25):
                    model(torch.randn(1, 8))
        except BaseException as exc:  # a hook error would otherwise only kill the thread
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so calls really overlap
    try:
        with recording() as rec:
            threads = [threading.Thread(target=serve) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors
    tl = timeline(rec)
    assert tl.f_idx.size == 100 and tl.inference_mask.all()
    assert np.unique(tl.f_idx).size == 100
    assert np.all(tl.f_t1 >= tl.f_t0)
    assert not model._forward_hooks


def test_flop_and_memory_sample_on_one_step() -> None:
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    with recording(flop_sample_step=2) as rec:
        train_steps(model, opt, 4)
    assert rec.flop_sample is not None and rec.flop_sample["step"] == 2
    # fwd: 2*5*(8*16+16*4) FLOPs; bwd: weight grads of both layers + input grad of the second only
    # (the input needs no grad), i.e. 2x fwd - 2*5*8*16
    fwd = 2 * 5 * (8 * 16 + 16 * 4)
    assert rec.flop_sample["flops"] == fwd + 2 * fwd - 2 * 5 * 8 * 16
    n_bytes = sum(p.numel() * 4 for p in model.parameters())
    # Adam keeps exp_avg and exp_avg_sq per parameter, plus a scalar step tensor per parameter.
    mem = rec.memory_sample
    assert mem is not None
    assert mem["param_bytes"] == n_bytes and mem["grad_bytes"] == n_bytes
    assert 2 * n_bytes <= mem["optimizer_state_bytes"] <= 2 * n_bytes + 4 * 8
    tl = timeline(rec)
    assert tl.w_flop_sampled.tolist() == [False, False, True, False]


def test_uninstall_stops_recording() -> None:
    model = mlp()
    with recording() as rec, torch.no_grad():
        model(torch.randn(1, 8))
    n = len(rec.buffer)
    with torch.no_grad():
        model(torch.randn(1, 8))
    assert len(rec.buffer) == n


def test_public_api_is_callable_twice() -> None:
    try:
        first = phasescope.instrument()
        second = phasescope.instrument()  # the name now refers to the subpackage, which is callable
        assert first is second
        with torch.no_grad():
            mlp()(torch.randn(2, 8))
        assert phasescope.instrument.summary()["forwards"] == 1  # type: ignore[attr-defined]
    finally:
        phasescope.instrument.uninstall()  # type: ignore[attr-defined]
    assert phasescope.instrument.current() is None  # type: ignore[attr-defined]


def _user_hook(module: nn.Module, args: Any, out: Any) -> None:
    """A user's own picklable forward hook."""


def test_hooked_roots_still_pickle_and_copy_without_phasescope(tmp_path: Any) -> None:
    model = mlp()
    with recording() as rec, torch.no_grad():
        model(torch.randn(2, 8))
        with pytest.raises(RuntimeError):
            model(torch.randn(2, 3))  # shape error inside the forward
        model(torch.randn(2, 8))
        assert _slot_of(model) is not None and not model._forward_hooks  # the root carries its slot only
        model.register_forward_hook(_user_hook)  # the user's hook is kept
        torch.save(model, tmp_path / "model.pt")  # whole-module pickling must not meet a phasescope object
        copy = deepcopy(model)
        assert _slot_of(copy) is None
        copy(torch.randn(2, 8))  # a copy is a new root, found by the global pre hook
        assert _slot_of(copy) not in (None, _slot_of(model))  # with a slot of its own
    assert b"phasescope" not in (tmp_path / "model.pt").read_bytes()
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert list(loaded._forward_hooks.values()) == [_user_hook] and not loaded._forward_pre_hooks
    assert not loaded._forward_hooks_with_kwargs and not loaded._forward_hooks_always_called
    assert _slot_of(loaded) is None
    # uninstall took the slots away; the user's hook stays
    assert _slot_of(model) is None and _slot_of(copy) is None
    assert list(copy._forward_hooks.values()) == [_user_hook] == list(model._forward_hooks.values())
    tl = timeline(rec)
    assert [rec.roots[r]["name"] for r in tl.f_root] == ["Sequential"] * 4
    assert len(set(tl.f_root.tolist())) == 2 and tl.flag(ev.RAISED).tolist() == [False, True, False, False]


def test_module_calling_itself_is_one_forward(mode: str) -> None:
    class Recursive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.returned: list[float] = []  # when the outermost call's forward returns

        def forward(self, x: torch.Tensor, depth: int = 2) -> torch.Tensor:
            x = self.lin(x)
            if not depth:
                return x
            x = self(x, depth - 1)
            if depth == 2:
                self.returned.append(monotonic())
            return x

    plain = Recursive()
    followed = Recursive()  # a root with a hook of its own
    followed.register_forward_hook(_user_hook)
    for model in (plain, followed):
        with recording() as rec, torch.no_grad():
            model(torch.randn(1, 4))
            model(torch.randn(1, 4))
        tl = timeline(rec)
        assert tl.f_idx.size == 2
        assert np.all(tl.f_t1 >= np.array(model.returned))  # ended by the outermost call, not an inner one


def test_root_catching_its_own_inner_call_raising_is_one_forward(mode: str) -> None:
    """The inner call's always-called hook runs on torch's exception path: it must not end the outer call."""

    class Retry(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, fail: bool = False) -> torch.Tensor:
            if fail:
                raise ValueError("inner")
            with suppress(ValueError):
                self(x, True)
            return self.lin(x)

    model = Retry()
    with recording() as rec, torch.no_grad():
        out = model(torch.randn(3, 4))
        model(torch.randn(2, 4))
    tl = timeline(rec)
    assert tl.f_idx.size == 2 and tl.f_batch.tolist() == [3, 2]
    assert not tl.flag(ev.RAISED).any()
    assert out.shape == (3, 4)


class _Probe(nn.Module):
    """Records how many global forward (pre) hooks torch holds while the model runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mm = torch.nn.modules.module
        self.seen.append((len(mm._global_forward_pre_hooks), len(mm._global_forward_hooks)))
        return x


def test_root_mode_leaves_no_global_hook_inside_a_root_call() -> None:
    probe = _Probe()
    model = nn.Sequential(nn.Linear(8, 8), probe)
    mm = torch.nn.modules.module
    with recording() as rec, torch.no_grad():
        for _ in range(3):
            model(torch.randn(2, 8))
            assert len(mm._global_forward_pre_hooks) == 1 and not mm._global_forward_hooks  # the finder
    # The first call is followed by the root's own one-off forward hook (no global hook: the finder leaves
    # torch's dict for it too); after it, the slot: the root and its submodules take torch's fast path.
    assert probe.seen == [(0, 0)] * 3
    assert not model[0]._forward_hooks and not probe._forward_pre_hooks
    assert _slot_of(model) is None and _slot_of(model[0]) is None and _slot_of(probe) is None
    assert not mm._global_forward_pre_hooks and not model._forward_hooks and not model._forward_pre_hooks
    assert timeline(rec).f_idx.size == 3


def test_model_created_after_discovery_is_seen(mode: str) -> None:
    first = mlp()
    opt = torch.optim.SGD(first.parameters(), lr=0.1)
    with recording() as rec:
        train_steps(first, opt, 3)
        second = nn.Sequential(nn.Linear(8, 2))  # e.g. an evaluation model built mid-run
        with torch.no_grad():
            for _ in range(4):
                second(torch.randn(7, 8))
        train_steps(first, opt, 1)
    tl = timeline(rec)
    assert [rec.roots[r]["name"] for r in tl.f_root] == ["Sequential"] * 8
    assert tl.f_root.tolist() == [0] * 3 + [1] * 4 + [0]
    assert tl.f_trained.tolist() == [True] * 3 + [False] * 4 + [True]
    assert tl.f_batch.tolist() == [5] * 3 + [7] * 4 + [5]
    assert [s.phase for s in tl.segments] == ["training", "inference", "training"]


def test_submodule_called_as_a_root_later_is_seen(mode: str) -> None:
    model = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 20))
    with recording() as rec, torch.no_grad():
        for _ in range(3):
            model(torch.randint(0, 20, (2, 5)))
        for _ in range(4):  # a generate-style loop calling only the head
            model[1](torch.randn(2, 8))
        model(torch.randint(0, 20, (2, 5)))  # now the head is nested again: not a forward of its own
    tl = timeline(rec)
    assert [rec.roots[r]["name"] for r in tl.f_root] == ["Sequential"] * 3 + ["Linear"] * 4 + ["Sequential"]
    assert tl.flag(ev.TOKEN_INPUT).tolist() == [True] * 3 + [False] * 4 + [True]


def test_root_with_hooks_of_its_own_gets_a_slot_and_its_hooks_still_run() -> None:
    probe = _Probe()
    model = nn.Sequential(nn.Linear(8, 8), probe)
    seen: list[int] = []
    handle = model.register_forward_hook(lambda m, a, out: seen.append(out.shape[0]))
    with recording() as rec, torch.no_grad():
        for _ in range(3):
            model(torch.randn(3, 8))
            assert not torch.nn.modules.module._global_forward_hooks  # only in while a first call runs
        assert _slot_of(model) is not None
        with pytest.raises(RuntimeError):
            model(torch.randn(3, 5))
        handle.remove()  # the user's handle still works: phasescope did not touch the hook dicts
        model(torch.randn(2, 8))
    assert not model._forward_hooks and not torch.nn.modules.module._global_forward_hooks
    assert seen == [3, 3, 3]
    assert probe.seen == [(0, 0)] * 4
    tl = timeline(rec)
    assert tl.f_batch.tolist() == [3, 3, 3, 3, 2]
    assert tl.flag(ev.RAISED).tolist() == [False] * 3 + [True, False]


def test_second_thread_keeps_the_finder_in() -> None:
    """Once two threads call modules, a new root in one must be found while the other is in a root call."""
    probe = _Probe()
    model = nn.Sequential(nn.Linear(8, 8), probe)
    with recording() as rec, torch.no_grad():
        model(torch.randn(1, 8))
        t = threading.Thread(target=lambda: mlp()(torch.randn(2, 8)))
        t.start()
        t.join()
        model(torch.randn(1, 8))
    assert probe.seen == [(0, 0), (1, 0)]  # one thread: the finder is out in calls; two: it stays in
    tl = timeline(rec)
    assert [rec.roots[r]["name"] for r in tl.f_root] == ["Sequential"] * 3
    assert tl.f_batch.tolist() == [1, 2, 1]


def test_reinstall_hooks_known_roots_again() -> None:
    model = mlp()
    rec = Recorder(None)
    for _ in range(3):
        rec.install()
        try:
            with torch.no_grad():
                model(torch.randn(2, 8))
                model(torch.randn(2, 8))
        finally:
            rec.uninstall()
        assert _slot_of(model) is None and not torch.nn.modules.module._global_forward_pre_hooks
    with torch.no_grad():
        model(torch.randn(2, 8))  # not recorded
    tl = timeline(rec)
    assert tl.f_idx.size == 6 and tl.f_root.tolist() == [0] * 6 and len(rec.roots) == 1


def test_a_root_the_user_compiled_has_its_compiled_call_wrapped_and_given_back() -> None:
    """`Module.compile()` sets the same attribute: the slot calls the user's compiled call, and uninstall()
    puts it back."""
    model = mlp()
    calls: list[int] = []

    def compiled(*args: Any, **kwargs: Any) -> Any:  # stands in for torch.compile(model._call_impl)
        calls.append(1)
        return model._call_impl(*args, **kwargs)

    model._compiled_call_impl = compiled
    probe = _Probe()
    model.append(probe)
    with recording() as rec, torch.no_grad():
        for _ in range(3):
            model(torch.randn(2, 8))
        assert _slot_of(model) not in (None, compiled)
    assert _slot_of(model) is compiled and len(calls) == 3
    assert probe.seen == [(0, 0)] * 3
    tl = timeline(rec)
    assert tl.f_idx.size == 3 and tl.f_root.tolist() == [0] * 3


def test_a_replica_holding_a_copy_of_a_roots_dict_runs_as_itself() -> None:
    """A DataParallel replica is a new module holding a shallow copy of the original's __dict__, slot
    included, called in a worker thread (`parallel_apply`): it must compute with its own submodules and
    parameters, and is a root of its own."""
    model = mlp()
    x = torch.randn(2, 8)
    got: list[torch.Tensor] = []

    def worker(replica: nn.Module) -> None:
        with torch.no_grad():
            got.append(replica(torch.ones(3, 8)))
            got.append(replica(torch.ones(3, 8)))

    with recording() as rec, torch.no_grad():
        model(x)
        model(x)
        replica = model._replicate_for_data_parallel()
        assert _slot_of(replica) is _slot_of(model)
        replica[2] = nn.Linear(16, 4)  # the replica's own last layer
        t = threading.Thread(target=worker, args=(replica,))
        t.start()
        t.join()
        assert _slot_of(replica) not in (None, _slot_of(model))  # the finder gave it its own
        model(x)
    want = replica[2](replica[1](replica[0](torch.ones(3, 8))))
    assert len(got) == 2
    for out in got:
        torch.testing.assert_close(out, want)
    tl = timeline(rec)
    assert tl.f_root.tolist() == [0, 0, 1, 1, 0] and tl.f_batch.tolist() == [2, 2, 3, 3, 2]


def test_a_parametrized_roots_deepcopy_runs_as_itself() -> None:
    """A parametrized module's deepcopy copies its __dict__ with deepcopy (the slot function is copied as
    itself): the copy must use its own weights."""
    from torch.nn.utils import parametrize

    class Scale(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    model = nn.Linear(4, 4)
    parametrize.register_parametrization(model, "weight", Scale())
    x = torch.randn(3, 4)
    with recording() as rec, torch.no_grad():
        model(x)
        model(x)
        twin = deepcopy(model)
        twin.parametrizations.weight.original.add_(1.0)
        got = twin(x)
        base = model(x)
    torch.testing.assert_close(got, x @ (2 * twin.parametrizations.weight.original).T + twin.bias)
    assert not torch.allclose(got, base)
    tl = timeline(rec)
    assert tl.f_root.tolist() == [0, 0, 1, 0]


def test_lock_free_thread_count_is_threadings() -> None:
    """The hot path counts threads as len(threading._limbo) + len(threading._active), without the lock."""
    from phasescope.instrument import hooks

    assert len(hooks._LIMBO) + len(hooks._ACTIVE) == threading.active_count()
    go = threading.Event()
    t = threading.Thread(target=go.wait)
    t.start()
    try:
        assert len(hooks._LIMBO) + len(hooks._ACTIVE) == threading.active_count()
    finally:
        go.set()
        t.join()


class _Waits(nn.Module):
    """Says it is inside its forward, then waits (at most 5 s) to be released."""

    def __init__(self, inside: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.inside, self.release = inside, release

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inside.set()
        self.release.wait(5.0)
        return self.lin(x)


@pytest.mark.parametrize("fallback", [False, True])
def test_new_model_in_one_thread_is_seen_while_another_is_in_a_forward(
        fallback: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finder must stay in torch's dict while a thread started after install() may call modules, even
    before that thread has reached one of phasescope's hooks (also where threading has no _limbo/_active)."""
    if fallback:
        from phasescope.instrument import hooks

        monkeypatch.setattr(hooks, "_LIMBO", hooks._ActiveCount())
        monkeypatch.setattr(hooks, "_ACTIVE", {})
    inside, release = threading.Event(), threading.Event()

    slow, new = _Waits(inside, release), nn.Sequential(nn.Linear(8, 3))
    with recording() as rec, torch.no_grad():
        t = threading.Thread(target=lambda: slow(torch.randn(1, 8)))
        t.start()
        assert inside.wait(1.0)
        for _ in range(3):  # the main thread has called no module yet: no hook of ours saw it
            new(torch.randn(2, 8))
        release.set()
        t.join()
    tl = timeline(rec)
    names = [rec.roots[r]["name"] for r in tl.f_root]
    assert sorted(names) == ["Sequential"] * 3 + ["_Waits"]
    assert sorted(tl.f_batch.tolist()) == [1, 2, 2, 2]


class _Interrupted(nn.Module):
    """Ctrl-C in its forward while `boom` is set (module level: torch.save pickles it)."""

    def __init__(self, boom: bool = True) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.boom = boom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.boom:
            raise KeyboardInterrupt
        return self.lin(x)


def test_keyboard_interrupt_in_a_forward_does_not_stop_recording(mode: str) -> None:
    """torch's always-call hooks catch Exception only. Through the slot, the interrupted call is seen ending
    (a raised row); in global mode no hook runs, so the call is found dead by its frame on the next call and
    leaves no row. Either way new roots are found again."""
    model = _Interrupted(boom=False)
    mm = torch.nn.modules.module
    spans = []  # (before, after) each call that leaves a row, to check each forward's own start and end
    with recording() as rec, torch.no_grad():
        t = monotonic()
        model(torch.randn(1, 8))
        spans.append((t, monotonic()))
        model.boom = True
        t = monotonic()
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(1, 8))
        if mode == "slot":
            spans.append((t, monotonic()))
        model.boom = False
        for _ in range(3):
            t = monotonic()
            model(torch.randn(2, 8))
            spans.append((t, monotonic()))
        assert rec._gid in mm._global_forward_pre_hooks  # the finder is back between root calls
        t = monotonic()
        nn.Linear(8, 2)(torch.randn(3, 8))
        spans.append((t, monotonic()))
    tl = timeline(rec)
    interrupted = [1] if mode == "slot" else []
    assert [rec.roots[r]["name"] for r in tl.f_root] == ["_Interrupted"] * (4 + len(interrupted)) + ["Linear"]
    assert tl.f_batch.tolist() == [1, *interrupted, 2, 2, 2, 3]
    assert tl.flag(ev.RAISED).tolist() == [False, *[True for _ in interrupted], False, False, False, False]
    # The interrupted call's start does not leak into the next call's row.
    before, after = np.array(spans).T
    assert (before <= tl.f_t0).all() and (tl.f_t0 <= tl.f_t1).all() and (tl.f_t1 <= after).all()


def test_forward_hook_called_with_three_arguments_reads_as_raised() -> None:
    model = mlp()
    x = torch.randn(2, 8)
    with recording() as rec, torch.no_grad():
        model(x)
        for _ in range(2):
            rec._find_root(nn.Linear(2, 2), (x,))  # a root's first call begins as torch would begin it
            st = rec._tl.st
            rec._own_end(st.root, (x,), None)  # a torch that passes (module, args, kwargs) when it raised
    with pytest.MonkeyPatch.context() as mp:  # and the global forward hook, for roots with no slot
        from phasescope.instrument import hooks

        mp.setattr(hooks, "_HAS_SLOT", False)
        with recording() as rec2, torch.no_grad():
            rec2._find_root(nn.Linear(2, 2), (x,))
            rec2._global_end(rec2._tl.st.root, (x,), None)
    tl = timeline(rec)
    assert tl.flag(ev.RAISED).tolist() == [False, True, True]
    assert timeline(rec2).flag(ev.RAISED).tolist() == [True]


def test_finder_put_back_during_uninstall_is_removed() -> None:
    model = mlp()
    rec = Recorder(None)
    rec.install()
    with torch.no_grad():
        model(torch.randn(2, 8))

    def late_forward_hook() -> None:  # another thread's root call ending, past its check of _armed
        assert rec._gdict is not None
        rec._gdict[rec._gid] = rec._finder

    rec.flush = late_forward_hook  # type: ignore[method-assign]
    rec.uninstall()
    assert not torch.nn.modules.module._global_forward_pre_hooks


def test_shallow_copy_of_a_root_is_a_root_of_its_own() -> None:
    """copy.copy leaves the slot out (Module.__getstate__): the copy is found and gets its own."""
    import copy

    model = mlp()
    with recording() as rec, torch.no_grad():
        model(torch.randn(1, 8))
        twin = copy.copy(model)
        assert _slot_of(twin) is None
        twin(torch.randn(2, 8))
        twin(torch.randn(3, 8))
        model(torch.randn(4, 8))
        assert _slot_of(twin) not in (None, _slot_of(model))
    tl = timeline(rec)
    assert tl.f_root.tolist() == [0, 1, 1, 0]
    assert tl.f_batch.tolist() == [1, 2, 3, 4]


def test_uninstall_waits_for_the_flush_thread() -> None:
    """install() counts the threads alive as ones that call no module: a flush thread of the previous
    install() still alive then, and gone later, would let one new thread go unseen (its new roots' forwards
    lost while another thread is in a root call)."""
    rec = Recorder(None)
    for _ in range(2):
        rec.install()
        flusher = rec._flusher
        rec.uninstall()
        assert flusher is not None and not flusher.is_alive()


def test_after_a_keyboard_interrupt_a_new_model_is_found_without_a_known_root_call(mode: str) -> None:
    """A notebook: Ctrl-C ends a model's first forward (followed by hooks: none of ours runs on the
    interrupt's path), then the next cell builds and calls a new model. The flush thread sees the dead
    call (its caller frame off the stack) and puts the finder back; the finder drops the call and records
    the new model's calls."""
    mm = torch.nn.modules.module
    with recording(flush_s=0.02) as rec, torch.no_grad():
        mlp()(torch.randn(1, 8))
        with pytest.raises(KeyboardInterrupt):
            _Interrupted()(torch.randn(1, 8))
        # In one thread a first call takes the finder out of torch's dict: the flush thread puts it back.
        deadline = monotonic() + 5.0
        while rec._gid not in mm._global_forward_pre_hooks and monotonic() < deadline:
            threading.Event().wait(0.01)
        fresh = nn.Sequential(nn.Linear(8, 2))
        for _ in range(3):
            fresh(torch.randn(2, 8))
        assert not mm._global_forward_hooks  # the dead call's global forward hook is gone with it
    tl = timeline(rec)
    assert [rec.roots[r]["name"] for r in tl.f_root] == ["Sequential"] * 4
    assert tl.f_batch.tolist() == [1, 2, 2, 2]


def test_a_model_whose_first_forward_was_interrupted_still_saves(tmp_path: Any) -> None:
    """The first call is ended by the root's own one-off forward hook, which a KeyboardInterrupt skips: the
    flush thread takes it off, so `torch.save` never meets it; the model's next call is recorded."""
    model = _Interrupted()
    rec = Recorder(None, flush_s=0.01)
    rec.install()
    try:
        with torch.no_grad(), pytest.raises(KeyboardInterrupt):
            model(torch.randn(1, 8))
        deadline = monotonic() + 5.0
        while model._forward_hooks and monotonic() < deadline:
            threading.Event().wait(0.01)
        assert not model._forward_hooks
        torch.save(model, tmp_path / "model.pt")
        model.boom = False
        with torch.no_grad():
            model(torch.randn(2, 8))
    finally:
        rec.uninstall()
    assert b"phasescope" not in (tmp_path / "model.pt").read_bytes()
    assert timeline(rec).f_batch.tolist() == [2]


@pytest.mark.parametrize("how", ["torch.compile", "Module.compile", "called first", "compiled function",
                                 "compiled training step"])
def test_compiled_models_are_recorded_and_stay_compiled(how: str) -> None:
    """torch.compile (the eager backend: no C++ compiler needed) over hooked models: the results are right,
    every root call leaves one row, and the hooks leave the model's graph whole after its first calls."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, so outputs compare
    want = model(x).detach()
    with recording(count_flops=False) as rec:
        with torch.no_grad():
            if how == "called first":
                model(x)
            run: Any = torch.compile(model, backend="eager")
            if how == "Module.compile":
                model.compile(backend="eager")
                run = model
            elif how == "compiled function":
                run = torch.compile(lambda t: model(t), backend="eager")
        if how == "compiled training step":
            def step(t: torch.Tensor) -> torch.Tensor:
                out = model(t)
                out.square().mean().backward()
                return out

            run = torch.compile(step, backend="eager")
        outs = []
        for i in range(6):
            if i == 3:
                graphs = counters["stats"]["unique_graphs"]
            with torch.no_grad() if how != "compiled training step" else nullcontext():
                outs.append(run(x).detach())
            if how == "compiled training step":
                opt.step()
                opt.zero_grad()
        assert counters["stats"]["unique_graphs"] == graphs  # no recompiles once it runs
    for out in outs:
        torch.testing.assert_close(out, want)
    tl = timeline(rec)
    n = 6 + (how == "called first")
    assert tl.f_idx.size == n and (tl.f_t1 >= tl.f_t0).all() and tl.f_batch.tolist() == [3] * n
    names = {rec.roots[r]["name"] for r in tl.f_root[-6:]}
    assert names == ({"OptimizedModule"} if how in ("torch.compile", "called first") else {"Sequential"})
    if how == "compiled training step":
        assert tl.f_trained.all() and tl.steps == 6
    if how == "Module.compile":  # uninstall() gave the user's compiled call back
        from phasescope.instrument import hooks

        assert _slot_of(model) is not None and not isinstance(_slot_of(model), hooks._Slot)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_records_its_own_calls_while_a_parent_thread_is_in_a_first_call() -> None:
    """At a fork another thread may be inside a root's first call (its one-off end hook on the module, the
    lock maybe held): the child starts clean and records its own calls."""
    inside, release = threading.Event(), threading.Event()

    slow = _Waits(inside, release)
    read, write = os.pipe()
    with recording() as rec, torch.no_grad():
        t = threading.Thread(target=lambda: slow(torch.randn(1, 8)))
        t.start()
        try:
            assert inside.wait(5.0) and slow._forward_hooks  # its first call, with its one-off end hook
            pid = os.fork()
            if pid == 0:  # the child: report, then leave without running the parent's atexit or pytest
                ok = False
                try:
                    clean = not rec._end_hooks and not slow._forward_hooks
                    model = mlp()
                    for _ in range(3):
                        model(torch.randn(2, 8))
                    ok = clean and timeline(rec).f_batch.tolist() == [2, 2, 2]
                finally:
                    os.write(write, b"ok" if ok else b"no")
                    os._exit(0)
            os.close(write)
            answer = os.read(read, 2)
            os.waitpid(pid, 0)
        finally:
            release.set()
            t.join()
    assert answer == b"ok"
    assert timeline(rec).f_batch.tolist() == [1]  # the parent's call, ended in the parent


def test_a_dropped_model_is_freed_while_the_hooks_are_installed() -> None:
    """The slot holds its module weakly: deleting a model frees it at once (sweeps, per-request models,
    DataParallel replicas made every forward)."""
    import weakref

    with recording() as rec, torch.no_grad():
        refs = []
        for _ in range(5):
            model = mlp()
            model(torch.randn(2, 8))
            model(torch.randn(2, 8))
            refs.append(weakref.ref(model))
            del model
        assert all(r() is None for r in refs)  # no gc.collect(): no reference cycle either
    assert timeline(rec).f_idx.size == 10


def test_an_interrupt_inside_the_slots_bookkeeping_does_not_stop_recording() -> None:
    """A Ctrl-C can land anywhere, also in the slot's own bookkeeping before the call begins (simulated: the
    forward counter raises it once): later calls and new models are still recorded."""
    import itertools

    class InterruptOnce:
        def __init__(self) -> None:
            self.ids = itertools.count(100)
            self.armed = True

        def __next__(self) -> int:
            if self.armed:
                self.armed = False
                raise KeyboardInterrupt
            return next(self.ids)

    model = mlp()
    with recording() as rec, torch.no_grad():
        model(torch.randn(1, 8))
        rec._fwd_ids = InterruptOnce()  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(2, 8))
        for _ in range(3):
            model(torch.randn(3, 8))
        mlp()(torch.randn(4, 8))
    assert timeline(rec).f_batch.tolist() == [1, 3, 3, 3, 4]


def test_inputs_without_a_plain_shape_are_recorded_and_never_break_the_call() -> None:
    """A strided nested tensor has no sizes and a jagged one a symbolic length: the row says 0 for what it
    cannot read, the user's call runs as without the hooks, and the log stays readable."""
    lin = nn.Linear(8, 3)
    strided = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    jagged = torch.nested.nested_tensor([torch.randint(0, 9, (3,)), torch.randint(0, 9, (5,))],
                                        layout=torch.jagged)
    emb = nn.Embedding(10, 4)
    with recording() as rec, torch.no_grad():
        for _ in range(2):
            lin(strided)
            emb(jagged)
        lin(torch.randn(5, 8))
    tl = timeline(rec)
    assert tl.f_batch.tolist() == [0, 2, 0, 2, 5] and tl.f_seq.tolist() == [0, 0, 0, 0, 0]
    assert not tl.flag(ev.RAISED).any()


def test_forwards_after_a_failed_backward_and_beside_another_threads_backward_are_recorded() -> None:
    """Recomputation inside backward is told by the autograd node running in this thread: a backward that
    raised, or one running in another thread, does not hide forwards."""
    model = mlp()
    other = mlp()
    with recording() as rec:
        out = model(torch.randn(4, 8)).sum()
        out.backward()
        with pytest.raises(RuntimeError):
            out.backward()  # backward through the graph a second time
        for _ in range(3):
            model(torch.randn(4, 8))
        seen: list[int] = []

        def in_backward(grad: torch.Tensor) -> None:  # runs inside the backward; another thread calls now
            t = threading.Thread(target=lambda: seen.append(other(torch.randn(2, 8)).shape[0]))
            t.start()
            t.join()

        y = model(torch.randn(4, 8))
        y.register_hook(in_backward)
        y.sum().backward()
    assert seen == [2]
    tl = timeline(rec)
    assert tl.f_batch.tolist() == [4, 4, 4, 4, 4, 2]


def test_jit_trace_and_non_strict_export_work_and_their_traces_are_not_forwards() -> None:
    model = mlp()
    x = torch.randn(2, 8)
    with recording() as rec, torch.no_grad():
        model(x)
        traced = torch.jit.trace(model, x, check_trace=False)
        exported = torch.export.export(model, (x,), strict=False)
        traced(torch.randn(3, 8))
        torch.testing.assert_close(exported.module()(x), model(x))
    names = [rec.roots[r]["name"] for r in timeline(rec).f_root]
    # the model twice (before and beside the traces), the traced module once, the exported module once
    assert names.count("Sequential") == 2 and len(names) == 4


def test_fx_symbolic_trace_is_not_recorded(mode: str) -> None:
    """torch.fx calls a model's containers on Proxies (FX quantization, feature extractors): not forwards."""
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 2)))
    with recording() as rec, torch.no_grad():
        model(torch.randn(2, 8))
        graph_module = torch.fx.symbolic_trace(model)
        model(torch.randn(3, 8))
    assert timeline(rec).f_batch.tolist() == [2, 3] and [r["name"] for r in rec.roots] == ["Sequential"]
    torch.testing.assert_close(graph_module(torch.ones(1, 8)), model(torch.ones(1, 8)))


class _ReturnsNone(nn.Module):
    """A module whose forward returns None (a logging or metric-update module)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> None:
        self.lin(x)


def test_a_first_call_is_raised_exactly_when_torch_took_its_exception_path(mode: str) -> None:
    """Whether a first call raised is read from where torch calls the end hook, not guessed: a forward that
    returns None inside the caller's `except` block did not raise; a call whose user forward hook raised
    after the forward returned did."""
    quiet, failing = _ReturnsNone(), mlp()

    def bad(module: nn.Module, args: Any, out: Any) -> None:
        if module is failing:
            raise RuntimeError("user hook failed")

    handle = torch.nn.modules.module.register_module_forward_hook(bad)
    try:
        with recording() as rec, torch.no_grad():
            for _ in range(2):
                try:
                    raise ValueError("primary path failed")
                except ValueError:
                    quiet(torch.randn(3, 8))
                with pytest.raises(RuntimeError, match="user hook failed"):
                    failing(torch.randn(4, 8))
    finally:
        handle.remove()
    tl = timeline(rec)
    assert tl.f_batch.tolist() == [3, 4, 3, 4]
    assert tl.flag(ev.RAISED).tolist() == [False, True, False, True]


def test_an_interrupted_first_call_does_not_leave_its_activation_sample_open() -> None:
    """The one activation-memory sample of a root begins with its first grad-enabled call: when Ctrl-C ends
    that call, the sample is closed unrecorded when the thread's next root call drops it, so that model's
    activations are not put on the interrupted root, and the root is measured on its next forward."""

    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.boom = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x).relu()
            if self.boom:
                raise KeyboardInterrupt
            return y

    model = Boom()
    mm = torch.nn.modules.module
    with recording(count_flops=False, flush_s=0.02) as rec:
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(2, 8))
        deadline = monotonic() + 5.0  # the flush thread puts the finder back (a notebook's next cell)
        while rec._gid not in mm._global_forward_pre_hooks and monotonic() < deadline:
            threading.Event().wait(0.01)
        other = mlp()
        other(torch.randn(64, 8)).sum().backward()  # drops the dead call; its own sample
        model.boom = False
        model(torch.randn(2, 8)).sum().backward()  # measured now
    sizes = {r["name"]: r["saved_bytes"] for r in rec.roots}
    assert sizes["Boom"] is not None and sizes["Boom"] < 1024 < sizes["Sequential"]
    assert rec._saved_ctx is None
