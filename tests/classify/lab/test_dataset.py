"""Labelled examples from labels tables: device choice, cuts, run grouping, the sidecar format, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.lab.dataset import load_examples, read_labels, summary
from phasescope.errors import InputError

SG = "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r01/nvml.csv"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "labels.csv"
    p.write_text(text)
    return p


def test_cut_and_devices(shared_data: Path, tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "path,gpu_index,t_from,t_to,label,family,gpu,source,rate_hz,signals,run,notes\n"
        f"{shared_data / SG},3,91407.932,91580.56,training,migration,RTX3090,sensorguard,1,all9,mig,\n"
        f"{shared_data / SG},4,91407.932,91580.56,training,migration,RTX3090,sensorguard,1,all9,mig,\n"
        f"{shared_data / SG},3,,91407,other,marker_gemm_bursts,RTX3090,sensorguard,1,all9,mig,\n",
    )
    ex = load_examples(p)
    assert [e.trace.meta.get("gpu_index") for e in ex] == [3, 4, 3]
    assert all(e.run == "mig" for e in ex)
    assert ex[0].trace.time[0] >= 91407.932 and ex[0].trace.time[-1] <= 91580.56
    assert 150 <= len(ex[0].trace) <= 175
    assert ex[0].trace.meta["gpu_model"] == "RTX3090"
    assert ex[2].trace.time[-1] <= 91407 and ex[2].label == "other"  # open start: from the first sample


def test_shared_labels_alibaba_join_per_container(shared_data: Path) -> None:
    ex = load_examples(shared_data, include=lambda r: "alibaba" in str(r.path))
    assert len(ex) == 80  # one per container, the two files joined
    assert len({e.run for e in ex}) == 80
    assert all({"gpu_util", "mem_used"} <= set(e.trace.present_signals()) for e in ex)


def test_all_devices_share_the_run(shared_data: Path) -> None:
    ex = load_examples(shared_data, include=lambda r: r.path.name == "ckpt1.csv")
    assert len(ex) == 8 and {e.run for e in ex} == {"ckpt1"}
    assert np.isclose(ex[0].trace.rate_hz(), 10, rtol=0.1)
    assert summary(ex)["runs_by_source"] == {"grantwilkins/training_profile": 1}


def test_minimal_sidecar(shared_data: Path, tmp_path: Path) -> None:
    """A site's own table needs only path and label."""
    p = _write(tmp_path, f"path,label\n{shared_data / SG},idle\n")
    ex = load_examples(p)
    assert len(ex) == 2 and all(e.label == "idle" and e.family == "idle" for e in ex)
    assert read_labels(p)[0].gpu_index == "all"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("path,label\nx.csv,sleeping\n", "line 2, column label"),
        ("path,gpu_index\nx.csv,0\n", "column named 'label'"),
        ("path,label,t_from,t_to\nx.csv,idle,abc,\n", "column t_from"),
        ("path,label,t_from,t_to\nx.csv,idle,10,5\n", "t_to after t_from"),
        ("path,label\nmissing.csv,idle\n", "an existing file"),
        ("path,label,t_from,t_to\nx.csv,idle,nan,\n", "line 2, column t_from: expected a number of seconds"),
    ],
)
def test_bad_tables(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        load_examples(_write(tmp_path, body))


def test_malformed_trace_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.csv"
    bad.write_text("this is, not telemetry\n1,2\n")
    with pytest.raises(InputError, match=r"broken\.csv"):
        load_examples(_write(tmp_path, f"path,label\n{bad},idle\n"))


def test_missing_device_index(shared_data: Path, tmp_path: Path) -> None:
    p = _write(tmp_path, f"path,gpu_index,label\n{shared_data / SG},7,idle\n")
    with pytest.raises(InputError, match="device 7"):
        load_examples(p)


def test_no_labels_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"labels\.csv"):
        load_examples(tmp_path)


def test_spreadsheet_bom_blank_lines_and_bad_bytes(tmp_path: Path) -> None:
    """A "CSV UTF-8" export starts with a BOM; a bad row is named by its line in the file, blank lines
    counted; bytes that are not UTF-8 are one InputError naming their line, not a UnicodeDecodeError."""
    p = tmp_path / "labels.csv"
    p.write_bytes(b"\xef\xbb\xbfpath,label\nx.csv,idle\n")
    assert [(r.path.name, r.label) for r in read_labels(p)] == [("x.csv", "idle")]
    p.write_bytes(b"path,label\nx.csv,idle\n\ny.csv,sleeping\n")
    with pytest.raises(InputError, match="line 4, column label"):
        read_labels(p)
    p.write_bytes(b"path,label\nx.csv,idle\nx.csv,train\xffing\n")
    with pytest.raises(InputError, match=r"labels\.csv: line 3: expected UTF-8 text"):
        read_labels(p)


def test_a_span_that_holds_no_sample_is_an_error(shared_data: Path, tmp_path: Path) -> None:
    """A row whose span is on another clock (Unix seconds for a SensorGuard file, which runs on its raw
    clock) used to be dropped without a word: the model was fitted and evaluated on less than the table."""
    unix_span = "1756565000,1756566000"
    p = _write(tmp_path, f"path,gpu_index,t_from,t_to,label\n{shared_data / SG},3,{unix_span},idle\n")
    with pytest.raises(InputError, match=r"line 2, columns t_from/t_to: expected a span holding samples of "
                                         r"nvml\.csv \(its clock runs 91390\.749\.\.91605\.725\)"):
        load_examples(p)
