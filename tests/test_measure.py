"""phasescope.measure / monitor.Monitor: energy, time and cost of named windows.

GPUs are the scripted fake NVML replaying a real SensorGuard RTX 3090 recording (GPT-2 training on GPU 0,
an idle bystander on GPU 1) through the real pynvml API; the host is measured on a real CPU workload.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import pynvml
import pytest

import phasescope
from phasescope.errors import InputError, SourceError
from phasescope.kpi.cost import Prices
from phasescope.kpi.energy import device_energy
from phasescope.monitor import Measurement, Monitor
from phasescope.schema import TickBatch, Trace
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read

SENSORGUARD_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
PRICES = Prices(usd_per_gpu_hour=2.5, usd_per_kwh=0.12)


@pytest.fixture(scope="module")
def sg_traces(shared_data: Path) -> list[Trace]:
    traces = read(shared_data / SENSORGUARD_RUN)
    assert len(traces) == 2
    return traces


def _recorded_joules(trace: Trace, a: int, b: int) -> float:
    """Energy between samples a and b of the recording: the trapezoid the fake's counter is built from."""
    t, p = trace.time[a : b + 1], np.nan_to_num(trace["power"][a : b + 1])
    return float(np.sum(np.diff(t) * (p[1:] + p[:-1]) / 2))


def _sampled_window(mon: Monitor, fake, ticks: int) -> Measurement:
    """One window over `ticks` ticks of the fake NVML, read once per tick (no background thread)."""
    mon.begin_window("w")
    for _ in range(ticks):
        fake.advance()
        mon.sample()
    return mon.end_window("w")


class RecordedClock:
    """The NVML source with each reading stamped on the recording's own clock (not the wall clock), so a
    power-only window integrates exactly the samples the recording holds."""

    name = "nvml-recorded-clock"

    def __init__(self, fake) -> None:
        self.fake = fake
        self.src = NvmlSource(processes=False, gpm=False, nvlink=False)

    def devices(self):
        return self.src.devices()

    def read(self) -> TickBatch:
        batch = self.src.read()
        batch.time = self.fake.time_s(self.fake.gpus[0])
        return batch

    def error_counts(self):
        return self.src.error_counts()

    def close(self) -> None:
        self.src.close()


def test_counter_window_is_the_counter_difference_per_gpu(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, energy_from_power=True)
    with Monitor("nvml", prices=PRICES) as mon:
        assert mon.interval_s is None  # every GPU has the counter: no background sampling needed
        mon.begin_window("epoch")
        fake.advance(10)
        m = mon.end_window("epoch")
    assert [d.uuid for d in m.devices] == [t.device.uuid for t in sg_traces]
    for dev, trace in zip(m.devices, sg_traces, strict=True):
        assert dev.method == "counter"
        # The counter is served in whole mJ: two roundings.
        assert dev.energy_j == pytest.approx(_recorded_joules(trace, 0, 10), abs=0.002)
        assert dev.cost.energy_usd == pytest.approx(dev.energy_j / 3.6e6 * 0.12)
        assert dev.cost.time_usd == pytest.approx(dev.span_s / 3600 * 2.5)
        assert dev.coverage == 1.0 and dev.notes == ()
    # The training GPU drew far more than its idle bystander over the same 10 recorded seconds.
    assert m.devices[0].energy_j > 2 * m.devices[1].energy_j
    assert m.total_energy_j == pytest.approx(m.devices[0].energy_j + m.devices[1].energy_j)
    # Zeus's names read the same figures.
    assert m.gpu_energy == {0: m.devices[0].energy_j, 1: m.devices[1].energy_j}
    assert m.total_energy == m.total_energy_j and m.time == m.time_s
    assert m.samples == 2


