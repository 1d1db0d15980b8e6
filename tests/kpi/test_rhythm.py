"""Telemetry-only KPIs (kpi/rhythm.py): exact on a synthetic rhythm, and on real traces with a known period
(energy-inference generation loops), abstaining where the true period is too short to be seen (data/h200)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from phasescope.cli import main
from phasescope.errors import InputError
from phasescope.kpi import rhythm
from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay import read

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "data" / "h200"
LLAMA_V100 = "energy-inference/stats/e2dc-raw-stats/llama2-7b/2024-03-29/08-43-09/nvidia-smi.csv"
LLAMA_V100_RESULTS = "energy-inference/plots/input-test/raw_stats/Llama-2-7b-chat-hf-palmetto-v100-1.csv"


def _nvml_like(period: float, seconds: float = 240.0, rate: float = 10.0, refresh: float = 0.2,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step rhythm as NVML reports it: busy 60 % of each period, utilisation averaged over each refresh
    interval and held between refreshes, power following it with noise; polled at `rate` (a value changes
    only at a refresh)."""
    rng = np.random.default_rng(seed)
    fine = np.arange(0.0, seconds, 0.001)
    busy = ((fine % period) < 0.6 * period).astype(float)
    t = np.arange(0.0, seconds, 1.0 / rate)
    last_refresh = np.floor(t / refresh) * refresh
    idx = np.searchsorted(fine, last_refresh)
    width = int(refresh / 0.001)
    csum = np.concatenate(([0.0], np.cumsum(busy)))
    lo = np.maximum(idx - width, 0)
    util = (csum[idx] - csum[lo]) / np.maximum(idx - lo, 1)
    slot = np.round(last_refresh / refresh).astype(int)  # noise too changes only at a refresh
    util = np.round(np.clip(util + rng.normal(0, 0.03, slot.max() + 1)[slot], 0, 1), 2)
    power = 150.0 + 400.0 * util + rng.normal(0, 5.0, slot.max() + 1)[slot]
    return t, util, power


@pytest.mark.parametrize("period", [0.9, 2.5, 6.3, 17.0])
def test_step_period_of_a_synthetic_rhythm_is_exact(period: float) -> None:
    t, u, p = _nvml_like(period)
    figs = rhythm.training_figures(t, u, p)
    assert figs["step_period_s"].value == pytest.approx(period, rel=0.01)
    assert figs["steps_per_hour"].value == pytest.approx(3600.0 / period, rel=0.01)
    assert figs["step_period_s"].confidence is not None and figs["step_period_s"].confidence > 0.5
    assert figs["stall_fraction"].value == pytest.approx(0.4, abs=0.05)  # idle 40 % of each period


def test_a_rhythm_across_a_gap_is_still_found_and_not_bridged() -> None:
    t, u, p = _nvml_like(3.1)
    keep = (t < 100) | (t > 130)  # 30 s without samples: two stretches
    r = rhythm.rhythm(t[keep], {"gpu_util": u[keep], "power": p[keep]})
    assert r.period_s == pytest.approx(3.1, rel=0.01)


def test_no_rhythm_in_steady_work_says_why() -> None:
    rng = np.random.default_rng(1)
    t = np.arange(0.0, 200.0, 0.1)
    u = np.round(np.clip(0.97 + rng.normal(0, 0.01, t.size), 0, 1), 2)
    p = 650 + rng.normal(0, 4, t.size)
    figs = rhythm.training_figures(t, u, p)
    assert figs["step_period_s"].value is None and figs["steps_per_hour"].value is None
    assert "no autocorrelation peak" in (figs["step_period_s"].reason or "")


def test_a_period_faster_than_the_refresh_is_not_reported() -> None:
    """50 ms steps under a 200 ms refresh: averaged away; nothing aliased is reported as the period."""
    t, u, p = _nvml_like(0.05, refresh=0.2)
    figs = rhythm.training_figures(t, u, p)
    assert figs["step_period_s"].value is None
    assert figs["shortest_visible_period_s"].value == pytest.approx(0.4, abs=0.11)


def test_bad_inputs_name_what_and_where() -> None:
    t = np.array([0.0, 1.0, 1.0, 2.0])
    with pytest.raises(InputError, match=r"time column at sample 2: expected strictly increasing"):
        rhythm.rhythm(t, {"gpu_util": np.zeros(4)})
    with pytest.raises(InputError, match=r"signal 'power': expected a 1-D array as long as the time column"):
        rhythm.training_figures(np.arange(4.0), np.zeros(4), np.zeros(3))


def _h200(rate: str, label: str) -> list[tuple[str, Trace, float, float, int]]:
    out = []
    with (H200 / "labels.csv").open() as f:
        for row in csv.DictReader(f):
            if row["path"].startswith(rate) and row["label"] == label:
                path = H200 / row["path"]
                info = json.loads(Path(f"{path}.manifest.json").read_text())["battery"]["info"]
                out.append((row["family"], read(str(path), "auto")[0], float(row["t_from"]),
                            float(row["t_to"]), int(info.get("steps") or 0)))
    return out


def test_h200_training_steps_are_too_fast_to_see_and_none_is_made_up() -> None:
    """Every H200 training run steps in 11-55 ms (hooks), far under two NVML refreshes: the estimator must
    abstain on all of them, and say the shortest period it could have seen."""
    runs = _h200("10hz", "training")
    assert len(runs) == 7
    for family, trace, a, b, steps in runs:
        k = rhythm.trace_kpis(trace, "training", [(a, b)])
        true_period = (b - a) / steps
        shortest = k["shortest_visible_period_s"]["value"]
        assert true_period < shortest, family
        assert k["step_period_s"]["value"] is None, family
        assert "cannot be seen" in k["step_period_s"]["reason"]


