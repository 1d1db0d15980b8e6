from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MIB
from phasescope.sources.replay import sensorguard
from tests.sources.replay.conftest import expect_input_error

MIGRATION = "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r02"
INFER = "sensorguard-rtx3090/20260825_infer_gpt2_verifier-gpu1_s3_r03"


def test_reads_run_directory_one_trace_per_gpu_in_base_units(shared_data: Path) -> None:
    traces = sensorguard.read(shared_data / MIGRATION)
    assert [t.meta["gpu_index"] for t in traces] == [3, 4]
    gpu3 = traces[0]
    assert gpu3.device.uuid == "GPU-42e33043-7008-2803-9ba8-9bb9ef7d0845"
    assert len(gpu3) == 216 and len(traces[1]) == 216
    # First data row of GPU 3: 0,...,91607.03880748,,3,GPU-42e3...,ok,0,0,453,53.128,57,420,810,927,341
    assert gpu3.time[0] == pytest.approx(91607.03880748)
    assert gpu3["power"][0] == pytest.approx(53.128)
    assert gpu3["mem_used"][0] == 453 * MIB
    assert gpu3["temperature"][0] == 57
    assert gpu3["sm_clock"][0] == 420e6 and gpu3["mem_clock"][0] == 810e6
    assert gpu3["pcie_tx"][0] == 927_000 and gpu3["pcie_rx"][0] == 341_000
    assert gpu3["gpu_util"].max() <= 1.0 and gpu3["gpu_util"].max() > 0.5  # percent -> ratio, and it worked
    assert gpu3.missing_signals() == []
    assert np.all(np.diff(gpu3.time) > 0)


def test_meta_from_manifest_and_anchor(shared_data: Path) -> None:
    gpu3, gpu4 = sensorguard.read(shared_data / MIGRATION / "nvml.csv")
    m = gpu3.meta
    assert m["format"] == "sensorguard" and m["source_path"].endswith("nvml.csv")
    assert m["run"] == "20260830T145310Z_dev-migration_node1-gpu3-4_r02"
    assert m["workload"] == "migration" and m["gpus_under_test"] == [3, 4]
    assert gpu3.meta["under_test"] and gpu4.meta["under_test"]
    assert m["marker_bursts"]["pre"][0] == [91611.208742, 91613.290814]
    # anchor row: t_receipt_raw_s 91607.017867375 <-> 2026-08-30T14:56:47.528627+00:00
    assert m["utc_offset"] + 91607.017867375 == pytest.approx(1788101807.528627, abs=1e-6)
    assert m["dropped_rows"] == 1  # the anchor row


def test_bystanders_are_not_under_test(shared_data: Path) -> None:
    traces = sensorguard.read(shared_data / INFER)
    flags = {t.meta["gpu_index"]: t.meta["under_test"] for t in traces}
    assert flags == {0: False, 1: True}
    assert "t_from" in traces[1].meta and "t_from" not in traces[0].meta


def _labelled_spans(shared_data: Path) -> list[dict[str, str]]:
    with (shared_data / "labels.csv").open() as fh:
        return [r for r in csv.DictReader(fh) if r["path"].startswith("sensorguard-rtx3090/") and r["t_from"]]


def test_workload_span_matches_every_labelled_span(shared_data: Path) -> None:
    rows = _labelled_spans(shared_data)
    assert len(rows) > 20
    cache: dict[str, dict[int, dict[str, object]]] = {}
    for r in rows:
        if r["path"] not in cache:
            cache[r["path"]] = {
                t.meta["gpu_index"]: t.meta for t in sensorguard.read(shared_data / r["path"])
            }
        meta = cache[r["path"]][int(r["gpu_index"])]
        assert meta["t_from"] == pytest.approx(float(r["t_from"]), abs=2e-3), r["path"]
        assert meta["t_to"] == pytest.approx(float(r["t_to"]), abs=2e-3), r["path"]


def test_markers_copy_has_no_workload_span(shared_data: Path) -> None:
    run = next((shared_data / "sensorguard-markers").iterdir())
    traces = sensorguard.read(run)
    assert len(traces) == 5
    assert all(t.meta["markers_only"] and "t_from" not in t.meta for t in traces)
    assert all(50 <= t.duration() <= 60 for t in traces)


def test_without_manifest_still_reads(shared_data: Path, tmp_path: Path) -> None:
    shutil.copy(shared_data / MIGRATION / "nvml.csv", tmp_path / "nvml.csv")
    traces = sensorguard.read(tmp_path)
    assert len(traces) == 2 and "workload" not in traces[0].meta
    assert not math.isnan(traces[0]["power"][0])


def _copy_with(shared_data: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    raw = (shared_data / MIGRATION / "nvml.csv").read_bytes().decode()
    (tmp_path / "nvml.csv").write_bytes(edit(raw).encode())
    return tmp_path / "nvml.csv"


def test_garbage_number_names_row_and_field(shared_data: Path, tmp_path: Path) -> None:
    p = _copy_with(shared_data, tmp_path, lambda s: s.replace(",53.128,", ",53.1x8,", 1))
    expect_input_error(sensorguard.read, p, match=(str(p), "row 2", "'power_w'", "a number", "53.1x8"))


def test_truncated_file_loses_its_cut_row_and_a_cut_row_inside_names_its_line(
    shared_data: Path, tmp_path: Path
) -> None:
    """A logger killed mid-write leaves its last row cut: that row goes, the rest is read. A cut row with
    rows after it is damage, not an end: an error naming its line."""
    whole = sensorguard.read(_copy_with(shared_data, tmp_path, lambda s: s))
    p = _copy_with(shared_data, tmp_path, lambda s: s[: len(s) - 40])
    cut = sensorguard.read(p)
    assert [len(t) for t in cut] == [len(whole[0]), len(whole[1]) - 1]
    assert np.array_equal(cut[1].time, whole[1].time[:-1])
    assert np.array_equal(cut[0]["power"], whole[0]["power"])
    lines = (shared_data / MIGRATION / "nvml.csv").read_bytes().decode().split("\r\n")  # ends in a break
    p = _copy_with(shared_data, tmp_path, lambda s: "\r\n".join([*lines[:-3], lines[-3][:-40], *lines[-2:]]))
    where = f"line {len(lines) - 2}"  # the next-to-last row, cut
    expect_input_error(sensorguard.read, p, match=(str(p), where, "16 comma-separated fields"))


def test_missing_column_is_named(shared_data: Path, tmp_path: Path) -> None:
    p = _copy_with(shared_data, tmp_path, lambda s: s.replace("power_w", "power_mw", 1))
    expect_input_error(sensorguard.read, p, match=(str(p), "header", "'power_w'"))


def test_bad_manifest_is_an_input_error(shared_data: Path, tmp_path: Path) -> None:
    shutil.copy(shared_data / MIGRATION / "nvml.csv", tmp_path / "nvml.csv")
    (tmp_path / "manifest.yaml").write_text("run_id: [unclosed\n")
    expect_input_error(sensorguard.read, tmp_path, match=("manifest.yaml", "valid YAML"))
