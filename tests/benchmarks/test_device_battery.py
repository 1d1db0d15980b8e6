"""The GPU recording battery (v2). Its --dry-run runs every workload's real code path on the CPU, recorded
through the NVML source against the fake NVML (sample buffers included), labelled and packed as on a lent GPU;
the rotation and the sample-buffer poller are also checked on their own."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pynvml
import pytest

from phasescope.schema import DeviceInfo, Trace
from phasescope.sources.replay import read
from phasescope.store.recording import read_manifest
from tests.fakes.fake_nvml import FakeNvml

REPO = Path(__file__).resolve().parents[2]
BATTERY = REPO / "benchmarks" / "device" / "battery.py"
sys.path.insert(0, str(BATTERY.parent))
import battery  # noqa: E402

DryRun = tuple[Path, subprocess.CompletedProcess[str]]
DEV = "dryrun"  # the device folder of the fake NVML's GPU
NEW = {"idle_held", "train_lora_finetune", "train_eval_mixed", "infer_serve_poisson", "infer_serve_bursty",
       "other_stencil", "other_membound"}
OLD = [n for n in battery.NAMES if n not in NEW]


def _labels_csv(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["path", "t_from", "t_to", "label", "family", "rate_hz"])
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> DryRun:
    out = tmp_path_factory.mktemp("battery")
    # Data recorded before: every workload but the new ones, 100 s each, so the new ones come first.
    data = tmp_path_factory.mktemp("data")
    _labels_csv(data / "h200" / "labels.csv", [
        {"path": f"{rate}/{n}.parquet", "t_from": "1000", "t_to": "1100", "label": battery.LABEL_OF[n],
         "family": n, "rate_hz": rate[:-2]} for n in OLD for rate in ("1hz", "10hz")])
    env = {**os.environ, "PHASESCOPE_SHARED_DATA": str(shared_data)}
    cmd = [sys.executable, str(BATTERY), "--dry-run", "--out", str(out), "--active-s", "0.8",
           "--rotation", "7", "--data", str(data)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    return out, done


@pytest.mark.slow
def test_every_workload_runs_and_is_recorded_at_both_rates(dry_run: DryRun) -> None:
    out, done = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    meta = json.loads((out / DEV / "battery.json").read_text())
    assert meta["device_dir"] == DEV
    # No budget in a dry run: the rotation takes every workload.
    assert sorted(w["name"] for w in meta["workloads"]) == sorted(battery.NAMES)
    assert not [w["name"] for w in meta["workloads"] if w["error"]]
    for name, label, _ in battery.WORKLOADS:
        for rate in ("1hz", "10hz"):
            path = out / DEV / rate / f"{name}.parquet"
            manifest = read_manifest(path)
            assert manifest["battery"]["workload"] == name
            assert manifest["battery"]["label"] == label
            assert manifest["battery"]["held"] is (name == "idle_held")
            assert manifest["driver"] == "fake-580.95.05"
            traces = read(path)  # the own-format reader, as `classify` and `eval` use it
            assert len(traces) == 1 and len(traces[0]) >= 2
            assert traces[0].device.name == battery.DRY_RUN_GPU
    # 10 Hz really samples ten times as often as 1 Hz (same workload, same span).
    m1 = read_manifest(out / DEV / "1hz" / "train_mlp.parquet")
    m10 = read_manifest(out / DEV / "10hz" / "train_mlp.parquet")
    assert m10["rows"] >= 5 * m1["rows"]


@pytest.mark.slow
def test_the_rotation_is_recorded_least_represented_first(dry_run: DryRun) -> None:
    out, done = dry_run
    meta = json.loads((out / DEV / "battery.json").read_text())
    rot = meta["rotation"]
    assert rot["key"] == 7 and rot["key_from"] == "--rotation"
    assert set(rot["order"][:len(NEW)]) == NEW  # never recorded before: first
    assert rot["represented_s"]["train_mlp"] == 100.0 and rot["represented_s"]["other_stencil"] == 0.0
    assert rot["order"] == battery.rotation_order(battery.NAMES, 7, {n: 100.0 for n in OLD})
    # One of each class first (idle first: idle_held is the only idle one not recorded yet), each the first of
    # its class in the order, the classes as their first workload comes; then the rest.
    firsts: dict[str, str] = {}
    for name in rot["order"]:
        firsts.setdefault(battery.LABEL_OF[name], name)
    assert rot["chosen"][0] == firsts["idle"] == "idle_held"
    assert rot["chosen"][1:4] == [n for n in rot["order"] if n in firsts.values() and n != "idle_held"]
    assert [w["name"] for w in meta["workloads"]] == rot["chosen"]
    assert rot["left_out"] == []
    assert "rotation 7: chosen idle_held, " in done.stdout


@pytest.mark.slow
def test_labels_come_from_hooks_for_training_and_inference(dry_run: DryRun) -> None:
    out, _ = dry_run
    with open(out / DEV / "labels.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    by_family: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_family.setdefault(r["family"], []).append(r)
    for name, label, _ in battery.WORKLOADS:
        own = by_family[name]
        want = {"training", "inference"} if name == "train_eval_mixed" else {label}
        assert {r["label"] for r in own} == want, name
        assert {r["run"] for r in own} == {f"{DEV}-{name}"}  # both rates: one run, for grouped splits
        assert {r["rate_hz"] for r in own} == {"1", "10"}
    hooked = {r["family"] for r in rows if r["notes"].startswith("hooks:")}
    assert {"train_mlp", "train_gpt_lora", "train_gpt_ckpt", "infer_batched", "infer_generate_kv",
            "train_lora_finetune", "train_eval_mixed", "infer_serve_poisson", "infer_serve_bursty"} <= hooked
    # Hooks see no module there; idle_held loads a model but never calls it.
    assert not hooked & {"other_gemm", "other_fft", "other_stencil", "other_membound", "idle_held"}
    assert [r["notes"] for r in by_family["idle_held"]] == [
        "declared by the battery; declared (hooks saw nothing)"] * 2
    # The evaluation passes of the mixed workload come after its training steps, inside its window.
    mixed = sorted((float(r["t_from"]), r["label"]) for r in by_family["train_eval_mixed"]
                   if r["rate_hz"] == "1")
    assert [lab for _, lab in mixed] == ["training", "inference"]
    gaps = [r for r in rows if r["family"] == "battery_gap"]
    assert gaps and {r["label"] for r in gaps} == {"idle"}
    for r in rows:
        assert float(r["t_to"]) > float(r["t_from"])


@pytest.mark.slow
def test_new_workloads_did_their_work(dry_run: DryRun) -> None:
    out, _ = dry_run
    meta = json.loads((out / DEV / "battery.json").read_text())
    info = {w["name"]: w["info"] for w in meta["workloads"]}
    for serve in ("infer_serve_poisson", "infer_serve_bursty"):
        assert info[serve]["completed"] >= 1 and info[serve]["decode_steps"] > info[serve]["completed"]
        assert info[serve]["decoded_tokens"] >= info[serve]["completed"]
    assert info["train_eval_mixed"]["train_steps"] > 0 and info["train_eval_mixed"]["eval_batches"] > 0
    lora = info["train_lora_finetune"]
    assert lora["steps"] > 0 and lora["trainable_params"] < lora["frozen_params"] / 2
    assert lora["seq"] == 2 * battery.TINY.seq
    assert info["other_stencil"]["sweeps"] > 0 and info["other_membound"]["bytes"] > 0
    assert info["idle_held"]["held_bytes"] == battery.TINY.held_bytes
    assert info["idle_held"]["model_params"] > 0


@pytest.mark.slow
def test_nvml_sample_buffers_are_recorded_once_each(dry_run: DryRun) -> None:
    out, _ = dry_run
    for name in battery.NAMES:
        manifest = read_manifest(out / DEV / "1hz" / f"{name}.parquet")
        note = manifest["nvml_samples"]
        assert note["path"] == f"{name}.samples.parquet"
        assert manifest["battery"]["samples"] == f"samples/{name}.samples.parquet"
        table = pq.read_table(out / DEV / "samples" / f"{name}.samples.parquet").to_pydict()
        assert set(table) == {"time_s", "kind", "value"}
        assert set(table["kind"]) == {"gpu_util", "power"}
        t = np.asarray(table["time_s"])
        v = np.asarray(table["value"])
        kind = np.asarray(table["kind"])
        for k in ("gpu_util", "power"):
            tk = t[kind == k]
            summary = note["kinds"][k]
            assert summary["status"] == "ok" and summary["samples"] == tk.size
            assert np.all(np.diff(tk) > 0), f"{name}/{k}: a sample recorded twice or out of order"
            # Unix seconds around the recording; the fake buffers one sample per 0.1 s: none was lost.
            assert manifest["start"] - 1.0 <= tk[0] and tk[-1] <= manifest["end"] + 10.0
            assert np.max(np.diff(tk)) < 0.25
            assert tk.size >= 8 * (manifest["end"] - manifest["start"])
        assert np.all((v[kind == "gpu_util"] >= 0) & (v[kind == "gpu_util"] <= 1))
        assert np.all(v[kind == "power"] > 1.0)  # watts, not milliwatts / 1e6
        assert np.all(v[kind == "power"] < 1000.0)  # watts, not milliwatts
        # The 10 Hz recorder does not poll them: one file per workload.
        assert "nvml_samples" not in read_manifest(out / DEV / "10hz" / f"{name}.parquet")


@pytest.mark.slow
def test_everything_is_packed_for_the_trip_back(dry_run: DryRun) -> None:
    out, _ = dry_run
    with tarfile.open(out / "battery.tar.gz") as tar:
        names = tar.getnames()
    assert f"{DEV}/labels.csv" in names and f"{DEV}/battery.json" in names
    assert f"{DEV}/10hz/other_fft.parquet" in names
    assert f"{DEV}/samples/other_stencil.samples.parquet" in names
    assert any(n.startswith("events/") for n in names)


def test_bad_arguments_say_what_was_expected(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BATTERY), "--dry-run", "--out", str(tmp_path), "--only", "train_nope"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown workloads ['train_nope']" in done.stderr


@pytest.mark.slow
def test_budget_skips_workloads_that_would_overrun(tmp_path: Path, shared_data: Path) -> None:
    env = {**os.environ, "PHASESCOPE_SHARED_DATA": str(shared_data)}
    done = subprocess.run([sys.executable, str(BATTERY), "--dry-run", "--out", str(tmp_path), "--only",
                           "train_mlp,other_gemm", "--active-s", "0.5", "--budget-s", "2"],
                          capture_output=True, text=True, env=env, timeout=120)
    meta = json.loads((tmp_path / DEV / "battery.json").read_text())
    assert [w.get("skipped") for w in meta["workloads"]] == [True, True], done.stdout
    assert not list((tmp_path / DEV / "1hz").glob("*.parquet"))
    assert done.returncode == 1  # a skipped workload is not a clean run


# ---- the rotation ---------------------------------------------------------------------------------------


def _cost(name: str) -> float:
    return 100.0


def test_rotation_keys_give_different_subsets_of_one_workload_per_class() -> None:
    subsets = [battery.choose_workloads(battery.NAMES, key, {}, 415.0, _cost) for key in range(12)]
    for chosen in subsets:
        assert len(chosen) == 4
        assert battery.LABEL_OF[chosen[0]] == "idle"
        assert sorted(battery.LABEL_OF[n] for n in chosen) == sorted(battery.LABEL_CLASSES)
    assert len({tuple(c) for c in subsets}) >= 6  # the key really rotates
    assert subsets[3] == battery.choose_workloads(battery.NAMES, 3, {}, 415.0, _cost)  # and is deterministic


def test_rotation_takes_the_least_represented_first() -> None:
    represented = {n: 300.0 for n in battery.NAMES}
    represented.update({"other_fft": 0.0, "idle_released": 20.0, "train_cnn": 95.0, "infer_batched": 40.0})
    for key in range(8):
        chosen = battery.choose_workloads(battery.NAMES, key, represented, 415.0, _cost)
        assert chosen[0] == "idle_released"
        assert set(chosen) == {"idle_released", "other_fft", "train_cnn", "infer_batched"}
        assert chosen[1:] == ["other_fft", "infer_batched", "train_cnn"]  # classes by their first in line
    # A few seconds more or less are a tie, which the key breaks; 30 s more is not.
    places = {battery.rotation_order(battery.NAMES, key, {"train_mlp": 2.0}).index("train_mlp")
              for key in range(10)}
    assert len(places) > 3
    assert {battery.rotation_order(battery.NAMES, key, {"train_mlp": 30.0})[-1] for key in range(10)} == {
        "train_mlp"}


def test_rotation_fills_the_budget_and_keeps_within_it() -> None:
    costs = {n: 50.0 + 10.0 * i for i, n in enumerate(battery.NAMES)}
    for budget in (0.0, 60.0, 250.0, 700.0, 10_000.0):
        chosen = battery.choose_workloads(battery.NAMES, 5, {}, budget, costs.__getitem__)
        assert sum(costs[n] for n in chosen) <= budget
        assert len(set(chosen)) == len(chosen)
        left = budget - sum(costs[n] for n in chosen)
        assert all(costs[n] > left for n in battery.NAMES if n not in chosen)  # nothing more would fit
    assert battery.choose_workloads(battery.NAMES, 5, {}, 0.0, costs.__getitem__) == []
    everything = battery.choose_workloads(battery.NAMES, 5, {}, 10_000.0, costs.__getitem__)
    assert sorted(everything) == sorted(battery.NAMES)
    # The second idle workload comes after every busy one.
    idle = [i for i, n in enumerate(everything) if battery.LABEL_OF[n] == "idle"]
    assert idle[0] == 0 and idle[1] == len(everything) - 1


def test_represented_seconds_counts_each_window_once(tmp_path: Path) -> None:
    both = [{"path": f"{r}/train_mlp.parquet", "t_from": "10", "t_to": "40", "label": "training",
             "family": "train_mlp", "rate_hz": r[:-2]} for r in ("1hz", "10hz")]
    gap = {"path": "1hz/train_mlp.parquet", "t_from": "0", "t_to": "9", "label": "idle",
           "family": "battery_gap", "rate_hz": "1"}
    mixed = [{"path": "1hz/train_eval_mixed.parquet", "t_from": a, "t_to": b, "label": lab,
              "family": "train_eval_mixed", "rate_hz": "1"} for a, b, lab in (("0", "9", "training"),
                                                                               ("9", "15", "inference"))]
    _labels_csv(tmp_path / "h200" / "labels.csv", [*both, gap, *mixed])
    _labels_csv(tmp_path / "h100" / "labels.csv", [*both, {**gap, "family": "not_a_workload"}])
    assert battery.represented_seconds(tmp_path) == {"train_mlp": 60.0, "train_eval_mixed": 15.0}
    assert battery.represented_seconds(tmp_path / "nothing") == {}


def test_the_device_folder_is_named_from_the_gpu_model() -> None:
    assert battery.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert battery.gpu_slug("NVIDIA H200") == "h200"
    assert battery.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert battery.gpu_slug("NVIDIA GeForce RTX 3090") == "rtx3090"
    assert battery.gpu_slug("Tesla V100-SXM2-16GB") == "v100"
    assert battery.gpu_slug(battery.DRY_RUN_GPU) == DEV
    assert battery.gpu_slug("") == "gpu"


def test_arrival_processes() -> None:
    import random

    t = list(zip(range(4000), battery.poisson_arrivals(random.Random(0), 10.0), strict=False))
    assert 9.0 < 4000 / t[-1][1] < 11.0
    burst = [a for _, a in zip(range(4000), battery.mmpp_arrivals(random.Random(0), (40.0, 1.0), (5.0, 5.0)),
                               strict=False)]
    gaps = np.diff(burst)
    assert np.all(gaps > 0)
    # Bursty: far more variable than Poisson's coefficient of variation of 1.
    assert gaps.std() / gaps.mean() > 2.0


# ---- NVML's sample buffers, against the fake NVML -------------------------------------------------------


def _gpu_trace(n: int = 60) -> Trace:
    power = 100.0 + np.arange(n, dtype=float)
    power[7] = np.nan  # the driver has no sample for that moment
    util = (np.arange(n) % 10) / 10.0
    return Trace(DeviceInfo(uuid="GPU-00000000-0000-0000-0000-000000000001", name="NVIDIA H100 80GB HBM3"),
                 np.arange(n, dtype=float), {"power": power, "gpu_util": util, "mem_util": util})


@pytest.fixture
def buffers(fake_nvml: Callable[..., FakeNvml]) -> tuple[FakeNvml, battery.SampleBuffers, float]:
    epoch = time.time() - 100.0
    fake = fake_nvml([_gpu_trace()], sample_clock=(epoch, 0.1))
    pynvml.nvmlInit()
    fake.advance(10)
    # Started between tick 5 and 6: the buffer's older samples are the previous workload's.
    return fake, battery.SampleBuffers(pynvml.nvmlDeviceGetHandleByIndex(0), since_s=epoch + 0.55), epoch


def _kind(b: battery.SampleBuffers, kind: str) -> list[tuple[float, float]]:
    return [(t, v) for t, k, v in b.rows if k == kind]


def test_sample_buffers_keep_each_sample_once(buffers: tuple[FakeNvml, battery.SampleBuffers, float]) -> None:
    fake, b, epoch = buffers
    assert b.poll() == 4 + 5  # power: ticks 6, 8, 9, 10 (7 is NaN); utilisation: ticks 6..10
    assert b.stats["power"]["before_start_dropped"] == 6 and b.stats["gpu_util"]["before_start_dropped"] == 6
    assert b.poll() == 0  # nothing new: NotFound, not an error
    assert b.stats["power"]["not_found_polls"] == 1 and b.stats["power"]["errors"] == {}
    fake.advance(3)
    assert b.poll() == 6
    power = _kind(b, "power")
    assert [round((t - epoch) * 10) for t, _ in power] == [6, 8, 9, 10, 11, 12, 13]
    assert [v for _, v in power] == [106.0, 108.0, 109.0, 110.0, 111.0, 112.0, 113.0]  # W from mW
    util = _kind(b, "gpu_util")
    assert [round((t - epoch) * 10) for t, _ in util] == list(range(6, 14))
    assert [v for _, v in util] == pytest.approx([0.6, 0.7, 0.8, 0.9, 0.0, 0.1, 0.2, 0.3])  # ratio from %
    s = b.summary()["kinds"]["gpu_util"]
    assert s["samples"] == 8 and s["median_period_s"] == pytest.approx(0.1, abs=1e-3)


def test_sample_buffers_drop_samples_the_driver_gives_twice(
        buffers: tuple[FakeNvml, battery.SampleBuffers, float], monkeypatch: pytest.MonkeyPatch) -> None:
    fake, b, _ = buffers
    # A driver that ignores lastSeenTimeStamp and hands back its whole buffer each time, out of order.
    whole = fake.nvmlDeviceGetSamples
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples",
                        lambda h, kind, last: (lambda r: (r[0], r[1][::-1]))(whole(h, kind, 0)))
    b.poll()
    first = list(b.rows)
    b.poll()
    b.poll()
    assert b.rows == first
    assert b.stats["gpu_util"]["duplicates_dropped"] == 2 * 11
    fake.advance(2)
    assert b.poll() == 4
    assert len({(t, k) for t, k, _ in b.rows}) == len(b.rows)


def test_unsupported_sample_buffers_record_nothing_and_say_so(
        buffers: tuple[FakeNvml, battery.SampleBuffers, float], tmp_path: Path) -> None:
    fake, b, _ = buffers
    fake.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_NOT_SUPPORTED)
    for _ in range(3):
        fake.advance()
        assert b.poll() == 0
    assert fake.calls["nvmlDeviceGetSamples"] == 2  # tried once per kind, then left alone
    summary = b.summary()
    for kind in ("gpu_util", "power"):
        assert summary["kinds"][kind]["status"].startswith("not recorded: ")
        assert "code 3" in summary["kinds"][kind]["status"] and summary["kinds"][kind]["samples"] == 0
    path = tmp_path / "x.samples.parquet"
    b.write(path)
    table = pq.read_table(path)
    assert table.num_rows == 0 and table.column_names == ["time_s", "kind", "value"]


def test_a_passing_sample_buffer_error_is_counted_and_polled_again(
        buffers: tuple[FakeNvml, battery.SampleBuffers, float]) -> None:
    fake, b, _ = buffers
    fake.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_UNKNOWN, until_tick=11)
    assert b.poll() == 0
    assert sum(b.stats["power"]["errors"].values()) == 1 and b.stats["power"]["status"] == "ok"
    fake.advance()
    assert b.poll() == 6 + 5  # ticks 6..11 of each kind, less the NaN power one (7)


def test_fake_sample_buffer_on_the_traces_clock(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake = fake_nvml([_gpu_trace()], sample_buffer=5)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fake.advance(20)
    vtype, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert [s.timeStamp for s in samples] == [k * 1_000_000 for k in range(16, 21)]
    _, newer = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 19_000_000)
    assert [s.timeStamp for s in newer] == [20_000_000]
    with pytest.raises(pynvml.NVMLError) as exc:
        pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 20_000_000)
    assert exc.value.value == pynvml.NVML_ERROR_NOT_FOUND
    with pytest.raises(pynvml.NVMLError) as exc:
        pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_PROCESSOR_CLK_SAMPLES, 0)
    assert exc.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
