"""benchmarks/device/nvml_check.py: its --dry-run against the fake NVML writes every section, records a call
the fake makes fail (NVML error or Python error) instead of raising, and battery.py runs it first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "benchmarks" / "device" / "nvml_check.py"
BATTERY = REPO / "benchmarks" / "device" / "battery.py"
sys.path.insert(0, str(CHECK.parent))
import nvml_check  # noqa: E402

Run = tuple[dict[str, Any], subprocess.CompletedProcess[str]]


def _run(out: Path, shared_data: Path, *extra: str) -> Run:
    env = {**os.environ, "PHASESCOPE_SHARED_DATA": str(shared_data)}
    cmd = [sys.executable, str(CHECK), "--dry-run", "--out", str(out), "--ticks", "12", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    path = out / "nvml_check.json"
    assert path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(path.read_text()), done


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Run:
    """The fake answers Unknown to nvmlDeviceGetRemappedRows and NotSupported to the PCIe replay counter."""
    out = tmp_path_factory.mktemp("nvml_check")
    return _run(out, shared_data, "--fake-fail", "nvmlDeviceGetRemappedRows",
                "--fake-fail", "nvmlDeviceGetPcieReplayCounter:3")


@pytest.mark.slow
def test_every_section_is_written(failing: Run) -> None:
    report, done = failing
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in nvml_check.SECTIONS:
        assert report[name]["status"] == "ok", (name, report[name])
    assert report["summary"] and report["summary"][0].startswith("nvml_check on ")
    assert "\n".join(report["summary"]) in done.stdout  # the human summary, on stdout as in the file
    assert report["monitor"]["sleep"]["result"]["name"] == "nvml_check_sleep"
    calls = report["calls"]["devices"]["GPU 0"]["calls"]
    assert calls["nvmlDeviceGetPowerUsage"]["status"] == "ok"
    assert calls["nvmlDeviceGetPowerUsage"]["value"]["type"] == "int"
    assert calls["nvmlDeviceGetPowerUsage"]["latency"]["n"] == nvml_check.REPEAT


@pytest.mark.slow
def test_a_failing_call_is_recorded_not_raised(failing: Run) -> None:
    report, _ = failing
    health = report["health"]["GPU 0"]["calls"]
    remap = health["nvmlDeviceGetRemappedRows"]
    assert remap["status"] == "error" and remap["code"] == 999
    assert remap["error"] == "NVMLError_Unknown: Unknown Error"
    assert remap["phasescope"].startswith("counted")
    replays = health["nvmlDeviceGetPcieReplayCounter"]
    assert replays["status"] == "not_supported"
    assert replays["phasescope"] == "tried once, then skipped on this device"
    # The other health answers keep their shape: the ECC count an int, memory temperature a field value.
    assert health["nvmlDeviceGetTotalEccErrors(corrected,aggregate)"]["value"] == {"type": "int", "value": 5}
    field = health["nvmlDeviceGetFieldValues(memtemp)"]["value"]["items"][0]
    got = (field["fieldId"], field["valueType"], field["value_member"], field["value"])
    assert got == (82, 1, "uiVal", 41)
    # NvmlSource saw the same failures: counted, the unsupported one remembered, the run not ended.
    source = report["source"]["health_every_10s"]
    assert source["error_counts"]["nvmlDeviceGetRemappedRows"] >= 1
    assert any("nvmlDeviceGetPcieReplayCounter" in calls for calls in source["unsupported_calls"].values())
    assert any(line.startswith("health GPU 0") and "nvmlDeviceGetRemappedRows: NVMLError_Unknown" in line
               for line in report["summary"])


@pytest.mark.slow
def test_xid_gpm_energy_and_processes_are_read_as_phasescope_reads_them(failing: Run) -> None:
    report, _ = failing
    xid = report["xid"]["GPU 0"]
    empty = xid[nvml_check.WAIT_EMPTY]
    assert (empty["status"], empty["code"], empty["phasescope"]) == ("empty", 10, "nothing queued: normal")
    queued = xid["nvmlEventSetWait_v2(set, 0), one XID queued (fake)"]["value"]["fields"]
    assert queued["eventData"]["value"] == 48
    source = report["source"]["health_every_10s"]
    assert any("XID 13" in e for e in source["events"])  # queued at tick 5, drained into one event line
    assert report["gpm"]["GPU 0"]["supported"] is True
    assert [m["signal"] for m in report["gpm"]["GPU 0"]["GPU"]["metrics"]] == ["sm_active", "tensor_active",
                                                                             "dram_active"]
    counter = next(iter(report["energy_counter"]["gpus"].values()))
    assert counter["energy"]["changes"] >= 2  # the fake's counter moves once per 0.1 s tick
    assert 50 <= counter["energy"]["change_interval_ms"]["median"] <= 200
    for window in ("sleep", "torch"):
        w = report["monitor"][window]
        if w.get("status") == "skipped":  # torch not installed here
            continue
        dev = next(d for d in w["result"]["devices"] if not d["is_host"])
        assert dev["method"] == "counter" and dev["energy_j"] > 0
        cmp = w["compare"][dev["uuid"]]
        assert cmp["counter_j"] is not None and cmp["power_integral_j"] is not None
    assert report["processes"]["own_pid_seen"] is True


@pytest.mark.slow
def test_a_python_error_in_a_call_fails_its_section_only(tmp_path: Path, shared_data: Path) -> None:
    """nvmlGpmQueryDeviceSupport raising RuntimeError (no NVMLError): NvmlSource's setup does not catch
    it, so the source sections fail and say why; every other section still runs and is written."""
    report, done = _run(tmp_path, shared_data, "--fake-crash", "nvmlGpmQueryDeviceSupport", "--no-torch")
    assert done.returncode == 1
    assert report["source"]["status"] == "failed"
    assert report["source"]["error"] == "RuntimeError: scripted crash in nvmlGpmQueryDeviceSupport"
    gpm = report["gpm"]["GPU 0"]["nvmlGpmQueryDeviceSupport"]
    assert gpm["status"] == "error" and gpm["phasescope"].startswith("not an NVML error")
    assert report["monitor"]["status"] == "ok"  # the Monitor's source reads no GPM
    assert report["monitor"]["torch"] == {"status": "skipped", "why": "--no-torch"}
    assert set(nvml_check.SECTIONS) <= set(report)
    assert (tmp_path / "nvml_check.txt").read_text().startswith("nvml_check on ")


@pytest.mark.slow
def test_a_hung_call_ends_the_run_with_what_was_done(tmp_path: Path, shared_data: Path) -> None:
    report, done = _run(tmp_path, shared_data, "--fake-hang", "nvmlEventSetCreate", "--timeout-s", "8",
                        "--no-torch")
    assert done.returncode == 3
    assert report["timed_out"] == {"section": "xid", "after_s": 8.0}
    assert [s for s in nvml_check.SECTIONS if s in report] == ["meta", "calls", "health"]
    assert "TIMED OUT after 8 s in section 'xid'" in done.stdout


def test_fake_options_need_a_dry_run(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(CHECK), "--out", str(tmp_path), "--fake-fail", "x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "need --dry-run" in done.stderr


def test_counter_steps_and_window_joules() -> None:
    # Polled every 10 ms for 1 s: a 100 W GPU whose counter (mJ) steps every 100 ms, power read every poll.
    samples = [(t / 100, float(int(t / 10) * 10_000), 100_000.0) for t in range(101)]
    steps = nvml_check.counter_steps(samples)
    assert steps["polls"] == 101 and steps["energy"]["changes"] == 10
    assert steps["energy"]["change_interval_ms"]["median"] == pytest.approx(100.0)
    assert steps["energy"]["step_mj_median"] == 10_000
    assert steps["energy"]["mean_power_w"] == pytest.approx(100.0)
    assert steps["power"]["changes"] == 0 and steps["power"]["mean_power_w"] == pytest.approx(100.0)
    win = nvml_check.over_window(samples, 0.2, 0.7)
    assert win["power_integral_j"] == pytest.approx(50.0)
    assert win["counter_j"] == pytest.approx(50.0)
    assert nvml_check.over_window(samples, 0.5, 2.0)["counter_j"] is None  # polls end before the window


def test_describe_and_policy_of_nvml_answers() -> None:
    import pynvml

    assert nvml_check.describe((1, 0, 0, 0)) == {
        "type": "tuple", "len": 4, "items": [{"type": "int", "value": v} for v in (1, 0, 0, 0)]}
    timeout = pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
    assert nvml_check.outcome("nvmlEventSetWait_v2", None, timeout)["status"] == "empty"
    gone = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    lost = nvml_check.outcome("nvmlDeviceGetPowerUsage", None, gone)
    assert (lost["status"], lost["phasescope"]) == ("error", "marks the GPU lost")
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    values[0].nvmlReturn = values[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml_check.outcome("nvmlDeviceGetFieldValues", values, None)["status"] == "not_supported"


@pytest.mark.slow
def test_battery_runs_the_check_first_and_packs_its_report(tmp_path: Path, shared_data: Path) -> None:
    env = {**os.environ, "PHASESCOPE_SHARED_DATA": str(shared_data)}
    done = subprocess.run([sys.executable, str(BATTERY), "--dry-run", "--out", str(tmp_path), "--only",
                           "idle_released", "--active-s", "0.3"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "nvml_check: exit 0" in done.stdout
    report = json.loads((tmp_path / "dryrun" / "nvml_check.json").read_text())
    assert report["meta"]["dry_run"] is True
    with tarfile.open(tmp_path / "battery.tar.gz") as tar:
        assert "dryrun/nvml_check.json" in tar.getnames()
    skipped = tmp_path / "skipped"
    done = subprocess.run([sys.executable, str(BATTERY), "--dry-run", "--out", str(skipped), "--only",
                           "idle_released", "--active-s", "0.3", "--skip-nvml-check"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0 and not (skipped / "dryrun" / "nvml_check.json").exists()
