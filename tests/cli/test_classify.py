"""`phasescope classify` on real traces from ../shared/data with the shipped model."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel
from phasescope.cli import main
from phasescope.cli.classify import classify_trace, timeline
from phasescope.config import ThresholdConfig
from phasescope.schema import Trace
from phasescope.sources.replay import read

TRAIN_GPT2 = "sensorguard-rtx3090/20260825_train_gpt2_wikitext_verifier-gpu0_s2_r03/nvml.csv"
INFER_BERT = "sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01"
H100 = "nvidia-smi-h100-training/ckpt1.csv"
CONTRACT = {"path", "device", "label", "probabilities", "missing_signals", "segments", "windows"}


INTERLEAVING = "sensorguard-rtx3090/20260830T145309Z_dev-interleaving_node1-gpu2_r01/nvml.csv"


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # classify reads the user's config file ([thresholds]); the tests must not see the developer's.
    monkeypatch.delenv("PHASESCOPE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict], str]:
    code = main(["classify", "--json", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


def by_index(objs: list[dict], index: int) -> dict:
    return next(o for o in objs if o["gpu_index"] == index)


def test_clear_training_run_is_training_and_its_idle_neighbour_idle(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, objs, err = run_json([str(shared_data / TRAIN_GPT2)], capsys)
    assert code == 0, err
    assert by_index(objs, 0)["label"] == "training"  # the GPU under test
    assert by_index(objs, 1)["label"] == "idle"  # the bystander beside it
    assert by_index(objs, 0)["probabilities"]["training"] > 0.8


def test_clear_inference_run_is_inference(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, objs, err = run_json([str(shared_data / INFER_BERT)], capsys)
    assert code == 0, err
    o = by_index(objs, 0)
    assert o["label"] == "inference"
    assert [s["label"] for s in o["segments"]].count("training") == 0


def test_json_contract(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, objs, _ = run_json([str(shared_data / TRAIN_GPT2)], capsys)
    assert code == 0 and len(objs) == 2  # one object per device trace
    for o in objs:
        assert o.keys() >= CONTRACT
        assert o["path"] == str(shared_data / TRAIN_GPT2)
        assert set(o["probabilities"]) == {"training", "inference", "other", "idle"}
        assert o["windows"] and {"start", "end", "label", "p_training"} <= o["windows"][0].keys()
        assert all(w["end"] > w["start"] for w in o["windows"])
        seg = o["segments"][0]
        assert {"start", "end", "label", "probabilities", "n_windows"} <= seg.keys()
        # Segments tile the trace in order.
        segs = o["segments"]
        assert all(a["end"] <= b["start"] + 1e-9 for a, b in itertools.pairwise(segs))
        # The overall label is the one holding most segment time.
        time_by = {}
        for s in o["segments"]:
            time_by[s["label"]] = time_by.get(s["label"], 0.0) + s["end"] - s["start"]
        assert o["label"] == max(time_by, key=time_by.__getitem__)


def test_window_and_stride_options(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, default, _ = run_json([str(shared_data / TRAIN_GPT2)], capsys)
    _, fine, _ = run_json(["--stride", "5", str(shared_data / TRAIN_GPT2)], capsys)
    w0, w1 = by_index(default, 0)["windows"], by_index(fine, 0)["windows"]
    assert w1[1]["start"] - w1[0]["start"] == pytest.approx(5.0, abs=1.0)
    assert len(w1) > 2 * len(w0)
    assert by_index(fine, 0)["label"] == "training"


def test_pcie_less_log_still_answers_and_names_missing_signals(shared_data: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, objs, err = run_json([str(shared_data / H100)], capsys)
    assert code == 0, err
    assert len(objs) == 8
    for o in objs:
        assert {"pcie_tx", "pcie_rx", "sm_clock", "mem_util"} <= set(o["missing_signals"])
        assert o["label"] == "training"


def test_sensorguard_trace_with_pcie_removed(shared_data: Path, model: PhaseModel) -> None:
    trace = next(t for t in read(shared_data / TRAIN_GPT2) if t.device.index == 0)
    r = classify_trace(model, trace.without("pcie_tx", "pcie_rx"), TRAIN_GPT2, None, None)
    assert r.to_json()["missing_signals"] == ["pcie_tx", "pcie_rx"]
    assert r.verdict.label == "training"


def test_malformed_file_is_one_line_and_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.csv"
    bad.write_text("timestamp, power.draw [W]\n2024/01/01 00:00:00.000, lots\n\x00\x01garbage\n")
    code = main(["classify", str(bad)])
    out, err = capsys.readouterr()
    assert code != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(bad) in lines[0], err
    assert "Traceback" not in err and out == ""


def test_bad_path_among_good_ones(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_telemetry = shared_data / "formats/vllm-metrics/DataDog__integrations-core__vllm_metrics.txt"
    missing = tmp_path / "nope.csv"
    code, objs, err = run_json([str(not_telemetry), str(shared_data / INFER_BERT), str(missing)], capsys)
    assert code != 0
    assert {o["path"] for o in objs} == {str(shared_data / INFER_BERT)}  # the good one still classified
    lines = err.strip().splitlines()
    assert len(lines) == 3  # one per bad file, then the count
    assert str(not_telemetry) in lines[0] and str(missing) in lines[1]
    assert "2 of 3" in lines[2]


def test_human_output_has_table_and_timeline(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["classify", str(shared_data / TRAIN_GPT2)])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "training" in out and "idle" in out
    assert "TTTTTTTTTT" in out and ".........." in out  # the strips of the two devices


def test_timeline_bins_long_traces_by_majority() -> None:
    assert [c for c, _ in timeline(["training"] * 3 + ["idle"])] == ["T", "T", "T", "."]
    long = ["training"] * 500 + ["unknown"] + ["idle"] * 499
    strip = "".join(c for c, _ in timeline(long, width=10))
    assert strip == "TTTTT....."


def test_missing_model_file_is_one_line(shared_data: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["classify", "--model", str(tmp_path / "none.json"), str(shared_data / H100)])
    _, err = capsys.readouterr()
    assert code != 0 and len(err.strip().splitlines()) == 1 and "model" in err


def _rule(reason: str) -> str:
    if "outside" in reason:
        return "rate"
    return "too little data" if reason == "too little data in window" else reason


def test_every_labelled_trace_is_classified(shared_data: Path, model: PhaseModel) -> None:
    """Done-when: every real file in labels.csv goes through `classify`. A trace is unknown only for an
    a-priori rule: a sampling rate outside the validated range (Alibaba pods, 1 per 57 s) or fewer samples
    than one window needs (the A10 capture's 1-2 samples per GPU); never for a low probability."""
    import csv

    paths = sorted({r["path"] for r in csv.DictReader((shared_data / "labels.csv").open(newline=""))})
    called = 0
    rules: set[str] = set()
    for rel in paths:
        for trace in read(str(shared_data / rel)):
            r = classify_trace(model, trace, rel, None, None)
            if r.verdict.label == "unknown":
                assert all(r.pred.reasons), rel
                rules |= {_rule(w) for w in r.pred.reasons}
            else:
                called += 1
    assert called > 200
    assert rules <= {"rate", "too little data"}, rules


def test_min_confidence_from_the_config_file_or_a_flag_changes_the_verdict(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(shared_data / INTERLEAVING)
    _, objs, _ = run_json([path], capsys)
    default = by_index(objs, 2)
    # Unset: the model's own 0.5 bar, and the output carries nothing new (the evaluated rules alone).
    assert default["label"] == "training" and "thresholds" not in default
    assert all(w["label"] != "unknown" for w in default["windows"])
    cfg = tmp_path / "config.toml"
    cfg.write_text("[thresholds]\nmin_confidence = 0.97\n")
    code, objs, err = run_json(["--config", str(cfg), path], capsys)
    strict = by_index(objs, 2)
    assert code == 0, err
    assert strict["thresholds"] == {"min_confidence": 0.97}
    # Most of its windows are called below 0.97: they, and so the verdict, read unknown.
    assert strict["label"] == "unknown"
    assert sum(w["label"] == "unknown" for w in strict["windows"]) > len(strict["windows"]) // 2
    assert [w["p_training"] for w in strict["windows"]] == [w["p_training"] for w in default["windows"]]
    # The flag beats the file; the same file through $PHASESCOPE_CONFIG works too.
    _, objs, _ = run_json(["--config", str(cfg), "--min-confidence", "0.5", path], capsys)
    flagged = by_index(objs, 2)
    assert flagged["label"] == "training" and flagged["thresholds"] == {"min_confidence": 0.5}
    monkeypatch.setenv("PHASESCOPE_CONFIG", str(cfg))
    _, objs, _ = run_json([path], capsys)
    assert by_index(objs, 2) == strict


def _training_idle_training(shared_data: Path, idle_s: float) -> Trace:
    """A real training trace with `idle_s` of its idle bystander's telemetry spliced into the middle."""
    train, idle = read(shared_data / TRAIN_GPT2)

    def piece(t: Trace, a: float, b: float) -> dict[str, np.ndarray]:
        keep = (t.time >= t.time[0] + a) & (t.time < t.time[0] + b)
        return {s: v[keep] for s, v in t.columns.items()}

    parts = [piece(train, 100, 400), piece(idle, 100, 100 + idle_s), piece(train, 400, 600)]
    cols = {s: np.concatenate([p[s] for p in parts]) for s in parts[0]}
    step = float(np.median(np.diff(train.time)))
    return Trace(train.device, 1000.0 + step * np.arange(len(next(iter(cols.values())))), cols)


def test_min_segment_merges_shorter_segments_into_their_neighbours(
    shared_data: Path, model: PhaseModel
) -> None:
    trace = _training_idle_training(shared_data, 90.0)
    default = classify_trace(model, trace, "x", None, None)
    assert [s.label for s in default.verdict.segments] == ["training", "idle", "training"]
    idle_s = default.verdict.segments[1].duration
    assert 60.0 < idle_s < 90.0
    unset = classify_trace(model, trace, "x", None, None, ThresholdConfig())
    assert unset.to_json() == default.to_json()
    kept = classify_trace(model, trace, "x", None, None, ThresholdConfig(min_segment_s=60.0))
    assert [s.label for s in kept.verdict.segments] == ["training", "idle", "training"]
    merged = classify_trace(model, trace, "x", None, None, ThresholdConfig(min_segment_s=idle_s + 1.0))
    (one,) = merged.verdict.segments
    assert one.label == "training" and one.n_windows == sum(s.n_windows for s in default.verdict.segments)
    assert (one.start, one.end) == (default.verdict.segments[0].start, default.verdict.segments[-1].end)
    assert merged.to_json()["thresholds"] == {"min_segment_s": idle_s + 1.0}
    # The raw windows stay the model's: only the smoothed view changes.
    assert merged.to_json()["windows"] == default.to_json()["windows"]


def test_min_segment_flag_reaches_the_output(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, objs, err = run_json(["--min-segment", "45", str(shared_data / TRAIN_GPT2)], capsys)
    assert code == 0, err
    assert all(o["thresholds"] == {"min_segment_s": 45.0} for o in objs)
    code = main(["classify", "--min-segment", "45", str(shared_data / TRAIN_GPT2)])
    assert code == 0 and "thresholds set (config or flags): min_segment_s 45" in capsys.readouterr().out


# ---- idle that is held: a loaded model or a CUDA context kept while serving nothing ----

VLLM_PD = "powertrace-vllm/disagg/gpt-oss-20b-a100-pd-confirmatory-35692922/rate-1-repeat-1/power.csv"
LLAMA_CPP = "formats/nvidia-smi-csv-noheader/dst915__llama.cpp__gpu_stats.csv"
GIB = 1024.0**3


def _idle_segments(o: dict) -> list[dict]:
    return [s for s in o["segments"] if s["label"] == "idle"]


def _check_held_contract(o: dict) -> None:
    """Every device says `held` (+ `held_by`); every idle segment too, and no other segment does."""
    assert "held" in o and "held_by" in o
    for s in o["segments"]:
        assert ("held" in s) == (s["label"] == "idle") == ("held_by" in s), s
    if o["label"] == "idle":
        assert o["held"] in (True, False, None)
    else:
        assert o["held"] is (None if o["label"] == "unknown" else False)


def _vllm_idle_span(trace: Trace) -> Trace:
    """The first 30 s of the vLLM pair's log: labels.csv's idle span before the first request."""
    return trace.slice_time(end=float(trace.time[0]) + 30.0)


def test_json_says_idle_is_held_on_real_traces(
    shared_data: Path, model: PhaseModel, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM before its first request holds ~72 GiB (held); the RTX 3090 bystander beside a training run holds
    its driver context only (not held); llama.cpp's 4090s hold 10-13 GiB wherever the classifier says idle."""
    paths = [str(shared_data / p) for p in (VLLM_PD, TRAIN_GPT2, LLAMA_CPP)]
    code, objs, err = run_json(paths, capsys)
    assert code == 0, err
    for o in objs:
        _check_held_contract(o)
        assert o["held_by"] is None and all(s["held_by"] is None for s in _idle_segments(o))  # no processes
    vllm = [o for o in objs if o["path"] == paths[0]]
    assert len(vllm) == 2
    # Wherever the model calls it idle, it holds the model (two idle windows before the first request may
    # be bridged into the serving segment, so the labelled idle span is checked on its own below).
    assert all(all(s["held"] is True for s in _idle_segments(o)) for o in vllm)
    for trace in read(shared_data / VLLM_PD):
        o = classify_trace(model, _vllm_idle_span(trace), VLLM_PD, None, None).to_json()
        assert o["label"] == "idle" and o["held"] is True
        assert _idle_segments(o) and all(s["held"] is True for s in _idle_segments(o))
    bystander = by_index([o for o in objs if o["path"] == paths[1]], 1)
    assert bystander["label"] == "idle" and bystander["held"] is False
    assert [s["held"] for s in _idle_segments(bystander)] == [False]
    for o in (o for o in objs if o["path"] == paths[2]):
        assert all(s["held"] is True for s in _idle_segments(o))
        if o["label"] == "idle":
            assert o["held"] is True


def test_held_is_null_where_memory_is_not_in_the_trace(shared_data: Path, model: PhaseModel) -> None:
    trace = next(t for t in read(shared_data / TRAIN_GPT2) if t.device.index == 1)  # the idle bystander
    r = classify_trace(model, trace.without("mem_used"), TRAIN_GPT2, None, None)
    o = r.to_json()
    assert o["label"] == "idle" and o["held"] is None
    assert _idle_segments(o) and all(s["held"] is None for s in _idle_segments(o))
    # The same GPU with 2 GiB more in use (a process kept a model loaded) is held; the bar is 1 GiB.
    held = classify_trace(model, trace.with_columns(mem_used=trace["mem_used"] + 2 * GIB), TRAIN_GPT2,
                          None, None)
    assert held.verdict.label == "idle" and held.verdict.held.held is True and held.verdict.held_idle
    assert all(s["held"] is True for s in _idle_segments(held.to_json()))


def test_human_output_says_idle_held(shared_data: Path, model: PhaseModel,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from phasescope.cli.classify import print_human

    trace = next(iter(read(shared_data / VLLM_PD)))
    print_human([classify_trace(model, _vllm_idle_span(trace), VLLM_PD, None, None)])
    assert "idle (held) 0s-" in capsys.readouterr().out  # the segments column
    assert main(["classify", str(shared_data / TRAIN_GPT2)]) == 0
    out = capsys.readouterr().out
    assert "idle" in out and "(held)" not in out
    trace = next(t for t in read(shared_data / TRAIN_GPT2) if t.device.index == 1)
    held = classify_trace(model, trace.with_columns(mem_used=trace["mem_used"] + 2 * GIB), "x", None, None)
    print_human([held])
    out, _ = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("#1"))
    assert row.split()[1:3] == ["idle", "(held)"]  # the phase column


def test_a_recording_names_the_process_that_holds_an_idle_gpu(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A phasescope recording keeps its process samples: an idle GPU with a process on it is held, by that
    process, whatever its memory; the idle GPU beside it with none is not (and says so: [], not null)."""
    from phasescope.schema import SIGNAL_NAMES, DeviceInfo, ProcessSample, TickBatch
    from phasescope.store.recording import RecordingWriter

    idle = next(t for t in read(shared_data / TRAIN_GPT2) if t.device.index == 1)  # ~0.5 GiB in use
    devices = [DeviceInfo("GPU-held", "NVIDIA GeForce RTX 3090", 0),
               DeviceInfo("GPU-free", "NVIDIA GeForce RTX 3090", 1)]
    values = np.column_stack([idle[s] for s in SIGNAL_NAMES])
    out = tmp_path / "run.parquet"
    with RecordingWriter(out, source_spec="test", interval_s=1.0, host="node1") as w:
        for i in range(len(idle)):
            t = float(idle.time[i])
            w.write(TickBatch(t, devices, np.vstack([values[i], values[i]]),
                              [ProcessSample(t, 4242, "GPU-held", "vllm-serve")]))
    code, objs, err = run_json([str(out)], capsys)
    assert code == 0, err
    by_uuid = {o["device"]: o for o in objs}
    assert by_uuid["GPU-held"]["format"] == "phasescope"
    held, free = by_uuid["GPU-held"], by_uuid["GPU-free"]
    assert held["label"] == free["label"] == "idle"
    assert held["held"] is True and held["held_by"] == [{"pid": 4242, "name": "vllm-serve"}]
    assert free["held"] is False and free["held_by"] == []
    assert [s["held_by"] for s in _idle_segments(held)] == [[{"pid": 4242, "name": "vllm-serve"}]]
