"""NvmlSource through the real pynvml API, served by the scripted fake replaying real recorded traces."""

from __future__ import annotations

import math

import numpy as np
import pynvml
import pytest

from phasescope.errors import SourceError
from phasescope.schema import MIB, PAPER_SIGNALS, SIGNAL_COLUMN
from phasescope.sources.host import HostSource
from phasescope.sources.nvml import NvmlSource, nvml_available, open_nvml_or_none
from tests.fakes.fake_nvml import FakeProcess

RTX3090_MEM = 24576 * MIB  # the RTX 3090's 24 GiB: SensorGuard logs memory used, not the total




def _col(name: str) -> int:
    return SIGNAL_COLUMN[name]


def _replay(src: NvmlSource, fake, ticks: int) -> np.ndarray:
    """(ticks, devices, signals) as read through the source."""
    out = []
    for _ in range(ticks):
        out.append(src.read().values)
        fake.advance()
    return np.stack(out)


def test_sensorguard_replay_comes_out_in_base_units_equal_to_the_recording(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM)
    src = NvmlSource()
    assert [d.uuid for d in src.devices()] == [t.device.uuid for t in sg_traces]
    got = _replay(src, fake, 40)
    for dev, trace in enumerate(sg_traces):
        for signal in PAPER_SIGNALS:
            np.testing.assert_array_equal(got[:, dev, _col(signal)], trace[signal][:40], err_msg=signal)
        np.testing.assert_array_equal(got[:, dev, _col("mem_total")], RTX3090_MEM)
        # The recording has no energy, NVLink or GPM: NaN, never a made-up 0.
        for signal in ("energy", "nvlink_tx", "sm_active", "tensor_active", "throttle_reasons"):
            assert np.isnan(got[:, dev, _col(signal)]).all(), signal
    src.close()
    assert fake.initialized == 0


def test_spar_replay_matches_within_nvml_resolution(fake_nvml, spar_trace):
    fake = fake_nvml([spar_trace])
    src = NvmlSource()
    n = len(spar_trace)
    got = _replay(src, fake, n)[:, 0, :]
    for signal in ("gpu_util", "mem_util", "mem_used", "mem_total", "temperature", "sm_clock", "mem_clock"):
        np.testing.assert_array_equal(got[:, _col(signal)], spar_trace[signal], err_msg=signal)
    np.testing.assert_allclose(got[:, _col("power")], spar_trace["power"], atol=0.0005)  # 1 mW
    for signal in ("pcie_tx", "pcie_rx"):  # NVML counts whole KB/s
        np.testing.assert_allclose(got[:, _col(signal)], spar_trace[signal], atol=500.0, err_msg=signal)
    assert src.devices()[0].name == "NVIDIA A100-SXM4-40GB"


def test_unsupported_call_is_nan_counted_once_and_not_retried(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM)
    src = NvmlSource()
    _replay(src, fake, 10)
    # The traces lack energy: NotSupported, tried once per device, then skipped.
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2
    assert src.error_counts()["nvmlDeviceGetTotalEnergyConsumption"] == 2
    assert "nvmlDeviceGetTotalEnergyConsumption" in src.unsupported_calls()[sg_traces[0].device.uuid]
    # Supported calls ran every tick.
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 20