def test_nested_and_overlapping_windows_each_get_their_own_span(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces[:1], energy_from_power=True)
    with Monitor("nvml", prices=PRICES) as mon:
        mon.begin_window("outer")
        fake.advance(3)
        mon.begin_window("inner")
        fake.advance(4)
        inner = mon.end_window("inner")
        mon.begin_window("tail")
        fake.advance(3)
        outer = mon.end_window("outer")
        fake.advance(2)
        tail = mon.end_window("tail")
        assert mon.open_windows() == []
    trace = sg_traces[0]
    assert inner.device(0).energy_j == pytest.approx(_recorded_joules(trace, 3, 7), abs=0.002)
    assert outer.device(0).energy_j == pytest.approx(_recorded_joules(trace, 0, 10), abs=0.002)
    assert tail.device(0).energy_j == pytest.approx(_recorded_joules(trace, 7, 12), abs=0.002)
    assert outer.samples == 5  # its begin, inner's begin and end, tail's begin, its end


def test_power_only_gpu_is_integrated_as_kpi_energy_integrates_the_same_samples(fake_nvml, sg_traces):
    trace = sg_traces[0]
    fake = fake_nvml([trace])  # the recording has no energy counter: power only
    with Monitor("nvml", prices=PRICES) as probe:
        assert probe.interval_s == 0.1  # power without a counter: background sampling, by default
    n = 40
    with Monitor(RecordedClock(fake), interval_s=None, prices=PRICES) as mon:
        m = _sampled_window(mon, fake, n)
    # What `phasescope cost` / the report would say for those samples (the fake serves whole mW).
    t = trace.time[: n + 1]
    ref = device_energy(Trace(trace.device, t, {"power": np.round(trace["power"][: n + 1] * 1000) / 1000}))
    dev = m.device(trace.device.uuid)
    assert ref.method == dev.method == "integrated_power"
    assert dev.energy_j == pytest.approx(ref.joules, rel=1e-12)
    assert dev.covered_s == pytest.approx(ref.covered_s)
    assert dev.span_s == pytest.approx(t[-1] - t[0])
    assert dev.mean_power_w == pytest.approx(ref.mean_power_w)


def test_power_hole_is_left_uncovered_and_said(fake_nvml, sg_traces):
    trace = sg_traces[0]
    fake = fake_nvml([trace])
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_TIMEOUT, from_tick=5, until_tick=12)
    with Monitor(RecordedClock(fake), interval_s=None, prices=PRICES) as mon:
        dev = _sampled_window(mon, fake, 20).devices[0]
    power = np.round(trace["power"][:21] * 1000) / 1000
    power[5:12] = np.nan
    ref = device_energy(Trace(trace.device, trace.time[:21], {"power": power}))
    assert dev.energy_j == pytest.approx(ref.joules, rel=1e-12)
    assert dev.covered_s == pytest.approx(ref.covered_s) and dev.covered_s < dev.span_s
    assert any("energy covers" in n for n in dev.notes)


def test_counter_through_transient_nvml_errors_is_exact(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces[:1], energy_from_power=True)
    fake.fail("nvmlDeviceGetTotalEnergyConsumption", pynvml.NVML_ERROR_TIMEOUT, from_tick=2, until_tick=7)
    said: list[str] = []
    with Monitor("nvml", interval_s=None, prices=PRICES, say=said.append) as mon:
        dev = _sampled_window(mon, fake, 9).devices[0]
        assert mon.source.error_counts()["nvmlDeviceGetTotalEnergyConsumption"] == 5
    assert dev.method == "counter"
    assert dev.energy_j == pytest.approx(_recorded_joules(sg_traces[0], 0, 9), abs=0.002)
    assert dev.coverage == pytest.approx(1.0)
    assert said == []  # a transient error is not news


def test_gpu_lost_mid_window_keeps_the_energy_before_and_says_so_once(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, energy_from_power=True)
    fake.lose(0, from_tick=5)
    said: list[str] = []
    with Monitor("nvml", interval_s=None, prices=PRICES, say=said.append) as mon:
        m = _sampled_window(mon, fake, 9)
        mon.begin_window("after")
        fake.advance()
        after = mon.end_window("after")
    lost, bystander = m.devices
    assert lost.energy_j == pytest.approx(_recorded_joules(sg_traces[0], 0, 4), abs=0.002)
    assert lost.coverage is not None and lost.coverage < 1
    assert any("GPU lost" in n for n in m.notes)
    assert any("no reading at the end" in n for n in lost.notes)
    assert bystander.energy_j == pytest.approx(_recorded_joules(sg_traces[1], 0, 9), abs=0.002)
    assert bystander.notes == ()
    assert len([s for s in said if "GPU lost" in s]) == 1 and "\n" not in said[0]
    # A later window: the lost GPU has no energy at all (no counter reading in it), the other one does.
    assert after.devices[0].energy_j is None and after.devices[1].energy_j is not None
    assert "no power or energy reading" in after.devices[0].notes[0]