def test_h200_stall_share_reads_launch_bound_small_batches() -> None:
    """Batch-1 GPT training leaves the GPU without a kernel two thirds of the time; the MLP keeps it busy."""
    stall = {fam: rhythm.trace_kpis(tr, "training", [(a, b)])["stall_fraction"]["value"]
             for fam, tr, a, b, _ in _h200("10hz", "training")}
    assert stall["train_small_batch"] > 0.6
    assert stall["train_mlp"] < 0.05 and stall["train_cnn"] < 0.05


def test_h200_inference_busy_bursts_and_saturation() -> None:
    k = {fam: rhythm.trace_kpis(tr, "inference", [(a, b)]) for fam, tr, a, b, _ in _h200("10hz", "inference")}
    batched, low, high = k["infer_batched"], k["infer_poisson_low"], k["infer_poisson_high"]
    assert batched["saturated"]["value"] is True and batched["busy_fraction"]["value"] > 0.95
    # 4 requests/s of ~80 ms each: short bursts about once a second, the GPU mostly idle
    assert low["saturated"]["value"] is False and low["busy_fraction"]["value"] < 0.1
    assert 0.3 < low["burst_rate_per_s"]["value"] < 4.0 and low["burst_mean_s"]["value"] < 1.0
    # 40 requests/s queue up in the server (p50 11 s), yet the GPU has head-room: not saturated
    assert high["saturated"]["value"] is False and high["busy_fraction"]["value"] < 0.5
    for fig in (batched["sm_active"], batched["tensor_active"], batched["dram_active"]):
        assert 0 < fig["value"] <= 1 and "proxy for MFU" in fig["method"]


def test_known_generation_loop_period_on_a_real_v100_log(shared_data: Path) -> None:
    """Llama-2-7B batched generation on a V100: its results CSV logs every iteration's start (Unix time);
    the nvidia-smi log is in local time (UTC-4). The loop period comes out within 1 % for every prompt whose
    iterations ran back to back."""
    trace = read(str(shared_data / LLAMA_V100), "auto")[0]
    starts: dict[str, list[float]] = {}
    with (shared_data / LLAMA_V100_RESULTS).open() as f:
        for rec in csv.DictReader(f):
            if rec["Phase"].startswith("start-inference-") and not rec["Phase"].endswith("-0"):
                starts.setdefault(rec["Phase"].split("-")[2], []).append(float(rec["Timestamp"]) - 4 * 3600)
    checked = 0
    for prompt in ("A", "B", "C", "D"):
        s = sorted(starts[prompt])
        true_period = (s[-1] - s[0]) / (len(s) - 1)
        k = rhythm.trace_kpis(trace, "training", [(s[0], s[-1] + true_period)])
        assert k["step_period_s"]["value"] == pytest.approx(true_period, rel=0.01), prompt
        checked += 1
    assert checked == 4
    assert "sm_active" not in k  # nvidia-smi has no GPM fields: no activity figure is made up


def test_classify_json_carries_kpis_per_device(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PHASESCOPE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    code = main(["classify", "--json", str(H200 / "10hz" / "infer_poisson_low.parquet")])
    out, err = capsys.readouterr()
    assert code == 0, err
    (obj,) = [json.loads(line) for line in out.splitlines() if line.strip()]
    kpis = obj["kpis"]
    assert kpis["phase"] == obj["label"] and kpis["samples"] > 0
    figures = {k: v for k, v in kpis.items() if isinstance(v, dict)}
    assert figures and "sm_active" in figures
    for fig in figures.values():
        assert {"value", "unit", "method", "confidence"} <= fig.keys() and fig["method"]


def test_trace_kpis_keeps_one_sample_per_time_and_needs_enough() -> None:
    t, u, p = _nvml_like(2.0, seconds=60.0)
    tt = np.concatenate((t, t[:50]))  # a clock stepped back: the first samples come again
    trace = Trace(DeviceInfo("GPU-x"), tt, {"gpu_util": np.concatenate((u, u[:50])),
                                            "power": np.concatenate((p, p[:50]))})
    k = rhythm.trace_kpis(trace, "training")
    assert k["samples"] == t.size
    assert k["step_period_s"]["value"] == pytest.approx(2.0, rel=0.01)
    short = rhythm.trace_kpis(trace, "inference", [(0.0, 0.3)])
    assert "too few samples" in short["reason"] and "busy_fraction" not in short


def test_a_multiple_past_the_last_lag_is_not_checked_rather_than_crashing(shared_data: Path) -> None:
    """A real trace whose candidate period puts a multiple beyond the autocorrelation's last lag (the idle
    GPU of a ResNet run, read as training over the whole recording) once raised from np.argmax of an empty
    slice: the live pipeline calls this on whatever its rings hold, so it must answer."""
    path = shared_data / "sensorguard-rtx3090/20260824_train_resnet_cifar10_verifier-gpu0_s0_r01/nvml.csv"
    for trace in read(path):
        kpis = rhythm.trace_kpis(trace, "training")
        period = kpis["step_period_s"]["value"]
        assert period is None or period >= kpis["shortest_visible_period_s"]["value"]
