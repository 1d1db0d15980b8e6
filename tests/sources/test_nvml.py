"""NvmlSource through the real pynvml API, served by the scripted fake replaying real recorded traces."""

from __future__ import annotations

import math

import numpy as np
import pynvml
import pytest

from phasescope.errors import SourceError
from phasescope.schema import MIB, PAPER_SIGNALS, SIGNAL_COLUMN
from phasescope.sources import nvml as nvml_mod
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


def test_lost_gpu_is_reported_once_and_the_others_keep_going(fake_nvml, sg_traces, spar_trace):
    traces = [*sg_traces, spar_trace]
    fake = fake_nvml(traces, mem_total_bytes=RTX3090_MEM)
    fake.lose(1, from_tick=4, code=pynvml.NVML_ERROR_GPU_IS_LOST)
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


class _Clock:
    """The source's monotonic clock, one second per tick: an outage's minutes pass in no time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ticks(src: NvmlSource, fake, clock: _Clock, n: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """(values per tick, (tick, event) pairs) over n ticks, one second apart."""
    rows, events = [], []
    for k in range(n):
        batch = src.read()
        rows.append(batch.values)
        events.extend((k, e) for e in batch.events)
        fake.advance()
        clock.now += 1.0
    return np.stack(rows), events


@pytest.mark.parametrize("until", [5, 12])
def test_unknown_outage_is_retried_with_backoff_and_the_gpu_comes_back(fake_nvml, sg_traces, until):
    """Issue 21 item 7: Unknown on every call for one tick (or eight) used to lose the GPU for good. It is an
    outage: NaN while it lasts, retried after 1, 2, 4, 8 s, and read again once NVML answers."""
    fake = fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM)
    fake.lose(1, from_tick=4, code=pynvml.NVML_ERROR_UNKNOWN, until_tick=until)
    clock = _Clock()
    src = NvmlSource(clock=clock)
    got, events = _ticks(src, fake, clock, 25)
    # Tried at tick 4 (down), then 5, 7, 11, 19: back at the first retry on or after `until`.
    back = next(k for k in (5, 7, 11, 19) if k >= until)
    assert np.isnan(got[4:back, 1, :]).all()
    for signal in ("power", "gpu_util", "temperature"):
        want = sg_traces[1][signal]
        np.testing.assert_array_equal(got[back:, 1, _col(signal)], want[back:25], err_msg=signal)
        np.testing.assert_array_equal(got[:4, 1, _col(signal)], sg_traces[1][signal][:4], err_msg=signal)
    np.testing.assert_array_equal(got[:, 0, _col("power")], sg_traces[0]["power"][:25])  # the other GPU
    uuid = sg_traces[1].device.uuid
    said = [(k, e.split(":")[0]) for k, e in events]
    assert said == [(4, "GPU not answering"), (back, "GPU answering again")]
    assert all(uuid in e and "\n" not in e for _, e in events)
    assert "given up as lost after 120 s" in events[0][1]
    assert f"after {back - 4} s of Unknown Error" in events[1][1]
    assert not any("lost:" in e for _, e in events)
    # Counted per call, as every failure: each failed try (ticks 4, 5, 7, 11 before `back`) once.
    tries = sum(1 for k in (4, 5, 7, 11) if k < back)
    assert src.error_counts()["nvmlDeviceGetPowerUsage"] == tries


def test_a_sustained_unknown_outage_is_given_up_after_two_minutes_and_said(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM)
    fake.lose(0, from_tick=2, code=pynvml.NVML_ERROR_UNKNOWN)
    clock = _Clock()
    src = NvmlSource(clock=clock)
    got, events = _ticks(src, fake, clock, 140)
    # Tried at 2, 3, 5, 9, 17, 33 (then every 30 s): 63, 93, 123; 121 s down at 123, past OUTAGE_GIVE_UP_S.
    assert nvml_mod.OUTAGE_GIVE_UP_S == 120.0
    assert [k for k, _ in events] == [2, 123]
    assert events[0][1].startswith("GPU not answering:")
    lost = events[1][1]
    assert lost.startswith("GPU lost:") and "for 121 s" in lost and "given up after 120 s" in lost
    assert np.isnan(got[2:, 0, :]).all()
    np.testing.assert_array_equal(got[:, 1, _col("power")], sg_traces[1]["power"][:140])
    # Nine tries of the GPU in 121 s, not one per tick; none after it was given up.
    assert src.error_counts()["nvmlDeviceGetPowerUsage"] == 9
    before = fake.calls["nvmlDeviceGetPowerUsage"]
    src.read()
    assert fake.calls["nvmlDeviceGetPowerUsage"] - before == 1  # the live GPU only


def test_an_impossible_live_reading_is_nan_counted_and_said_once(fake_nvml, sg_traces):
    """Issue 21 item 5, live: NVML's 0xFFFFFFFF mW sentinel (4.3 MW) and 150 % utilisation are no readings."""
    power = sg_traces[0]["power"].copy()
    util = sg_traces[0]["gpu_util"].copy()
    power[[3, 7]] = 0xFFFFFFFF / 1000.0
    util[5] = 1.5
    bad = sg_traces[0].with_columns(power=power, gpu_util=util)
    fake = fake_nvml([bad, sg_traces[1]], mem_total_bytes=RTX3090_MEM)
    src = NvmlSource()
    events: list[str] = []
    rows = []
    for _ in range(10):
        batch = src.read()
        rows.append(batch.values)
        events.extend(batch.events)
        fake.advance()
    got = np.stack(rows)
    assert np.isnan(got[[3, 7], 0, _col("power")]).all() and np.isnan(got[5, 0, _col("gpu_util")])
    keep = [k for k in range(10) if k not in (3, 7)]
    np.testing.assert_array_equal(got[keep, 0, _col("power")], power[keep])
    assert got[5, 0, _col("mem_util")] == sg_traces[0]["mem_util"][5]  # only the impossible value goes
    assert src.error_counts()["impossible power"] == 2 and src.error_counts()["impossible gpu_util"] == 1
    assert len(events) == 2 and all(sg_traces[0].device.uuid in e for e in events)
    assert "power = 4.29497e+06 watts, outside 0..5000" in events[0] and "gpu_util = 1.5" in events[1]
    np.testing.assert_array_equal(got[:, 1, _col("power")], sg_traces[1]["power"][:10])


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
    # `auto` watches the host already: the line says so; a CPU-only machine is not told to install a driver.
    assert len(said) == 1
    assert said[0].endswith(("watching the host only", "watching the host's CPU, memory and processes"))
    assert "--source host" not in said[0] and (needle in said[0] or "libnvidia-ml.so.1" in said[0])
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        assert "install" not in said[0]
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


def test_devices_are_named_by_the_node_not_the_pods_hostname(fake_nvml, sg_traces, monkeypatch):
    """In a DaemonSet the hostname is the pod's (new on every rollout): NODE_NAME names the GPUs' host, and
    the host source and the hooks' CPU device agree with it (phasescope.identity)."""
    from phasescope.instrument.events import device_for_host
    from phasescope.sources.host import HostSource

    monkeypatch.delenv("PHASESCOPE_HOST", raising=False)
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    fake_nvml(sg_traces, mem_total_bytes=RTX3090_MEM)
    src = NvmlSource()
    assert {d.host for d in src.devices()} == {"gpu-node-17"}
    src.close()
    host = HostSource(find_torch=False)
    (dev,) = host.devices()
    assert dev.uuid == "host:gpu-node-17" == device_for_host()
    host.close()
