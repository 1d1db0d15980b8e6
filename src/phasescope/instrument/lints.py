"""Lints that catch real bugs, each raised only when the hooks saw the bug happen.

- train_mode_inference: forwards served (no backward) with the model in train() mode *and* layers whose
  output depends on the mode (dropout with p > 0, BatchNorm tracking running stats).
- autograd_inference: inference forwards that built an autograd graph (no no_grad / inference_mode).
- eval_mode_training: forwards that were trained on while the model was in eval() mode, again only when it
  has mode-dependent layers (otherwise eval() changes nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phasescope.instrument import events as ev
from phasescope.instrument.timeline import Timeline


def _mib(n: float) -> str:
    """A size a person reads at a glance: 26,624 bytes is "26 KiB", never "0.0 MiB"."""
    if n < 2**20:
        return f"{n / 2**10:.0f} KiB" if n >= 2**10 else f"{n:.0f} bytes"
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def _root_name(roots: list[dict[str, Any]], r: int) -> str:
    return str(roots[r]["name"]) if 0 <= r < len(roots) else f"module #{r}"


def lint(tl: Timeline) -> list[dict[str, Any]]:
    roots: list[dict[str, Any]] = tl.meta.get("roots") or []
    out: list[dict[str, Any]] = []
    inf = tl.inference_mask & ~tl.flag(ev.RAISED)
    sensitive = np.array([bool(roots[r]["mode_sensitive_layers"]) if 0 <= r < len(roots) else False
                          for r in tl.f_root], dtype=bool) if tl.f_root.size else np.zeros(0, bool)
    for r in np.unique(tl.f_root):
        mine = tl.f_root == r
        name = _root_name(roots, int(r))
        layers = ", ".join(roots[r]["mode_sensitive_layers"]) if 0 <= r < len(roots) else "mode-sensitive"
        bad = inf & mine & tl.flag(ev.MODULE_TRAINING) & sensitive
        if bad.any():
            n, of = int(bad.sum()), int((inf & mine).sum())
            out.append({
                "code": "train_mode_inference", "module": name, "count": n,
                "message": f"{n} of {of} inference forwards of {name} ran in train() mode, so its {layers} "
                           f"layers act as in training (random dropout, batch statistics): "
                           f"call model.eval() before serving.",
            })
        bad = inf & mine & tl.flag(ev.GRAD_ENABLED) & tl.flag(ev.HAS_GRAPH)
        if bad.any():
            saved = roots[r].get("saved_bytes") if 0 <= r < len(roots) else None
            cost = (f", keeping about {_mib(saved)} of activations per forward alive for a backward pass "
                    f"that never comes" if saved and saved > 0 else "")
            out.append({
                "code": "autograd_inference", "module": name, "count": int(bad.sum()),
                "wasted_bytes_per_forward": saved if saved and saved > 0 else None,
                "message": f"{int(bad.sum())} inference forwards of {name} ran with autograd enabled{cost}: "
                           f"wrap inference in torch.inference_mode() (or torch.no_grad()).",
            })
        bad = tl.f_trained & mine & ~tl.flag(ev.MODULE_TRAINING) & sensitive
        if bad.any():
            n, of = int(bad.sum()), int((tl.f_trained & mine).sum())
            out.append({
                "code": "eval_mode_training", "module": name, "count": n,
                "message": f"{n} of {of} training forwards of {name} "
                           f"ran in eval() mode, so {layers} do not train (no dropout, frozen BatchNorm "
                           f"statistics): call model.train() before the training loop.",
            })
    return out
