"""The GPU recording battery's --dry-run: every workload's real code path on the CPU, recorded through the
NVML source against the fake NVML, labelled and packed as on the H200."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from phasescope.recording import read_manifest
from phasescope.sources.replay import read

REPO = Path(__file__).resolve().parents[2]
BATTERY = REPO / "benchmarks" / "device" / "battery.py"
sys.path.insert(0, str(BATTERY.parent))
import battery  # noqa: E402

pytestmark = pytest.mark.slow
DryRun = tuple[Path, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> DryRun:
    out = tmp_path_factory.mktemp("battery")
    env = {**os.environ, "PHASESCOPE_SHARED_DATA": str(shared_data)}
    cmd = [sys.executable, str(BATTERY), "--dry-run", "--out", str(out), "--active-s", "0.8"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    return out, done


def test_every_workload_runs_and_is_recorded_at_both_rates(dry_run: DryRun) -> None:
    out, done = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    meta = json.loads((out / "h200" / "battery.json").read_text())
    assert [w["name"] for w in meta["workloads"]] == battery.NAMES
    assert not [w["name"] for w in meta["workloads"] if w["error"]]
    for name, label, _ in battery.WORKLOADS:
        for rate in ("1hz", "10hz"):
            path = out / "h200" / rate / f"{name}.parquet"
            manifest = read_manifest(path)
            assert manifest["battery"]["workload"] == name
            assert manifest["battery"]["label"] == label
            assert manifest["driver"] == "fake-580.95.05"
            traces = read(path)  # the own-format reader, as `classify` and `eval` use it
            assert len(traces) == 1 and len(traces[0]) >= 2
    # 10 Hz really samples ten times as often as 1 Hz (same workload, same span).
    m1 = read_manifest(out / "h200" / "1hz" / "train_mlp.parquet")
    m10 = read_manifest(out / "h200" / "10hz" / "train_mlp.parquet")
    assert m10["rows"] >= 5 * m1["rows"]


def test_labels_come_from_hooks_for_training_and_inference(dry_run: DryRun) -> None:
    out, _ = dry_run
    with open(out / "h200" / "labels.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    by_family: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_family.setdefault(r["family"], []).append(r)
    for name, label, _ in battery.WORKLOADS:
        own = by_family[name]
        assert {r["label"] for r in own} == {label}
        assert {r["run"] for r in own} == {f"h200-{name}"}  # both rates: one run, for grouped splits
        assert {r["rate_hz"] for r in own} == {"1", "10"}
    hooked = {r["family"] for r in rows if r["notes"].startswith("hooks:")}
    assert {"train_mlp", "train_gpt_lora", "train_gpt_ckpt", "infer_batched", "infer_generate_kv"} <= hooked
    assert not hooked & {"other_gemm", "other_fft", "idle_held"}  # hooks see no module there
    gaps = [r for r in rows if r["family"] == "battery_gap"]
    assert gaps and {r["label"] for r in gaps} == {"idle"}
    for r in rows:
        assert float(r["t_to"]) > float(r["t_from"])


def test_everything_is_packed_for_the_trip_back(dry_run: DryRun) -> None:
    out, _ = dry_run
    with tarfile.open(out / "battery.tar.gz") as tar:
        names = tar.getnames()
    assert "h200/labels.csv" in names and "h200/battery.json" in names
    assert "h200/10hz/other_fft.parquet" in names
    assert any(n.startswith("events/") for n in names)


def test_bad_arguments_say_what_was_expected(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BATTERY), "--dry-run", "--out", str(tmp_path), "--only", "train_nope"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown workloads ['train_nope']" in done.stderr


def test_budget_skips_workloads_that_would_overrun(tmp_path: Path, shared_data: Path) -> None:
    env = {**os.environ, "PHASESCOPE_SHARED_DATA": str(shared_data)}
    done = subprocess.run([sys.executable, str(BATTERY), "--dry-run", "--out", str(tmp_path), "--only",
                           "train_mlp,other_gemm", "--active-s", "0.5", "--budget-s", "2"],
                          capture_output=True, text=True, env=env, timeout=120)
    meta = json.loads((tmp_path / "h200" / "battery.json").read_text())
    assert [w.get("skipped") for w in meta["workloads"]] == [True, True], done.stdout
    assert not list((tmp_path / "h200" / "1hz").glob("*.parquet"))
    assert done.returncode == 1  # a skipped workload is not a clean run
