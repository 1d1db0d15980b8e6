"""Reader rules a mutation audit found untested, on real files (or real files' rows, reshaped): a dmon
time-of-day log across midnight, SPAR's energy in millijoules, the Alibaba join's containers and file-name
fallback, and the `interval` of an nvidia-smi file without a clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phasescope.sources.replay import alibaba, read, spar
from phasescope.sources.replay import nvidia_smi_dmon as dmon
from tests.sources.replay.test_alibaba import DUTY
from tests.sources.replay.test_spar import BERT

DMON_TD = (
    "formats/nvidia-smi-dmon/XueSongTap__XueSongTap.github.io__2024-01-04-nvidia-smi-more_dmon-mutc-TD.txt"
)


def test_dmon_time_of_day_log_across_midnight_keeps_counting(shared_data: Path, tmp_path: Path) -> None:
    """The real `-o TD` log with its Date column dropped (as `-o T` writes it) and its six rows moved to
    23:59:57 .. 00:00:02: one second apart throughout, not a day back at midnight."""
    lines = (shared_data / DMON_TD).read_text().splitlines()
    clock = ["23:59:57", "23:59:58", "23:59:59", "00:00:00", "00:00:01", "00:00:02"]
    out = ["#" + lines[0].split(None, 1)[1], "#" + lines[1].split(None, 1)[1]]
    rows = [ln for ln in lines[2:] if ln.strip()]
    assert len(rows) == len(clock)
    for ln, hms in zip(rows, clock, strict=True):
        _date, _time, rest = ln.split(None, 2)
        out.append(f" {hms}   {rest}")
    p = tmp_path / "dmon-T.txt"
    p.write_text("\n".join(out) + "\n")
    (t,) = dmon.read(p)
    assert t.meta["clock"] == "time_of_day"
    assert np.diff(t.time).tolist() == [1.0] * 5
    assert t.time[3] - t.time[0] == 3.0  # midnight is crossed between rows 3 and 4
    assert t["mem_used"][0] == 239 * 1024**2  # the rest of the row still reads as before


def test_spar_energy_is_millijoules(shared_data: Path, tmp_path: Path) -> None:
    table = pq.read_table(shared_data / BERT)
    mj = 1_000.0 * np.arange(table.num_rows) + 5e6  # a counter at 5000 J, +1 J per row
    pq.write_table(table.append_column("energy_mj", pa.array(mj)), tmp_path / "x.parquet")
    (t,) = spar.read(tmp_path / "x.parquet")
    assert t["energy"][0] == pytest.approx(5000.0)
    assert np.diff(t["energy"]) == pytest.approx(np.ones(table.num_rows - 1))


def test_alibaba_containers_sampled_at_the_same_time_stay_apart(tmp_path: Path) -> None:
    """Container 114.. sampled at 10 and 20 s, container 23b.. at 20 and 30 s: in (container, time) order
    the first one's last time equals the second one's first, yet they are two samples of two containers."""
    a, b = "11415d99a127e215d2148a1f6600007f", "23b8eba99c14e73d454503a55ae96989"
    rows = [(50.0, 10.0, a), (60.0, 20.0, a), (70.0, 20.0, b), (80.0, 30.0, b)]
    p = tmp_path / "pod_gpu_duty_cycle_anon.csv"
    p.write_text("value,timestamp_anon,container_ip\n" + "".join(f"{v},{t},{c}\n" for v, t, c in rows))
    ta, tb = alibaba.read(p)
    assert (ta.meta["container_ip"], tb.meta["container_ip"]) == (a, b)
    assert ta.time.tolist() == [10.0, 20.0] and ta["gpu_util"].tolist() == pytest.approx([0.5, 0.6])
    assert tb.time.tolist() == [20.0, 30.0] and tb["gpu_util"].tolist() == pytest.approx([0.7, 0.8])


def test_alibaba_renamed_duty_cycle_file_is_still_percent(shared_data: Path, tmp_path: Path) -> None:
    lines = (shared_data / DUTY).read_text().splitlines()[:400]
    p = tmp_path / "gpu_duty_cycle_export.csv"  # not the published name: told by "duty" in it
    p.write_text("\n".join(lines) + "\n")
    traces = alibaba.read(p)
    values = np.concatenate([t["gpu_util"] for t in traces])
    raw = np.array([float(ln.split(",")[0]) for ln in lines[1:]])
    assert raw.max() > 1.0  # percent in the file
    assert np.nanmax(values) == pytest.approx(raw.max() / 100)


def test_a_sweep_file_without_a_clock_is_timed_by_the_interval_option(tmp_path: Path) -> None:
    """Rows of one GPU with no timestamp column: row k is sweep k, `interval` seconds apart."""
    p = tmp_path / "q.csv"
    p.write_text("index, uuid, utilization.gpu [%], power.draw [W]\n"
                 + "".join(f"0, GPU-aaaa-1, {50 + k}, {100.0 + k}\n" for k in range(4)))
    (t,) = read(p, "nvidia-smi-csv:interval=5")
    assert t.meta["clock"] == "sweep"
    assert t.time.tolist() == [0.0, 5.0, 10.0, 15.0]
    (default,) = read(p, "nvidia-smi-csv")
    assert default.time.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_phasescope_recording_names_its_run_and_clock() -> None:
    """FORMATS.md: every trace has meta["run"] (the file stem) and meta["clock"]; our own recordings too."""
    path = Path(__file__).resolve().parents[3] / "data/h200/1hz/train_mlp.parquet"
    (trace,) = read(path)
    assert trace.meta["run"] == "train_mlp" and trace.meta["clock"] == "unix"