def test_injected_error_gives_nan_and_a_count_then_recovers(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM)
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_TIMEOUT, device=0, from_tick=3, until_tick=6)
    fake.fail("nvmlDeviceGetPcieThroughput", pynvml.NVML_ERROR_NOT_SUPPORTED, device=1, from_tick=2)
    src = NvmlSource()
    got = _replay(src, fake, 10)
    power0 = got[:, 0, _col("power")]
    assert np.isnan(power0[3:6]).all()
    np.testing.assert_array_equal(power0[[0, 1, 2, 6, 7, 8, 9]], sg_traces[0]["power"][[0, 1, 2, 6, 7, 8, 9]])
    np.testing.assert_array_equal(got[:, 1, _col("power")], sg_traces[1]["power"][:10])
    assert src.error_counts()["nvmlDeviceGetPowerUsage"] == 3
    # NotSupported from tick 2 on: NaN from then, and each of tx/rx tried only once more.
    assert np.isnan(got[2:, 1, _col("pcie_tx")]).all() and np.isfinite(got[:2, 1, _col("pcie_tx")]).all()
    assert src.error_counts()["nvmlDeviceGetPcieThroughput"] == 2
    np.testing.assert_array_equal(got[:, 0, _col("pcie_tx")], sg_traces[0]["pcie_tx"][:10])


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN])
def test_lost_gpu_is_reported_once_and_the_others_keep_going(fake_nvml, sg_traces, spar_trace, code):
    traces = [*sg_traces, spar_trace]
    fake = fake_nvml(traces, mem_total_bytes=RTX3090_MEM)
    fake.lose(1, from_tick=4, code=code)
    src = NvmlSource()
    events: list[str] = []
    rows = []
    for _ in range(10):
        batch = src.read()
        events.extend(batch.events)
        rows.append(batch.values)
        fake.advance()
    got = np.stack(rows)
    lost_uuid = sg_traces[1].device.uuid
    assert len(events) == 1 and lost_uuid in events[0] and "lost" in events[0]
    assert "\n" not in events[0]
    assert np.isnan(got[4:, 1, :]).all()
    np.testing.assert_array_equal(got[:4, 1, _col("power")], sg_traces[1]["power"][:4])
    np.testing.assert_array_equal(got[:, 0, _col("power")], sg_traces[0]["power"][:10])
    np.testing.assert_array_equal(got[:, 2, _col("gpu_util")], spar_trace["gpu_util"][:10])
    assert [d.uuid for d in src.devices()] == [t.device.uuid for t in traces]  # the row stays
    # No more NVML calls on the lost GPU after it was found lost.
    before = fake.calls.total()
    src.read()
    assert fake.calls.total() - before < 40  # two live GPUs' worth only


def test_gpu_lost_before_start_is_skipped_with_one_event(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM)
    fake.lose(0, from_tick=0)
    src = NvmlSource()
    assert [d.uuid for d in src.devices()] == [sg_traces[1].device.uuid]
    first = src.read()
    assert len(first.events) == 1 and "#0" in first.events[0]
    assert src.read().events == []
    assert first.value(sg_traces[1].device.uuid, "power") == sg_traces[1]["power"][0]


