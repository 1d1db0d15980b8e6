"""Adapters import only when their framework is present; without it, one clear ImportError."""

from __future__ import annotations

import importlib
import sys
import types

import pytest


@pytest.mark.parametrize(("module", "blocked", "hint"), [
    ("phasescope.instrument.adapters.lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"),
     "pip install lightning"),
    ("phasescope.instrument.adapters.hf", ("transformers",), "pip install transformers"),
])
def test_guard_without_framework(monkeypatch: pytest.MonkeyPatch, module: str, blocked: tuple[str, ...],
                                 hint: str) -> None:
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=hint):
        importlib.import_module(module)


def test_hf_callback_with_framework_present(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stand-in for transformers' TrainerCallback base (a plain class in the real library too).
    fake = types.ModuleType("transformers")
    fake.TrainerCallback = type("TrainerCallback", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.delitem(sys.modules, "phasescope.instrument.adapters.hf", raising=False)
    mod = importlib.import_module("phasescope.instrument.adapters.hf")
    import torch

    import phasescope.instrument as inst

    cb = mod.PhasescopeTrainerCallback()
    try:
        cb.on_train_begin(None, None, None)
        assert inst.current() is not None
        with torch.no_grad():
            torch.nn.Linear(2, 2)(torch.ones(1, 2))
        cb.on_train_end(None, None, None)
        assert cb.summary is not None and cb.summary["forwards"] == 1
    finally:
        inst.uninstall()
