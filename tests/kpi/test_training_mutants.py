"""Training KPIs, behaviours a mutation audit found untested: a gap of exactly `idle_gap_s` between steps,
achieved FLOP/s on uneven steps, the autocast dtype, the memory multiple's base and the
one-thread CPU peak's clock. Expected values are worked out by hand from the hand-built logs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.instrument import events as ev
from phasescope.instrument.timeline import build
from phasescope.kpi import training as tk
from tests.kpi.test_training import META, _row, training_log


def test_a_gap_of_exactly_idle_gap_s_still_chains_steps() -> None:
    """10 s of data loading before each 2.5 s step: a gap of 10 s is not *longer* than idle_gap_s = 10, so
    the steps stay one stretch and each step time is 12.5 s (loading included)."""
    tl = build(training_log(3, load_s=10.0))
    assert [s.phase for s in tl.segments] == ["training"]
    k = tk.training_kpis(tl, idle_gap_s=10.0, with_peak=False)
    assert k is not None
    assert k["step_time_p50_s"] == pytest.approx(12.5)
    assert k["data_stall_fraction"] == pytest.approx(20 / 27.5)  # 2 x 10 s of loading in 2.5 + 2 x 12.5


def _with_flop_sample(pe: ev.ProcessEvents, autocast: str | None) -> ev.ProcessEvents:
    rows = pe.rows.tolist()
    t_end0 = next(r[1] for r in rows if r[0] == ev.OPT_END and r[3] == 0)
    rows.append(_row(ev.FLOP_SAMPLE_END, t_end0, 0, 0))
    pe.rows = np.array(rows)
    pe.meta = dict(META, flop_sample={"step": 0, "flops": 7e9, "autocast": autocast})
    return pe


def test_achieved_flops_are_over_the_median_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step periods 2.5, 2.5, 2.5 and 7.5 s (5 s of loading before the last): median 2.5, mean 3.75."""
    pe = _with_flop_sample(training_log(5, loads=[0.0, 0.0, 0.0, 0.0, 5.0]), None)
    monkeypatch.setattr(tk, "cpu_peak_flops", lambda dtype, threads: 1e10)
    k = tk.training_kpis(build(pe))
    assert k is not None
    assert k["step_time_p50_s"] == pytest.approx(2.5) and k["step_time_mean_s"] == pytest.approx(3.75)
    assert k["achieved_flops"] == pytest.approx(7e9 / 2.5)
    assert k["mfu"] == pytest.approx(0.28)


def test_autocast_dtype_wins_over_the_parameters_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 parameters under bfloat16 autocast compute in bfloat16: MFU is against the bf16 peak."""
    pe = _with_flop_sample(training_log(4, load_s=0.0), "bfloat16")
    asked: list[str] = []

    def peak(dtype: str, threads: int | None) -> float:
        asked.append(dtype)
        return 1e10

    monkeypatch.setattr(tk, "cpu_peak_flops", peak)
    k = tk.training_kpis(build(pe))
    assert k is not None
    assert k["compute_dtype"] == "bfloat16"
    assert asked == ["bfloat16"]


def test_memory_multiple_is_over_the_model_not_the_trainable_parameters() -> None:
    """A 40-byte model of which 20 bytes train (20 of gradients, 40 of optimizer state): 80 bytes of training
    state is 2x the model (not 4x the trainable part)."""
    pe = training_log(2)
    pe.meta = dict(META, memory_sample={"param_bytes": 20, "grad_bytes": 20, "optimizer_state_bytes": 40})
    k = tk.training_kpis(build(pe), with_peak=False)
    assert k is not None
    assert k["model_bytes"] == 40 and k["training_state_bytes"] == 80
    assert k["memory_multiple"] == pytest.approx(2.0)


def test_one_thread_cpu_peak_is_timed_on_the_thread_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock here jumps 1000 s per read (a 1024^3 matmul timed on it: 2.1 MFLOP/s); the thread's CPU
    time does not, so the peak is that of a real matmul, far above 0.1 GFLOP/s."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ticks = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(tk, "_wall_clock", lambda: float(next(ticks)))
    peak = tk.cpu_peak_flops("float32", threads=1)
    assert peak is not None and peak > 1e8
