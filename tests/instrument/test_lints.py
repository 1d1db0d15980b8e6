"""Each lint on hand-built event logs: raised when its bug is there, silent when a condition of it is not
(no mode-sensitive layers, no autograd graph, a forward that raised)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from phasescope.instrument import events as ev
from phasescope.instrument.lints import lint
from phasescope.instrument.timeline import build


def _meta(sensitive: bool) -> dict[str, Any]:
    return {"roots": [{"name": "M", "params": 10, "param_bytes": 40, "dtype": "float32", "device": "cpu",
                       "mode_sensitive_layers": ["Dropout"] if sensitive else [], "saved_bytes": 8}]}


def _fwd(t: float, k: int, flags: int) -> list[float]:
    return [ev.FWD, t, 0, k, 8, 0, float(flags), t + 0.5]


def _serving(flags: int, sensitive: bool, n: int = 5) -> ev.ProcessEvents:
    """`n` forwards that no backward pass reaches (inference)."""
    rows = [_fwd(100.0 + k, k, flags) for k in range(n)]
    return ev.ProcessEvents(1, np.array(rows), 1000.0, _meta(sensitive))


def _training(flags: int, sensitive: bool, n: int = 5) -> ev.ProcessEvents:
    """`n` steps of forward, backward, optimizer step."""
    rows: list[list[float]] = []
    t = 100.0
    for k in range(n):
        rows.append(_fwd(t, k, flags))
        t += 0.5
        rows += [[ev.BWD_BEGIN, t, k, 0, 0, 0, 0, 0], [ev.BWD_FWD, t, k, 0, 0, 0, 0, 0],
                 [ev.BWD_END, t + 0.5, 0, 0, 0, 0, 0, 0]]
        t += 0.5
        rows += [[ev.OPT_BEGIN, t, 0, k, 0, 0, 0, 0], [ev.OPT_END, t + 0.2, 0, k, 0, 0, 0, 0]]
        t += 0.3
    return ev.ProcessEvents(1, np.array(rows), 1000.0, _meta(sensitive))


def _codes(pe: ev.ProcessEvents) -> list[str]:
    return [w["code"] for w in lint(build(pe))]


@pytest.mark.parametrize(("sensitive", "want"), [(True, ["train_mode_inference"]), (False, [])])
def test_train_mode_serving_matters_only_with_mode_sensitive_layers(sensitive: bool, want: list[str]) -> None:
    assert _codes(_serving(ev.MODULE_TRAINING | ev.INFERENCE_MODE, sensitive)) == want


@pytest.mark.parametrize(("sensitive", "want"), [(True, ["eval_mode_training"]), (False, [])])
def test_eval_mode_training_matters_only_with_mode_sensitive_layers(sensitive: bool, want: list[str]) -> None:
    assert _codes(_training(ev.GRAD_ENABLED | ev.HAS_GRAPH, sensitive)) == want
    assert _codes(_training(ev.GRAD_ENABLED | ev.HAS_GRAPH | ev.MODULE_TRAINING, sensitive)) == []


def test_autograd_inference_needs_a_graph_that_was_built() -> None:
    assert _codes(_serving(ev.GRAD_ENABLED | ev.HAS_GRAPH, False)) == ["autograd_inference"]
    # Grad mode on but nothing to differentiate (frozen weights): no graph, so nothing is kept alive.
    assert _codes(_serving(ev.GRAD_ENABLED, False)) == []


def test_forwards_that_raised_are_not_linted() -> None:
    assert _codes(_serving(ev.MODULE_TRAINING | ev.GRAD_ENABLED | ev.HAS_GRAPH | ev.RAISED, True)) == []


def test_train_mode_serving_names_the_layers_in_a_sentence() -> None:
    (warning,) = lint(build(_serving(ev.MODULE_TRAINING | ev.INFERENCE_MODE, True)))
    layers = ", ".join(_meta(True)["roots"][0]["mode_sensitive_layers"])
    assert f"ran in train() mode, so its {layers} layers act as in training" in warning["message"]
