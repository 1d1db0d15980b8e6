"""`phasescope run`'s device energy is kpi/energy.py's: on the same samples it equals the offline figure.

`DeviceWatch` used to sum power trapezoids itself: NVML's energy counter ignored, and a gap in the readings
bridged whatever its length (a real H100 trace with ~2 s dropouts at 10 Hz read 21% more than `cost energy`
gives on the same ticks). These tests replay real recordings: through a clock the test moves (every tick of
the file through the watch's tick loop, no sleeping) against `kpi.energy.device_energy` on the very ticks the
watch took, and end to end through the CLI against the file's own energy counter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phasescope.cli.run import DeviceWatch
from phasescope.kpi.energy import device_energy
from phasescope.schema import SIGNAL_NAMES, TickBatch, Trace
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from tests.instrument import runner

REPO = Path(__file__).resolve().parents[2]
H200_COUNTER = REPO / "data" / "h200" / "10hz" / "other_bursty.parquet"  # NVML energy counter, 10 Hz
H200_1HZ = REPO / "data" / "h200" / "1hz" / "other_bursty.parquet"
H100_GAPS = Path("nvidia-smi-h100-training") / "power-trace_2025-07-26-23-32-09.csv"  # power only, gaps
NO_POWER = Path("formats") / "nvidia-smi-csv-noheader" / "dst915__llama.cpp__gpu_stats.csv"


def _watch_replay(path: Path, interval_s: float) -> tuple[DeviceWatch, list[TickBatch]]:
    """Every tick of a replay of `path`, one each `interval_s` of its clock, fed through the watch's tick
    loop as its sampler thread would, until the replay ends."""
    clock = [0.0]
    source = ReplaySource(read(path, "auto"), path=str(path), clock=lambda: clock[0],
                          wall_clock=lambda: 1.7e9)
    watch = DeviceWatch(f"replay:{path}", interval_s)
    loop = watch.attach(source)
    ticks = []
    while True:
        batch = source.read()
        if source.exhausted:
            break
        loop.on_tick(batch)
        ticks.append(batch)
        clock[0] += interval_s
    return watch, ticks


def _same_samples(ticks: list[TickBatch], row: int) -> Trace:
    """The ticks the watch took, as the recording `phasescope record` would have written of them."""
    return Trace(ticks[0].devices[row], [b.time for b in ticks],
                 {s: [b.values[row, i] for b in ticks] for i, s in enumerate(SIGNAL_NAMES)})


def _assert_offline(device: dict[str, Any], trace: Trace) -> None:
    offline = device_energy(trace)
    assert device["energy_j"] == pytest.approx(offline.joules, rel=1e-9)
    energy = device["energy"]
    assert energy["method"] == offline.method and energy["joules"] == device["energy_j"]
    assert energy["covered_s"] == pytest.approx(offline.covered_s, abs=1e-6)
    assert energy["span_s"] == pytest.approx(offline.span_s, abs=1e-6)
    assert energy["resets"] == offline.resets


def test_gaps_in_the_readings_are_not_bridged(shared_data: Path) -> None:
    """A real 10 Hz H100 trace (8 GPUs, power only) with ~2 s dropouts every few seconds: over 100 s of the
    first GPU's ~700 s are gaps. The old sum bridged them: about 21% more than offline on the same ticks."""
    watch, ticks = _watch_replay(shared_data / H100_GAPS, 0.1)
    devices = watch.finish()["devices"]
    assert len(devices) == len(ticks[0].devices) == 8
    for row, device in enumerate(devices):
        assert device["uuid"] == ticks[0].devices[row].uuid
        _assert_offline(device, _same_samples(ticks, row))
        assert device["energy"]["method"] == "integrated_power"
        assert 0.5 < device["energy"]["coverage"] < 0.95  # the gaps stay uncovered, and are said
    first = devices[0]
    assert first["energy"]["uncovered_s"] > 100
    (note,) = [n for n in watch.notes if n.startswith("energy covers only part")]
    assert f"{first['uuid']} 83% of 699 s" in note and note.count("% of ") == 8, note


