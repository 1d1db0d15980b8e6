"""A time no clock gives (a millisecond stamp past ~7e19, a year-9999 date, a nanosecond epoch read as
seconds) is one clear error, for every reader: each case is a real file with only its times edited.

A DCGM capture stamped 8e19 ms used to end `verify` in an OSError traceback (time.gmtime of 8e16 s);
a year-9999 nvidia-smi log or a nanosecond SPAR epoch was read without a word."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phasescope.errors import InputError
from phasescope.sources.replay import detect, read

FORMATS = "formats"
DCGM = f"{FORMATS}/dcgm-exporter-prom/cncf__k8s-ai-conformance__ericsson-ccd_accelerator_metrics.prom"
XUESONG = "XueSongTap__XueSongTap.github.io__2024-01-04-nvidia-smi-more"
SMI_CSV = f"{FORMATS}/nvidia-smi-csv/{XUESONG}_gpu-log.csv"
DMON = f"{FORMATS}/nvidia-smi-dmon/{XUESONG}_dmon-mutc-TD.txt"
SENSORGUARD = "sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01"
ALIBABA = "alibaba-gentd26"
EXPECTED = "time: expected a Unix time in seconds up to 2100-01-01 (or a log's own clock from 0)"


def _dcgm(stamp: str) -> Callable[[Path, Path], Path]:
    def make(data: Path, tmp: Path) -> Path:
        lines = [ln + f" {stamp}" for ln in (data / DCGM).read_text().splitlines()
                 if ln.startswith("DCGM_")]
        out = tmp / "dcgm.prom"
        out.write_text("\n".join(lines) + "\n")
        return out

    return make


def _text(rel: str, name: str, old: str, new: str) -> Callable[[Path, Path], Path]:
    def make(data: Path, tmp: Path) -> Path:
        text = (data / rel).read_text()
        assert old in text
        out = tmp / name
        out.write_text(text.replace(old, new))
        return out

    return make


def _sensorguard(data: Path, tmp: Path) -> Path:
    run = tmp / Path(SENSORGUARD).name
    shutil.copytree(data / SENSORGUARD, run)
    csv = run / "nvml.csv"
    csv.chmod(0o644)
    # Its time is the receipt on the monotonic raw clock (the UTC anchor only goes into the metadata).
    csv.write_text(csv.read_text().replace(",8202.960792117,", ",8e16,", 1))
    return csv


def _alibaba(data: Path, tmp: Path) -> Path:
    """Both files of the pair (the reader joins them), first 400 rows, stamps in nanoseconds."""
    for name in ("pod_gpu_duty_cycle_anon.csv", "pod_gpu_memory_used_bytes_anon.csv"):
        lines = (data / ALIBABA / name).read_text().splitlines()[:400]
        stamped = [re.sub(r"(?<![\w.])(1\d{9})\.0(?![\w.])", r"\g<1>000000000.0", ln) for ln in lines[1:]]
        (tmp / name).write_text("\n".join([lines[0], *stamped]) + "\n")
    return tmp / "pod_gpu_duty_cycle_anon.csv"


def _spar(data: Path, tmp: Path) -> Path:
    src = sorted((data / "spar-a100").glob("*.parquet"))[0]
    table = pq.read_table(src)
    i = table.schema.get_field_index("timestamp_epoch")
    ns = pa.array(table.column(i).to_numpy() * 1e9)  # a nanosecond epoch where seconds belong
    out = tmp / src.name
    pq.write_table(table.set_column(i, "timestamp_epoch", ns), out)
    return out


def _phasescope(data: Path, tmp: Path) -> Path:
    from phasescope.store.recording import RecordingWriter
    from tests.store.test_recording import RUN, _replayed_ticks, _write

    rec = tmp / "rec.parquet"
    w: RecordingWriter = _write(rec, _replayed_ticks(read(data / RUN))[:20])
    assert w.closed
    table = pq.read_table(rec)
    i = table.schema.get_field_index("time")
    us = pa.array(table.column(i).to_numpy() * 1e6)  # microseconds where seconds belong
    pq.write_table(table.set_column(i, table.schema.field(i), us), rec)
    return rec


CASES: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "dcgm-prom ms past 7e19": (_dcgm("80000000000000000000"), "dcgm-prom"),
    "dcgm-prom ms before 1970": (_dcgm("-80000000000000000000"), "dcgm-prom"),
    "nvidia-smi-csv year 9999": (_text(SMI_CSV, "gpu.csv", "2024/01/", "9999/01/"), "nvidia-smi-csv"),
    "nvidia-smi-dmon year 9999": (_text(DMON, "dmon.txt", " 20240104 ", " 99990104 "), "nvidia-smi-dmon"),
    "sensorguard receipt 8e16 s": (_sensorguard, "sensorguard"),
    "alibaba ns stamps": (_alibaba, "alibaba-gentd26"),
    "spar ns epoch": (_spar, "spar"),
    "phasescope us times": (_phasescope, "phasescope"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_reader_refuses_a_time_no_clock_gives(case: str, shared_data: Path, tmp_path: Path) -> None:
    make, fmt = CASES[case]
    path = make(shared_data, tmp_path)
    assert detect(path) == fmt  # still recognised: it is the time that is wrong, not the format
    with pytest.raises(InputError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: ") and EXPECTED in str(err.value), str(err.value)
    assert "sample 1 of " in str(err.value)


def test_verify_on_a_dcgm_capture_stamped_past_7e19_ms_is_one_line(shared_data: Path, tmp_path: Path) -> None:
    path = _dcgm("80000000000000000000")(shared_data, tmp_path)
    cmd = [sys.executable, "-m", "phasescope", "verify", "--declare", "no-training", "--input", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-800:]
    assert proc.stderr.count("\n") == 1 and EXPECTED in proc.stderr and "got 8e+16" in proc.stderr


def test_times_at_the_edges_are_read(shared_data: Path, tmp_path: Path) -> None:
    """A log's own clock from 0 (no dates) and real 2026 stamps stay readable."""
    traces = read(_dcgm("1780000000000")(shared_data, tmp_path))
    assert all(np.all(t.time == 1_780_000_000.0) for t in traces)
    undated = tmp_path / "undated.prom"
    undated.write_text("\n".join(ln for ln in (shared_data / DCGM).read_text().splitlines()
                                 if ln.startswith("DCGM_")) + "\n")
    assert all(np.all(t.time == 0.0) for t in read(undated))
