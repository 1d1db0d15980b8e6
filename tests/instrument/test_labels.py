"""Labels from hooks in the columns of the shared labels.csv, on the recording's device index."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from torch import nn

from phasescope.instrument import events as ev
from phasescope.instrument.hooks import Recorder
from phasescope.instrument.labels import LABEL_COLUMNS, label_rows, write_labels_csv
from phasescope.schema import DeviceInfo
from tests.instrument.tiny_training import train_then_eval


def test_rows_follow_labels_csv_and_segments(tmp_path: Path, shared_data: Path) -> None:
    with open(shared_data / "labels.csv", newline="") as fh:
        assert tuple(next(csv.reader(fh))) == LABEL_COLUMNS

    train_then_eval(tmp_path / "events", steps=3)
    host = ev.device_for_host()
    devices = [DeviceInfo(uuid="GPU-other", index=0), DeviceInfo(uuid=host, name="cpu", index=1)]
    rows = label_rows(tmp_path / "events", "rec.parquet", devices, family="mlp", run="r1")
    assert [r["label"] for r in rows] == ["training", "inference"]
    assert {r["gpu_index"] for r in rows} == {1}
    assert float(rows[0]["t_to"]) <= float(rows[1]["t_from"])
    out = write_labels_csv(rows, tmp_path / "labels.csv")
    write_labels_csv(rows[:1], out)  # append keeps one header
    with open(out, newline="") as fh:
        read = list(csv.DictReader(fh))
    assert [r["label"] for r in read] == ["training", "inference", "training"]
    assert read[0]["path"] == "rec.parquet" and read[0]["run"] == "r1"


def test_device_not_in_recording_is_left_out(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "events", flush_s=0)
    rec.install()
    try:
        with torch.no_grad():
            nn.Linear(2, 2)(torch.ones(1, 2))
    finally:
        rec.uninstall()
    devices = [DeviceInfo(uuid="GPU-a", index=0), DeviceInfo(uuid="GPU-b", index=1)]
    assert label_rows(tmp_path / "events", "x.parquet", devices) == []
    # A one-device recording takes the CPU process's segments.
    assert len(label_rows(tmp_path / "events", "x.parquet", devices[:1])) == 1


def test_appending_keeps_a_site_table_readable(tmp_path: Path) -> None:
    """`record --label-from-hooks` appends to the labels.csv beside the recording. A hand-edited table used to
    be corrupted: its unterminated last line swallowed the first new row, and under a header of other columns
    (only the required `path,label`, or another order) the new values landed in the wrong columns."""
    row = {c: "" for c in LABEL_COLUMNS} | {"path": "new.parquet", "gpu_index": 0, "t_from": "1.000",
                                             "t_to": "2.000", "label": "training", "run": "new"}
    out = tmp_path / "labels.csv"
    out.write_text("path,gpu_index,t_from,t_to,label\r\nold.parquet,0,5,6,idle")  # no final line break
    write_labels_csv([row], out)
    with open(out, newline="") as fh:
        read = list(csv.DictReader(fh))
    assert [(r["path"], r["label"]) for r in read] == [("old.parquet", "idle"), ("new.parquet", "training")]
    assert read[1]["t_from"] == "1.000" and read[1]["run"] == "new" and read[0]["run"] == ""

    out.write_text("\ufefflabel,path\nidle,old.parquet\n")  # the required columns only, in another order
    write_labels_csv([row], out)
    with open(out, newline="") as fh:
        read = list(csv.DictReader(fh))
    assert [(r["path"], r["label"], r["t_to"]) for r in read] == [
        ("old.parquet", "idle", ""), ("new.parquet", "training", "2.000")]