def test_the_energy_counter_is_used_where_the_gpu_has_one() -> None:
    """Our H200 recording has NVML's total-energy counter: the run's figure is the counter's, exactly the
    file's `cost energy` figure; the old power sum said 10,468 J against the counter's 10,446 J."""
    watch, ticks = _watch_replay(H200_COUNTER, 0.1)
    (device,) = watch.finish()["devices"]
    _assert_offline(device, _same_samples(ticks, 0))
    whole_file = device_energy(read(H200_COUNTER, "auto")[0])
    assert device["energy"]["method"] == whole_file.method == "counter"
    assert device["energy_j"] == pytest.approx(whole_file.joules, rel=1e-12)
    assert device["energy"]["coverage"] == pytest.approx(1.0)
    assert not [n for n in watch.notes if n.startswith("energy covers")]


def test_a_device_without_power_or_energy_is_unknown_not_zero(shared_data: Path) -> None:
    """nvidia-smi CSV logged without power.draw: energy is not measured (None), never 0 J."""
    watch, ticks = _watch_replay(shared_data / NO_POWER, 1.0)
    devices = watch.finish()["devices"]
    assert devices and len(ticks) > 10
    for device in devices:
        assert device["energy"]["method"] == "none"
        assert device["energy_j"] is None and device["energy"]["joules"] is None
        assert device["energy"]["coverage"] == 0.0  # as `cost energy --json` says it: nothing covered
        assert device["gpu_util_mean"] is not None  # the rest of the telemetry is still there


def test_run_reports_the_counters_energy_end_to_end(tmp_path: Path) -> None:
    """`phasescope run --source replay:...` on a real H200 recording: JSON, summary and HTML give the
    counter's figure, its method and coverage."""
    out, report = tmp_path / "run.json", tmp_path / "run.html"
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", f"replay:{H200_1HZ}?speed=10",
           "--interval", "0.1", "--json", str(out), "--report", str(report), "--",
           sys.executable, "-c", "import time; time.sleep(4)"]
    proc = subprocess.run(cmd, env=runner.run_env(tmp_path / "cache"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    (device,) = json.loads(out.read_text())["telemetry"]["devices"]
    # The watch read the counter at (nearly) the file's first and last samples: the figure is exactly one
    # of the file's own counter differences, over (nearly) all of it. The old power sum was none of them.
    counter = read(H200_1HZ, "auto")[0]["energy"]
    n = counter.size
    spans = {(i, j): counter[j] - counter[i] for i in range(2) for j in range(n - 2, n)}
    assert any(np.isclose(device["energy_j"], d, rtol=1e-12, atol=0) for d in spans.values()), (
        device["energy_j"], spans)
    energy = device["energy"]
    assert energy["method"] == "counter" and device["energy_j"] == energy["joules"]
    assert 0 < energy["covered_s"] <= energy["span_s"] and 0 < energy["coverage"] <= 1
    assert "counter" in proc.stderr and f"{device['energy_j']:,.0f} J" in proc.stderr
    html = report.read_text()
    assert "<th>method</th>" in html and f"{device['energy_j']:,.0f} J" in html
    # ... and the device over the run: utilisation, memory and power charts (issue 19 item 5)
    series = device["series"]
    assert len(series["t"]) == device["samples"] == len(series["power"])
    assert series["t"] == sorted(series["t"])
    assert 'id="telemetry-0"' in html and "utilisation (%)" in html and "power (W)" in html


def test_the_runs_telemetry_series_stays_bounded(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tick while few; past SERIES_POINTS every other point goes and the stride doubles, so a week-long
    run holds as many points as an hour's, evenly spread."""
    import phasescope.cli.run as run

    monkeypatch.setattr(run, "SERIES_POINTS", 16)
    watch, ticks = _watch_replay(shared_data / H100_GAPS, 0.5)
    device = watch.finish()["devices"][0]
    series = device["series"]
    assert 8 <= len(series["t"]) < 16 and len(ticks) > 100
    stride = round((series["t"][1] - series["t"][0]) / 0.5)
    assert stride & (stride - 1) == 0 and stride > 1  # a power of two
    assert np.allclose(np.diff(series["t"]), stride * 0.5)
    row = [b.values[0, SIGNAL_NAMES.index("power")] for b in ticks[::stride]][: len(series["t"])]
    assert [None if not np.isfinite(v) else v for v in row] == series["power"]


def test_a_config_that_cannot_be_read_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    """The gap rule comes from the config file (as `cost energy`'s): a bad one is one line, nothing runs."""
    marker = tmp_path / "ran"
    env = runner.run_env(tmp_path / "cache")
    env["PHASESCOPE_CONFIG"] = str(tmp_path / "no-such-config.toml")
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", f"replay:{H200_1HZ}", "--report", "-",
           "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no-such-config.toml" in proc.stderr
    assert not marker.exists()