def test_window_shorter_than_the_counter_update_says_zero_is_a_lower_bound(fake_nvml, sg_traces):
    fake_nvml(sg_traces[:1], energy_from_power=True)
    with Monitor("nvml", prices=PRICES) as mon:
        mon.begin_window("tiny")
        dev = mon.end_window("tiny").devices[0]  # same fake tick: the counter has not moved
    assert dev.energy_j == 0.0
    assert any("did not advance" in n for n in dev.notes)


def test_no_nvml_is_one_line_and_auto_falls_back_to_the_host(fake_nvml, sg_traces):
    fake_nvml(sg_traces, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(SourceError) as err:
        Monitor("nvml", prices=PRICES)
    assert "NVML library not found" in str(err.value) and "\n" not in str(err.value)
    assert 'source="host"' in str(err.value)  # the API's own spelling, not the CLI's --source
    said: list[str] = []
    with Monitor("auto", prices=PRICES, say=said.append) as mon:
        assert [d.extra.get("kind") for d in mon.devices] == ["host"]
        mon.begin_window("w")
        m = mon.end_window("w")
    assert len(said) == 1 and "NVML library not found" in said[0] and "--source" not in said[0]
    assert m.notes == tuple(said)


def test_host_window_on_a_real_cpu_workload():
    prices = Prices(usd_per_gpu_hour=3.6)
    with Monitor("host", prices=prices) as mon:
        wall0, cpu0 = time.monotonic(), time.process_time()
        mon.begin_window("busy")
        x = 0
        while time.monotonic() - wall0 < 0.6:  # one thread of pure Python
            x += 1
        m = mon.end_window("busy")
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    (host,) = m.devices
    assert host.is_host and host.method == "none"
    assert host.energy_j is None and m.total_energy_j is None and m.gpu_energy == {}
    assert "no power or energy reading" in host.notes[0]
    assert 0.6 <= m.time_s <= wall
    # The host's CPU share over the window is at least this process's own share of all cores.
    ncpu = os.cpu_count() or 1
    assert host.util_mean is not None and host.util_mean >= 0.9 * cpu / (wall * ncpu)
    # Unmeasured energy is an unknown cost, not $0; held time is priced.
    assert host.cost.energy_usd is None
    assert host.cost.time_usd == pytest.approx(host.span_s / 3600 * 3.6)
    assert m.to_dict()["devices"][0]["energy_j"] is None


def test_background_sampling_runs_only_while_a_window_is_open(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces[:1])  # power only; the fake holds tick 0, so power is constant
    with Monitor("nvml", prices=PRICES) as mon:
        assert mon.interval_s == 0.1
        mon.begin_window("w")
        assert mon._thread is not None
        time.sleep(0.5)
        m = mon.end_window("w")
        assert mon._thread is None
    dev = m.devices[0]
    assert m.samples >= 3  # begin, end and the background readings between
    assert dev.method == "integrated_power"
    p0 = round(sg_traces[0]["power"][0] * 1000) / 1000
    assert dev.mean_power_w == pytest.approx(p0)
    assert fake.tick == 0


def test_measure_context_manager_and_bad_use():
    with phasescope.measure("ok", source="host") as w:
        pass
    assert isinstance(w.result, Measurement) and w.result.name == "ok"
    # The window ends (and is measured) when the body raises; the error goes on.
    with pytest.raises(ZeroDivisionError), phasescope.measure("boom", source="host") as w2:
        1 / 0  # noqa: B018
    assert w2.result is not None and math.isfinite(w2.result.time_s)
    with Monitor("host", prices=PRICES) as mon:
        with mon.window("a") as wa:
            with pytest.raises(ValueError, match="already open"):
                mon.begin_window("a")
            with pytest.raises(ValueError, match=r"'nope' is not open \(open windows: 'a'\)"):
                mon.end_window("nope")
        assert wa.result is not None
        mon.begin_window("dropped")
        mon.cancel_window("dropped")
        assert mon.open_windows() == []
        with pytest.raises(TypeError, match="either monitor= or Monitor options"):
            phasescope.measure("x", monitor=mon, source="host")
    with pytest.raises(RuntimeError, match="closed"):
        mon.begin_window("late")
    with pytest.raises(InputError, match="device 5: expected one of host:"):
        Monitor("host", devices=[5], prices=PRICES)
    with pytest.raises(InputError, match="interval_s"):
        Monitor("host", interval_s=0.01, prices=PRICES)
    # A bad spec names this argument, not the CLI's --source flag.
    with pytest.raises(InputError, match=r"^Monitor: source: expected auto, nvml, host or replay:PATH"):
        Monitor("bogus", prices=PRICES)


def test_measure_without_options_reuses_one_shared_monitor(monkeypatch):
    import phasescope.monitor as monitor_mod

    monkeypatch.setattr(monitor_mod, "_shared", None)
    monkeypatch.setenv("PHASESCOPE_CONFIG", "")  # the default config path, which may not exist: no prices
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent-phasescope-test")
    try:
        with phasescope.measure("one") as a:
            pass
        shared = monitor_mod._shared
        with phasescope.measure("two") as b:
            pass
        assert shared is not None and monitor_mod._shared is shared  # opened once, not per window
        assert a.result is not None and b.result is not None and b.result.name == "two"
    finally:
        if monitor_mod._shared is not None:
            monitor_mod._shared.close()


# ---- the host's CPU energy through RAPL (a fake powercap tree; this machine has none)


def test_host_energy_through_rapl_with_zeus_breakdown(tmp_path, monkeypatch):
    from phasescope.sources import rapl
    from tests.fakes.fake_powercap import MAX_UJ, make_zone, set_uj

    make_zone(tmp_path, "intel-rapl:0", "package-0", MAX_UJ - 2_000_000)
    make_zone(tmp_path, "intel-rapl:0:0", "dram", 100)
    monkeypatch.setattr(rapl, "POWERCAP", tmp_path)
    with Monitor("host", prices=PRICES) as mon:
        assert mon.interval_s == 5.0  # RAPL wraps: long windows get readings between
        mon.begin_window("w")
        set_uj(tmp_path, "intel-rapl:0", 3_000_000)  # wrapped: 2 J to the top, then 3 J
        set_uj(tmp_path, "intel-rapl:0:0", 1_500_100)  # +1.5 J of DRAM
        m = mon.end_window("w")
    (host,) = m.devices
    assert host.is_host and host.method == "counter"
    assert host.energy_j == pytest.approx(6.5) and m.total_energy_j == pytest.approx(6.5)
    assert dict(host.parts) == pytest.approx({"package-0": 5.0, "package-0/dram": 1.5})
    assert m.cpu_energy == pytest.approx({0: 5.0}) and m.dram_energy == pytest.approx({0: 1.5})
    assert m.gpu_energy == {}
    assert host.cost.energy_usd == pytest.approx(6.5 / 3.6e6 * 0.12)


def test_auto_reports_gpus_and_the_host_when_rapl_is_readable(fake_nvml, sg_traces, tmp_path, monkeypatch):
    from phasescope.sources import rapl
    from tests.fakes.fake_powercap import make_zone, set_uj

    make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    monkeypatch.setattr(rapl, "POWERCAP", tmp_path)
    fake = fake_nvml(sg_traces[:1], energy_from_power=True)
    with Monitor("auto", interval_s=None, prices=PRICES) as mon:
        mon.begin_window("w")
        fake.advance(10)
        set_uj(tmp_path, "intel-rapl:0", 40_000_000)
        m = mon.end_window("w")
    gpu, host = m.devices
    assert gpu.energy_j == pytest.approx(_recorded_joules(sg_traces[0], 0, 10), abs=0.002)
    assert host.is_host and host.energy_j == pytest.approx(40.0)
    assert m.gpu_energy == {0: gpu.energy_j} and m.cpu_energy == pytest.approx({0: 40.0})
    # Zeus's total_energy sums its gpu_energy alone (CPU and DRAM apart): a Zeus user's figure must not grow
    # by the host's 40 J when RAPL is readable. phasescope's own total_energy_j counts every device.
    assert m.total_energy == pytest.approx(gpu.energy_j)
    assert m.total_energy_j == pytest.approx(gpu.energy_j + 40.0)
    # The $/GPU-hour is the GPU's rent, paid once: the host beside it costs its energy only (it used to be
    # billed as a second GPU, doubling the window's time cost).
    assert host.cost.time_usd is None and host.cost.energy_usd == pytest.approx(40.0 / 3.6e6 * 0.12)
    assert m.cost.time_usd == pytest.approx(gpu.span_s / 3600 * 2.5)


def test_auto_without_readable_rapl_reports_the_gpus_only(fake_nvml, sg_traces, tmp_path, monkeypatch):
    from phasescope.sources import rapl

    monkeypatch.setattr(rapl, "POWERCAP", tmp_path)  # empty: no zones
    fake_nvml(sg_traces, energy_from_power=True)
    said: list[str] = []
    with Monitor("auto", prices=PRICES, say=said.append) as mon:
        assert [d.uuid for d in mon.devices] == [t.device.uuid for t in sg_traces]
    assert said == []  # as Zeus without RAPL: the GPUs, and no complaint about the CPU


def test_replay_at_speed_is_metered_on_its_own_clock(shared_data):
    # A replay's readings run `speed` times the wall clock: 0.1 s of sampling is 2 recorded seconds at
    # 20x. Judged by the wall-clock interval, every interval was a gap (coverage ~0.0001, energy ~0).
    spec = f"replay:{shared_data / SENSORGUARD_RUN}?speed=20"
    with Monitor(spec, interval_s=0.1, prices=PRICES, say=lambda line: None) as mon:
        mon.begin_window("w")
        time.sleep(1.0)
        m = mon.end_window("w")
    for dev in m.devices:
        assert dev.method == "integrated_power"
        assert dev.span_s == pytest.approx(20.0, abs=4.0)  # recorded seconds
        assert dev.coverage is not None and dev.coverage > 0.5


# ---- what a Zeus user writes: threads, recursion, forks, forgotten windows (review fixes)


def test_measure_windows_of_one_name_in_two_threads_are_each_their_own():
    # Two threads timing their own "step" on one monitor (the shared one in real use) used to collide:
    # "window 'step' is already open". So did a nested measure() with the default name.
    import threading

    with Monitor("host", interval_s=None, prices=PRICES) as mon:
        both_open = threading.Barrier(2, timeout=10)
        results: list[Measurement | None] = []
        errors: list[BaseException] = []

        def step() -> None:
            try:
                with phasescope.measure("step", monitor=mon) as w:
                    both_open.wait()  # the two windows are open at the same time
                results.append(w.result)
            except BaseException as exc:  # reported below, as the thread's error
                errors.append(exc)
                both_open.abort()

        threads = [threading.Thread(target=step) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert errors == [] and len(results) == 2
        assert all(r is not None and r.name == "step" for r in results)
        with phasescope.measure(monitor=mon) as outer, phasescope.measure(monitor=mon) as inner:
            assert mon.open_windows() == ["window", "window"]
        assert outer.result is not None and inner.result is not None
        assert outer.result.time_s >= inner.result.time_s
        # Windows opened by name keep Zeus's rule: one name, one open window.
        mon.begin_window("named")
        with pytest.raises(ValueError, match="'named' is already open"):
            mon.begin_window("named")
        mon.end_window("named")
        assert mon.open_windows() == []


def test_a_forked_child_refuses_the_parents_monitor_and_gets_its_own_shared_one(monkeypatch):
    # The child's copy used to be used as is: its lock could be held by the parent's sampling thread
    # (end_window then hung forever; seen with a window open at the fork) and its NVML handles are the
    # parent's. Now: one clear RuntimeError, and measure() opens a monitor for the child.
    import phasescope.monitor as monitor_mod

    monkeypatch.setattr(monitor_mod, "_shared", None)
    parent_shared = monitor_mod.shared_monitor()
    try:
        with Monitor("host", interval_s=None, prices=PRICES) as mon:
            mon.begin_window("w")
            pid = os.fork()
            if pid == 0:  # the child: exit code 0 only if every check holds
                code = 1
                try:
                    with pytest.raises(RuntimeError, match=r"opened in process \d+, before a fork"):
                        mon.end_window("w")
                    mon.close()  # leaves the parent's source alone, never blocks
                    child_shared = monitor_mod.shared_monitor()
                    code = 0 if child_shared is not parent_shared and child_shared._pid == os.getpid() else 3
                    child_shared.close()
                except BaseException:  # the exit code says it
                    code = 2
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert mon.end_window("w").samples == 2  # the parent's window is untouched
    finally:
        parent_shared.close()


def test_a_sampling_thread_told_to_stop_puts_no_reading_into_later_windows():
    # end_window then begin_window at once: the old thread, waiting on the lock, used to read once more
    # into the new window beside the new thread.
    import threading

    from phasescope.monitor import _Reads

    with Monitor("host", interval_s=None, prices=PRICES) as mon:
        mon.begin_window("w")
        stopped = threading.Event()
        stopped.set()
        _Reads(mon, stopped).read()
        assert mon.end_window("w").samples == 2  # its begin and end only


def test_closing_with_a_window_still_open_says_it_in_one_line():
    said: list[str] = []
    mon = Monitor("host", interval_s=None, prices=PRICES, say=said.append)
    mon.begin_window("forgotten")
    mon.close()
    assert said[-1] == "monitor closed with window(s) still open, not measured: 'forgotten'"
    assert not any("forgotten" in line for line in said[:-1])


def test_a_rapl_zone_failing_at_the_end_keeps_the_split_equal_to_the_energy(tmp_path, monkeypatch):
    # The DRAM zone cannot be read at the end: the energy stops at the last reading with every zone, and
    # the per-zone split (parts, cpu_energy, dram_energy) used to take the end reading anyway: package to
    # the end, DRAM NaN, and the parts no longer summed to the energy.
    from phasescope.sources import rapl
    from tests.fakes.fake_powercap import make_zone, set_uj

    make_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    make_zone(tmp_path, "intel-rapl:0:0", "dram", 100)
    monkeypatch.setattr(rapl, "POWERCAP", tmp_path)
    with Monitor("host", interval_s=None, prices=PRICES, say=lambda line: None) as mon:
        mon.begin_window("w")
        set_uj(tmp_path, "intel-rapl:0", 3_000_000)  # +2 J
        set_uj(tmp_path, "intel-rapl:0:0", 1_000_100)  # +1 J
        mon.sample()
        set_uj(tmp_path, "intel-rapl:0", 5_000_000)
        (tmp_path / "intel-rapl:0:0" / "energy_uj").unlink()
        m = mon.end_window("w")
    (host,) = m.devices
    assert host.energy_j == pytest.approx(3.0)
    assert dict(host.parts) == pytest.approx({"package-0": 2.0, "package-0/dram": 1.0})
    assert m.cpu_energy == pytest.approx({0: 2.0}) and m.dram_energy == pytest.approx({0: 1.0})


def test_auto_interval_looks_only_at_the_reported_devices(fake_nvml, sg_traces):
    # GPU 0 has no energy counter (power only), GPU 1 has one. Reporting GPU 1 alone needs no background
    # thread: it used to run one at 0.1 s for GPU 0, which no window reports.
    fake = fake_nvml(sg_traces, energy_from_power=True)
    fake.fail("nvmlDeviceGetTotalEnergyConsumption", pynvml.NVML_ERROR_NOT_SUPPORTED, device=0)
    with Monitor("nvml", prices=PRICES) as both:
        assert both.interval_s == 0.1
    with Monitor("nvml", devices=[1], prices=PRICES) as counter_only:
        assert counter_only.interval_s is None
        counter_only.begin_window("w")
        assert counter_only._thread is None
        fake.advance(5)
        m = counter_only.end_window("w")
    (gpu,) = m.devices
    assert gpu.method == "counter"
    assert gpu.energy_j == pytest.approx(_recorded_joules(sg_traces[1], 0, 5), abs=0.002)


def test_prices_as_the_config_files_table(fake_nvml, sg_traces):
    """`prices={...}` (the config's [prices] keys) used to end in an AttributeError ('dict' object has no
    attribute 'for_device') at the first end_window; it is read as the file's table, per-model overrides
    too, and anything else is one line naming the argument."""
    fake = fake_nvml(sg_traces, energy_from_power=True)
    table = {"usd_per_gpu_hour": 1.0, "usd_per_kwh": 0.12, "gpu": {"FAKE replay": {"usd_per_gpu_hour": 2.5}}}
    with Monitor("nvml", prices=table) as mon:
        mon.begin_window("w")
        fake.advance(5)
        m = mon.end_window("w")
    for dev in m.devices:
        assert dev.cost.time_usd == pytest.approx(dev.span_s / 3600 * 2.5)  # the model override
        assert dev.cost.energy_usd == pytest.approx(dev.energy_j / 3.6e6 * 0.12)
    with pytest.raises(InputError, match=r"^Monitor: prices\.usd_per_kwh: expected a number >= 0"):
        Monitor("host", prices={"usd_per_kwh": -1})
    with pytest.raises(InputError, match=r"^Monitor: prices\.usd_per_hour: expected one of the known keys"):
        Monitor("host", prices={"usd_per_hour": 2.5})
    with pytest.raises(InputError, match=r"^Monitor: prices: expected a Prices, a PriceConfig, a mapping"):
        Monitor("host", prices=2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("method_says", [None, "integrated_power", "none"])
def test_energy_is_unmeasured_without_a_covered_second_whatever_the_method_says(
    fake_nvml, sg_traces, monkeypatch, method_says
):
    # A window asks kpi/energy's one rule (`measured`: some covered second), not the meter's method name:
    # one reading (begin and end on one tick), or a power dropout over the whole window, is energy None and
    # said, not 0 J; a covered window has its joules. None is the real meter; "integrated_power" a method
    # named from the sensor seen (as the batch curve names it for one sample), which used to give 0 J;
    # "none" one that used to drop measured joules.
    from phasescope.kpi.energy import EnergyMeter

    if method_says is not None:
        monkeypatch.setattr(EnergyMeter, "method", property(lambda self: method_says))
    trace = sg_traces[0]
    fake = fake_nvml([trace])  # power only
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_TIMEOUT, from_tick=1, until_tick=7)
    with Monitor(RecordedClock(fake), interval_s=None, prices=PRICES) as mon:
        mon.begin_window("first")
        first = mon.end_window("first").devices[0]  # tick 0, read twice on the recording's clock
        fake.advance()
        dark = _sampled_window(mon, fake, 5).devices[0]  # ticks 1-6: no power
        lit = _sampled_window(mon, fake, 5).devices[0]  # ticks 6-11: power from tick 7
    for dev in (first, dark):
        assert dev.energy_j is None and dev.coverage is None and dev.mean_power_w is None
        assert dev.cost.energy_usd is None and dev.cost.time_usd is not None
        assert any("energy not measured" in n for n in dev.notes)
        assert not any("energy covers" in n for n in dev.notes)
    assert dark.span_s == pytest.approx(trace.time[6] - trace.time[1])
    power = np.round(trace["power"][6:12] * 1000) / 1000
    power[0] = np.nan
    ref = device_energy(Trace(trace.device, trace.time[6:12], {"power": power}))
    assert ref.joules > 0 and lit.energy_j == pytest.approx(ref.joules, rel=1e-12)
    assert lit.covered_s == pytest.approx(ref.covered_s) and lit.cost.energy_usd is not None
    assert not any("energy not measured" in n for n in lit.notes)