@pytest.mark.parametrize(
    ("code", "needle"),
    [(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
     (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded")],
)
def test_missing_library_is_one_actionable_line_and_host_takes_over(fake_nvml, sg_traces, code, needle):
    fake_nvml(sg_traces, init_error=code)
    with pytest.raises(SourceError) as info:
        NvmlSource()
    line = str(info.value)
    assert needle in line and "--source host" in line and "\n" not in line
    assert nvml_available() == (False, line)
    said: list[str] = []
    assert open_nvml_or_none(said.append) is None
    assert said == [line]
    host = HostSource(find_torch=False)
    assert host.read().values.shape == (1, len(SIGNAL_COLUMN))


def test_no_gpu_means_not_available(fake_nvml):
    fake = fake_nvml([])
    ok, line = nvml_available()
    assert not ok and "no NVIDIA GPU" in line
    assert fake.initialized == 0


def test_mig_instances_are_enumerated_with_their_parent(fake_nvml, sg_traces, spar_trace):
    child_a = sg_traces[0].with_columns(sm_active=sg_traces[0]["gpu_util"])  # load-shaped GPM stand-in
    child_b = sg_traces[1]
    fake = fake_nvml([spar_trace], mig={0: [child_a, child_b]}, mem_total_bytes=RTX3090_MEM)
    src = NvmlSource()
    devs = src.devices()
    parent = devs[0]
    assert parent.uuid == spar_trace.device.uuid and parent.parent_uuid is None
    assert [d.parent_uuid for d in devs[1:]] == [parent.uuid, parent.uuid]
    assert all(d.uuid.startswith("MIG-") for d in devs[1:]) and len({d.uuid for d in devs}) == 3
    got = _replay(src, fake, 6)
    # Whole-GPU utilisation is not offered in MIG mode; memory per instance is.
    assert np.isnan(got[:, 0, _col("gpu_util")]).all()
    np.testing.assert_array_equal(got[:, 1, _col("mem_used")], child_a["mem_used"][:6])
    np.testing.assert_array_equal(got[:, 2, _col("mem_used")], child_b["mem_used"][:6])
    # GPM for an instance goes through its parent by GPU-instance id; it needs two samples.
    assert math.isnan(got[0, 1, _col("sm_active")])
    np.testing.assert_array_equal(got[1:, 1, _col("sm_active")], child_a["gpu_util"][1:6])
    assert np.isnan(got[:, 2, _col("sm_active")]).all()  # instance b's recording has no GPM series
    assert fake.calls["nvmlGpmMigSampleGet"] == 12  # both instances, every tick
    assert fake.calls["nvmlGpmSampleGet"] == 1  # refused for the whole GPU in MIG mode: tried once


def test_gpm_and_nvlink_are_derived_from_two_samples(fake_nvml, sg_traces):
    base = sg_traces[0]
    # Real recorded series stand in for the fields the RTX 3090 recording lacks (GPM is Hopper+).
    trace = base.with_columns(sm_active=base["gpu_util"], tensor_active=base["mem_util"],
                              nvlink_tx=base["pcie_tx"] * 100, nvlink_rx=base["pcie_rx"] * 100)
    fake = fake_nvml([trace], mem_total_bytes=RTX3090_MEM)
    src = NvmlSource()
    got = _replay(src, fake, 30)[:, 0, :]
    assert np.isnan(got[0, [_col("sm_active"), _col("nvlink_tx")]]).all()
    np.testing.assert_array_equal(got[1:, _col("sm_active")], base["gpu_util"][1:30])
    np.testing.assert_array_equal(got[1:, _col("tensor_active")], base["mem_util"][1:30])
    assert np.isnan(got[:, _col("dram_active")]).all()
    # The counter advances by the trapezoid of the rate; its derivative is the mean of two samples.
    for signal, rate in (("nvlink_tx", trace["nvlink_tx"]), ("nvlink_rx", trace["nvlink_rx"])):
        expected = (rate[1:30] + rate[:29]) / 2
        np.testing.assert_allclose(got[1:, _col(signal)], expected, rtol=1e-3, atol=2048, err_msg=signal)


def test_energy_power_limit_throttle_and_static_info(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces[:1], mem_total_bytes=RTX3090_MEM, power_limit_w=350.0, energy_from_power=True,
                     throttle_reasons=pynvml.nvmlClocksEventReasonSwPowerCap, max_clocks_mhz=(2100, 9751))
    src = NvmlSource()
    got = _replay(src, fake, 20)[:, 0, :]
    power, t = sg_traces[0]["power"][:20], sg_traces[0].time[:20]
    joules = np.diff(got[:, _col("energy")])
    np.testing.assert_allclose(joules, np.diff(t) * (power[1:] + power[:-1]) / 2, atol=0.002)
    np.testing.assert_array_equal(got[:, _col("power_limit")], 350.0)
    np.testing.assert_array_equal(got[:, _col("throttle_reasons")], 4.0)
    info = src.static_info()[sg_traces[0].device.uuid]
    assert info["max_sm_clock_hz"] == 2100e6 and info["max_mem_clock_hz"] == 9751e6
    assert info["power_limit_w"] == 350.0 and info["mem_total_bytes"] == RTX3090_MEM
    assert info["driver_version"] == fake.driver_version
    assert src.devices()[0].extra["max_sm_clock_hz"] == str(2100e6)


def test_processes_per_gpu_with_utilisation_and_departures(fake_nvml, sg_traces):
    procs = {0: [FakeProcess(4242, 3 * 2**30, sm_util_pct=87), FakeProcess(4343, None, until_tick=2)],
             1: [FakeProcess(5151, 2**30, sm_util_pct=None)]}
    fake = fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM, processes=procs)
    src = NvmlSource()
    first = src.read().processes
    by_pid = {p.pid: p for p in first}
    assert set(by_pid) == {4242, 4343, 5151}
    assert by_pid[4242].device_uuid == sg_traces[0].device.uuid
    assert by_pid[4242].gpu_mem_used == 3 * 2**30 and by_pid[4242].sm_util == pytest.approx(0.87)
    assert math.isnan(by_pid[4343].gpu_mem_used)  # the driver could not tell
    assert math.isnan(by_pid[5151].sm_util) and by_pid[5151].device_uuid == sg_traces[1].device.uuid
    fake.advance(2)
    assert {p.pid for p in src.read().processes} == {4242, 5151}
    assert "nvmlDeviceGetProcessUtilization" not in src.error_counts()  # "nothing newer" is not a failure


def test_process_utilisation_not_supported_is_nan(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces[:1], mem_total_bytes=RTX3090_MEM, process_util=False,
                     processes={0: [FakeProcess(7, 2**20, sm_util_pct=50)]})
    src = NvmlSource()
    for _ in range(3):
        (proc,) = src.read().processes
        fake.advance()
        assert proc.gpu_mem_used == 2**20 and math.isnan(proc.sm_util)
    assert src.error_counts()["nvmlDeviceGetProcessUtilization"] == 1
