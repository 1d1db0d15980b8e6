"""Issue 21, items 5 and 6: impossible readings and backwards clock steps in real files.

A reading no GPU can give (1e308 W, -50 W, 150 % utilisation) is dropped to NaN with one warning line, so
no joule, cost or verdict is computed from it; a time that goes backwards is a clock step where the trace
is cut, never re-sorted into the earlier data. Both through the real command line on real SensorGuard
runs copied and mutated in tmp_path.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phasescope.errors import InputError
from phasescope.schema import RANGES, SIGNALS, impossible
from phasescope.sources.replay import read

RUN = "sensorguard-rtx3090/20260824_train_resnet_cifar10_verifier-gpu0_s0_r01"  # GPU 0 trains, GPU 1 idles
IDLE_RUN = "sensorguard-rtx3090/20260824_calib-idle_verifier-gpu0_s0_r01"


def _copy_run(shared: Path, run: str, dest: Path) -> Path:
    dest.mkdir()
    for f in (shared / run).iterdir():
        shutil.copyfile(f, dest / f.name)
    return dest


def _rows(run: Path) -> tuple[list[str], list[list[str]]]:
    with (run / "nvml.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def _write_rows(run: Path, header: list[str], rows: list[list[str]]) -> None:
    with (run / "nvml.csv").open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\r\n").writerows([header, *rows])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, "-m", "phasescope", *args], capture_output=True, text=True,
                          timeout=300, env=env, check=False)


def _json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def runs(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(clean copy, mutated copy) of a real run: on GPU 1 (idle) two rows in three read 150 % utilisation
    and -50 W, enough to pull its energy below zero; on GPU 0 one row reads 1e308 W."""
    base = tmp_path_factory.mktemp("impossible")
    clean = _copy_run(shared_data, RUN, base / "clean")
    bad = _copy_run(shared_data, RUN, base / "bad")
    header, rows = _rows(bad)
    gpu, util, power = header.index("gpu_index"), header.index("util_gpu_pct"), header.index("power_w")
    k = 0
    for row in rows:
        if row[gpu] == "1":
            k += 1
            if k % 3:
                row[util], row[power] = "150", "-50"
    next(r for r in rows[100:] if r[gpu] == "0")[power] = "1e308"
    _write_rows(bad, header, rows)
    return clean, bad


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "impossible value" in line]


def test_every_range_is_in_schema_and_no_real_file_breaks_one(shared_data: Path) -> None:
    assert set(RANGES) == set(SIGNALS)  # one range per signal, defined once
    assert impossible("power", [np.nan, 0.0, 700.0, -50.0, 1e308, math.inf]).tolist() == [
        False, False, False, True, True, True]
    assert impossible("gpu_util", [1.0, 1.004, 1.5]).tolist() == [False, False, True]
    for run in (RUN, IDLE_RUN):  # real readings, training and idle, are all inside
        for t in read(shared_data / run):
            for name, col in t.columns.items():
                assert not impossible(name, col).any(), (run, name)


def test_cost_has_no_inf_no_negative_joules_and_one_warning(runs: tuple[Path, Path]) -> None:
    clean, bad = runs
    done = _cli("cost", "energy", str(bad), "--price-kwh", "0.12", "--json")
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr and "overflow" not in done.stderr
    said = _warnings(done.stderr)
    assert len(said) == 1, done.stderr
    assert "power" in said[0] and "gpu_util" in said[0] and str(bad) in said[0]
    header, rows = _rows(bad)
    status, util = header.index("status"), header.index("util_gpu_pct")
    mutated = sum(1 for r in rows if r[status] == "ok" and r[util] == "150")
    # Each mutated row: its utilisation and its power; plus the one 1e308 W.
    assert f": {2 * mutated + 1} impossible value(s) dropped" in said[0]
    assert "gpu 1 sample 1, 2, 4, ..." in said[0]
    got = {d["device"]: d for d in _json_lines(done.stdout)}
    ref = {d["device"]: d for d in _json_lines(_cli("cost", "energy", str(clean), "--price-kwh", "0.12",
                                                    "--json").stdout)}
    assert got.keys() == ref.keys()
    for dev, d in got.items():
        assert math.isfinite(d["joules"]) and d["joules"] > 0, dev
        assert all(p["joules"] is None or p["joules"] >= 0 for p in d["phases"].values()), dev
        assert 0 <= d["cost"]["energy_usd"] < 1, dev
        assert "inf" not in json.dumps(d).lower()
        # What is left is the device's real draw: the dropped samples are gaps (less coverage), not zeros.
        assert d["mean_power_w"] == pytest.approx(ref[dev]["mean_power_w"], rel=0.05), dev
        assert d["coverage"] <= ref[dev]["coverage"]


