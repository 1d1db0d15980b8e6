"""Timeline, summary and lint rules a mutation audit found untested, on hand-built event logs whose
expected segments and counts are worked out by hand: the live grace period, where segments end, idle gaps
measured from a segment's end, a backward pass without an optimizer step, the order of a multi-process
summary, and the lint messages' per-module counts and unknown activation sizes."""

from __future__ import annotations

from typing import Any

import numpy as np

from phasescope.instrument import events as ev
from phasescope.instrument.hooks import Recorder
from phasescope.instrument.lints import lint
from phasescope.instrument.timeline import build
from phasescope.kpi.run_summary import summarize

WALL = 1000.0  # wall_offset: Unix time = monotonic + WALL
TRAINED = ev.GRAD_ENABLED | ev.MODULE_TRAINING | ev.HAS_GRAPH


def _root(name: str, sensitive: bool = False, saved: Any = 8) -> dict[str, Any]:
    return {"name": name, "params": 10, "param_bytes": 40, "dtype": "float32", "device": "cpu",
            "mode_sensitive_layers": ["Dropout"] if sensitive else [], "saved_bytes": saved}


def _pe(rows: list[list[float]], roots: list[dict[str, Any]] | None = None, pid: int = 1) -> ev.ProcessEvents:
    return ev.ProcessEvents(pid, np.array(rows, float), WALL, {"roots": roots or [_root("M")]})


def _fwd(t0: float, t1: float, idx: int, flags: int, root: int = 0) -> list[float]:
    return [ev.FWD, t0, root, idx, 8, 0, float(flags), t1]


def _step(t_fwd: float, idx: int, step: int) -> list[list[float]]:
    """Forward 1 s, backward 1 s, optimizer step 0.5 s, from `t_fwd`."""
    t = t_fwd
    return [_fwd(t, t + 1, idx, TRAINED),
            [ev.BWD_BEGIN, t + 1, idx, 0, 0, 0, 0, 0], [ev.BWD_FWD, t + 1, idx, 0, 0, 0, 0, 0],
            [ev.BWD_END, t + 2, 0, 0, 0, 0, 0, 0],
            [ev.OPT_BEGIN, t + 2, 0, step, 0, 0, 0, 0], [ev.OPT_END, t + 2.5, 0, step, 0, 0, 0, 0]]


def test_a_graph_forward_waits_longer_than_the_hooks_flush_interval() -> None:
    """Live: a backward pass is written up to one flush (2 s by default) after its forward, so a forward with
    a graph that ended 3 s ago may still be trained (pending); one that ended 6 s ago is settled."""
    assert Recorder(None).flush_s == 2.0
    pe = _pe([_fwd(100.0, 100.5, 0, ev.GRAD_ENABLED | ev.HAS_GRAPH)])
    recent = build(pe, now=WALL + 103.5)
    assert recent.f_pending is not None and recent.f_pending.tolist() == [True]
    assert not recent.inference_mask.any()
    old = build(pe, now=WALL + 106.5)
    assert old.inference_mask.tolist() == [True]


def test_a_segment_ends_with_its_longest_running_forward() -> None:
    """Two requests served at once (threads): 100 .. 110 and 101 .. 102. The segment ends at 110."""
    tl = build(_pe([_fwd(100.0, 110.0, 0, ev.INFERENCE_MODE), _fwd(101.0, 102.0, 1, ev.INFERENCE_MODE)]))
    assert [(s.phase, s.start, s.end, s.forwards) for s in tl.segments] == [("inference", 100.0, 110.0, 2)]


def test_the_idle_gap_is_measured_from_the_end_of_a_segment() -> None:
    """Eight 2.5 s steps back to back (100 .. 120), then requests from 125: a 5 s pause, no idle segment,
    although the training segment started 25 s before the first request."""
    rows = [r for k in range(8) for r in _step(100.0 + 2.5 * k, k, k)]
    rows += [_fwd(125.0 + j, 125.5 + j, 8 + j, ev.INFERENCE_MODE) for j in range(3)]
    tl = build(_pe(rows), idle_gap_s=10.0)
    assert [(s.phase, s.start, s.end) for s in tl.segments] == [("training", 100.0, 120.0),
                                                                 ("inference", 125.0, 127.5)]


def test_a_backward_without_a_step_is_training_until_the_backward_ends() -> None:
    """Forward 100 .. 101, backward 101 .. 105, no optimizer: training from 100 to 105, zero steps."""
    rows = [_fwd(100.0, 101.0, 0, TRAINED), [ev.BWD_BEGIN, 101.0, 0, 0, 0, 0, 0, 0],
            [ev.BWD_FWD, 101.0, 0, 0, 0, 0, 0, 0], [ev.BWD_END, 105.0, 0, 0, 0, 0, 0, 0]]
    tl = build(_pe(rows))
    assert [(s.phase, s.start, s.end, s.steps) for s in tl.segments] == [("training", 100.0, 105.0, 0)]


def test_summary_segments_of_several_processes_are_in_time_order() -> None:
    late = _pe([_fwd(200.0, 201.0, 0, ev.INFERENCE_MODE)], pid=2)
    early = _pe([_fwd(100.0, 101.0, 0, ev.INFERENCE_MODE)], pid=3)
    doc = summarize([late, early], with_peak=False)
    assert [(s["pid"], s["start"]) for s in doc["segments"]] == [(3, WALL + 100.0), (2, WALL + 200.0)]


def test_train_mode_lint_counts_the_modules_own_inference_forwards() -> None:
    """Module A serves 3 requests, 2 of them in train() mode; module B serves 4 in eval(): '2 of 3'."""
    rows = [_fwd(100.0 + j, 100.5 + j, j, ev.INFERENCE_MODE | (ev.MODULE_TRAINING if j < 2 else 0), root=0)
            for j in range(3)]
    rows += [_fwd(110.0 + j, 110.5 + j, 3 + j, ev.INFERENCE_MODE, root=1) for j in range(4)]
    warnings = lint(build(_pe(rows, [_root("A", sensitive=True), _root("B", sensitive=True)])))
    assert [(w["code"], w["module"], w["count"]) for w in warnings] == [("train_mode_inference", "A", 2)]
    assert warnings[0]["message"].startswith("2 of 3 inference forwards of A ran in train() mode")


def test_autograd_lint_without_a_measured_activation_size_quotes_none() -> None:
    """saved_bytes -1: the hooks could not measure it; the lint names no size rather than a negative one."""
    rows = [_fwd(100.0 + j, 100.5 + j, j, ev.GRAD_ENABLED | ev.HAS_GRAPH) for j in range(3)]
    (w,) = lint(build(_pe(rows, [_root("M", saved=-1)])))
    assert w["code"] == "autograd_inference" and w["count"] == 3
    assert w["wasted_bytes_per_forward"] is None
    assert "MiB" not in w["message"]
