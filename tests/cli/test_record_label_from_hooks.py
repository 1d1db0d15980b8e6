"""`phasescope record --label-from-hooks -- CMD`: a real CPU training and inference run, recorded with the
host source, labelled from the hooks, and read back by `phasescope eval`."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from phasescope.classify.lab import train
from phasescope.cli.evaluate import command as eval_command
from phasescope.store.recording import read_manifest
from tests.instrument import runner
from tests.instrument.runner import SCRIPTS


def _record(out: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "phasescope", "record", "-o", str(out), "--source", "host",
           "--interval", "0.1", "--quiet", "--label-from-hooks", "--family", "mlp_cpu", "--",
           sys.executable, str(SCRIPTS / "timed_phase.py"), *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_training_and_inference_runs_become_labelled_recordings(tmp_path: Path) -> None:
    env = runner.run_env(tmp_path / "cache")
    # both at once: each is mostly waiting for `import torch`
    procs = {"train": _record(tmp_path / "train.parquet", env, "train", "1.5", "3"),
             "infer": _record(tmp_path / "infer.parquet", env, "infer", "1.5")}
    results = {k: (p.communicate(timeout=120), p.returncode) for k, p in procs.items()}
    (_, err_train), code_train = results["train"]
    (_, err_infer), code_infer = results["infer"]
    assert code_train == 3, err_train  # the command's exit code, after the recording is written
    assert code_infer == 0, err_infer
    assert "Traceback" not in err_train + err_infer

    with open(tmp_path / "labels.csv", newline="") as fh:
        rows = {r["path"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"train.parquet", "infer.parquet"}  # one file, both appended under one header
    assert rows["train.parquet"]["label"] == "training" and rows["infer.parquet"]["label"] == "inference"
    for name, row in rows.items():
        manifest = read_manifest(tmp_path / name)
        t_from, t_to = float(row["t_from"]), float(row["t_to"])
        # the span lies inside the recording (same wall clock) and lasts about as long as the workload
        assert manifest["start"] <= t_from < t_to <= manifest["end"]
        assert 1.0 <= t_to - t_from <= 3.0
        assert row["run"] == Path(name).stem and row["family"] == "mlp_cpu" and row["rate_hz"] == "10"
    steps = int(rows["train.parquet"]["notes"].split(", ")[1].split()[0])
    out_train = results["train"][0][0]
    assert f"train: {steps} iterations" in out_train  # every optimizer step the script made was seen

    examples = train.load_data([str(tmp_path)])
    assert sorted(e.label for e in examples) == ["inference", "training"]
    assert all(len(e.trace) >= 10 for e in examples)  # 10 Hz over ~1.5 s
    res = CliRunner().invoke(eval_command, [str(tmp_path), "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["examples"] == 2 and doc["runs"] == 2 and doc["windows"] >= 2


def test_label_from_hooks_needs_a_command(tmp_path: Path) -> None:
    from phasescope.cli.record import command

    res = CliRunner().invoke(command, ["-o", str(tmp_path / "x.parquet"), "--source", "host",
                                       "--label-from-hooks"])
    assert res.exit_code == 2 and "expected a command to run after `--`" in res.output


def test_missing_command_is_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "phasescope", "record", "-o", str(tmp_path / "x.parquet"),
           "--source", "host",
           "--quiet", "--label-from-hooks", "--", str(tmp_path / "no-such-program")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 127 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("No such file or directory")
    assert not (tmp_path / "x.parquet").exists()


def test_recording_stops_when_the_command_exits(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "phasescope", "record", "-o", str(tmp_path / "x.parquet"),
           "--source", "host",
           "--interval", "0.1", "--quiet", "--", sys.executable, "-c", "import time; time.sleep(1.0)"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    manifest = read_manifest(tmp_path / "x.parquet")
    assert 0.5 <= manifest["duration_s"] <= 10
    assert not (tmp_path / "labels.csv").exists()  # no --label-from-hooks: no labels


def test_a_phase_without_a_sample_is_left_out_of_the_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Train, then a short evaluation between two ticks (0.1 s at the default 1 s interval): the row of that
    evaluation held no sample, and `phasescope eval` / `train-model` then refused the whole labels.csv."""
    import numpy as np

    from phasescope.cli.record import _write_labels
    from phasescope.instrument import events as ev
    from phasescope.instrument.labels import label_rows
    from phasescope.schema import SIGNAL_NAMES, DeviceInfo, TickBatch
    from phasescope.store.recording import RecordingWriter
    from tests.instrument.tiny_training import train_then_eval  # imports torch

    events = tmp_path / "events"
    train_then_eval(events, steps=20)
    device = DeviceInfo(uuid=ev.device_for_host(), name="cpu", index=0)
    train_row, eval_row = label_rows(events, "r.parquet", [device])
    t0, t1 = float(train_row["t_from"]), float(train_row["t_to"])
    out = tmp_path / "r.parquet"
    writer = RecordingWriter(out, source_spec="host", interval_s=1.0)
    # Ticks inside the training span, then one after the evaluation: none inside the evaluation's span.
    for t in [t0, (t0 + t1) / 2, float(eval_row["t_to"]) + 1.0]:
        values = np.full((1, len(SIGNAL_NAMES)), 0.5)
        writer.write(TickBatch(t, [device], values))
    writer.close()
    _write_labels(events, out, writer, "mlp")
    err = capsys.readouterr().err
    assert "1 phase(s) left out of the labels, no sample inside (inference" in err
    with open(tmp_path / "labels.csv", newline="") as fh:
        assert [r["label"] for r in csv.DictReader(fh)] == ["training"]
    examples = train.load_data([str(tmp_path)])  # what eval and train-model read: no row refused
    assert [e.label for e in examples] == ["training"]