def test_classify_and_verify_verdicts_match_the_clean_file(runs: tuple[Path, Path]) -> None:
    clean, bad = runs
    # Today's code called the idle GPU "other" from the 150 % rows: an 'idle' claim flipped to inconsistent.
    for args in (("classify", "--json"), ("verify", "--declare", "idle", "--json", "--input")):
        ref = _cli(*args, str(clean))
        done = _cli(*args, str(bad))
        assert done.returncode == ref.returncode, done.stderr
        assert len(_warnings(done.stderr)) == 1, done.stderr
        assert "RuntimeWarning" not in done.stderr
        keys = ("label",) if args[0] == "classify" else ("verdict", "phase_seconds")
        got = [(d["device"], *(d[k] for k in keys)) for d in _json_lines(done.stdout) if "device" in d]
        want = [(d["device"], *(d[k] for k in keys)) for d in _json_lines(ref.stdout) if "device" in d]
        assert got == want and len(want) == 2, args[0]


def test_a_backwards_step_splits_the_trace_and_says_so(shared_data: Path, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """An idle run whose second half was stamped 5000 s earlier (a clock stepped back): today's readers
    sorted those samples in front of the first half; now GPU 0's trace is cut there into two, each in
    file order, with one line naming the device and the place."""
    run = _copy_run(shared_data, IDLE_RUN, tmp_path / "run")
    header, rows = _rows(run)
    col = header.index("t_receipt_raw_s")
    gpu = header.index("gpu_index")
    ok = [i for i, r in enumerate(rows) if r[header.index("status")] == "ok" and r[gpu] == "0"]
    cut = ok[len(ok) // 2]
    for r in rows[cut:]:
        if r[gpu] == "0":
            r[col] = f"{float(r[col]) - 5000.0:.9f}"
    _write_rows(run, header, rows)
    clean = {t.device.uuid: t for t in read(shared_data / IDLE_RUN)}

    with caplog.at_level("WARNING", logger="phasescope.sources.replay"):
        traces = read(run)
    said = [r.getMessage() for r in caplog.records if "clock step" in r.getMessage()]
    assert len(said) == 1 and "gpu 0" in said[0] and "4999.000 s back" in said[0]  # 5000 s less 1 s apart
    first = clean[next(iter(clean))]
    parts = [t for t in traces if t.device.uuid.startswith(first.device.uuid)]
    assert [p.device.uuid for p in parts] == [first.device.uuid, f"{first.device.uuid}/clock2"]
    assert parts[1].meta["clock_step"] == 1
    for p in parts:
        assert np.all(np.diff(p.time) >= 0)
    assert len(parts[0]) + len(parts[1]) == len(first)
    n0 = len(parts[0])
    np.testing.assert_array_equal(parts[0].time, first.time[:n0])  # the first run as it was
    # The rest, kept in file order.
    np.testing.assert_allclose(parts[1].time, first.time[n0:] - 5000.0, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(parts[1]["power"], first["power"][n0:])
    # GPU 1 had no step: one trace, unchanged.
    other = [t for t in traces if t.device.uuid not in {p.device.uuid for p in parts}]
    assert len(other) == 1 and len(other[0]) == len(clean[other[0].device.uuid])


def test_a_backwards_step_through_the_cli_is_said_in_one_line(shared_data: Path, tmp_path: Path) -> None:
    """The H100 nvidia-smi log with a spliced step: the rows of its last fifth stamped 10 minutes early."""
    src = shared_data / "nvidia-smi-h100-training" / "ckpt1.csv"
    lines = src.read_text().splitlines(keepends=True)
    cut = 1 + 4 * (len(lines) - 1) // 5
    out = []
    for i, line in enumerate(lines):
        if i >= cut:
            stamp, rest = line.split(",", 1)
            early = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f") - timedelta(minutes=10)
            line = f"{early:%Y/%m/%d %H:%M:%S.%f}"[:-3] + "," + rest
        out.append(line)
    path = tmp_path / "ckpt1-stepped.csv"
    path.write_text("".join(out))
    # Its 8 GPUs interleave without an index: the count is given (the sweep cannot tell across a step).
    done = _cli("cost", "energy", str(path), "--format", "nvidia-smi-csv:gpus=8", "--json")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "clock step" in line]
    assert len(said) == 1 and str(path) in said[0]
    devices = [d["device"] for d in _json_lines(done.stdout)]
    assert any(d.endswith("/clock2") for d in devices)
    assert len(devices) == 2 * len({d.split("/clock")[0] for d in devices})


def test_dcgm_scrapes_stamped_backwards_are_refused_in_one_line(shared_data: Path, tmp_path: Path) -> None:
    """dcgm-prom joins all series of a GPU by time, so it cannot cut at a step: it refuses the file, where
    today's reader sorted the later scrape in front of the earlier one."""
    src = shared_data / "formats/dcgm-exporter-prom/cncf__k8s-ai-conformance__kops_TestObservability_" \
                        "AcceleratorMetrics_ViaDCGM_output.prom"
    samples = [line for line in src.read_text().splitlines() if line and not line.startswith("#")]

    def scrapes(*stamps_ms: int) -> Path:
        path = tmp_path / f"scrapes-{'-'.join(map(str, stamps_ms))}.prom"
        path.write_text("".join(f"{line} {ms}\n" for ms in stamps_ms for line in samples))
        return path

    forward = read(scrapes(1_700_000_000_000, 1_700_000_015_000))
    assert [len(t) for t in forward] == [2] * len(forward)
    with pytest.raises(InputError) as refused:
        read(scrapes(1_700_000_015_000, 1_700_000_000_000))
    msg = str(refused.value)
    assert "\n" not in msg and "clock step" in msg and "gpu 0" in msg
    assert "t=1700000000.000 s after t=1700000015.000 s" in msg


def test_alibaba_rows_stamped_backwards_are_refused_in_one_line(shared_data: Path, tmp_path: Path) -> None:
    """alibaba-gentd26 joins its two files by time, so it cannot cut at a step either: a container whose
    time goes back is refused, naming the row; the same rows in order read."""
    lines = (shared_data / "alibaba-gentd26" / "pod_gpu_duty_cycle_anon.csv").read_text().splitlines()[:3001]
    value, stamp, container = lines[1].split(",")
    path = tmp_path / "pod_gpu_duty_cycle_anon.csv"
    path.write_text("\n".join(lines) + "\n")
    assert container in {t.meta["container_ip"] for t in read(path)}
    path.write_text("\n".join([*lines, f"{value},{float(stamp) - 60:.1f},{container}"]) + "\n")
    with pytest.raises(InputError) as refused:
        read(path)
    msg = str(refused.value)
    assert "\n" not in msg and "row 3001, field 'timestamp_anon'" in msg and container in msg
    assert f"{float(stamp) - 60:.0f} after" in msg and "clock step" in msg
