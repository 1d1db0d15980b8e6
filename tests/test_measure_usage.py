"""phasescope.measure / Monitor used as an ML engineer would: the mistakes and edge cases a bug hunt found.

GPUs are the scripted fake NVML replaying a real SensorGuard RTX 3090 recording, as in test_measure.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import phasescope
from phasescope.errors import InputError
from phasescope.kpi.cost import Prices
from phasescope.monitor import Monitor
from phasescope.schema import Trace
from phasescope.sources.replay import read

SENSORGUARD_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
PRICES = Prices(usd_per_gpu_hour=2.5, usd_per_kwh=0.12)


@pytest.fixture(scope="module")
def sg_traces(shared_data: Path) -> list[Trace]:
    return read(shared_data / SENSORGUARD_RUN)


def test_a_device_named_twice_is_reported_once_not_counted_twice(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, energy_from_power=True)
    gpu0 = sg_traces[0].device.uuid
    with Monitor("nvml", prices=PRICES, devices=[0, gpu0]) as mon:  # by index and by uuid: one GPU
        assert [d.uuid for d in mon.devices] == [gpu0]
        mon.begin_window("w")
        fake.advance(5)
        m = mon.end_window("w")
    assert [d.uuid for d in m.devices] == [gpu0]
    assert m.total_energy_j == m.devices[0].energy_j == m.gpu_energy[0]
    assert m.cost == m.devices[0].cost


def test_measure_as_a_decorator_fails_clearly_and_closes_its_own_monitor():
    with pytest.raises(TypeError, match=r"measure\('step'\) is a context manager, not a decorator"):

        @phasescope.measure("step", source="host")
        def step() -> None:
            pass

    w = phasescope.measure("step", source="host", prices=PRICES)
    with pytest.raises(TypeError):
        w(lambda: None)
    assert w.monitor._closed  # the Monitor made for that one window is not left open


def test_gpu_lost_in_a_counter_window_without_sampling_says_energy_not_measured(fake_nvml, sg_traces):
    # The default for counter GPUs: no background thread, so a GPU lost before end_window leaves one
    # counter reading, and no energy: the note must not claim the energy "stops at its last reading".
    fake = fake_nvml(sg_traces, energy_from_power=True)
    fake.lose(0, from_tick=3)
    with Monitor("nvml", prices=PRICES, say=lambda _line: None) as mon:
        assert mon.interval_s is None
        mon.begin_window("w")
        fake.advance(5)
        lost, other = mon.end_window("w").devices
    assert lost.energy_j is None
    dark = [n for n in lost.notes if n.startswith("no reading at the end")]
    assert len(dark) == 1 and dark[0].endswith("energy not measured")
    assert not any("stops at its last reading" in n for n in lost.notes)
    assert other.energy_j is not None and other.notes == ()


def test_print_of_a_measurement_is_a_short_readable_summary(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, energy_from_power=True)
    fake.lose(1, from_tick=3)
    with Monitor("nvml", prices=PRICES, say=lambda _line: None) as mon:
        mon.begin_window("epoch")
        fake.advance(5)
        m = mon.end_window("epoch")
    text = str(m)
    lines = text.splitlines()
    assert lines[0].startswith("window 'epoch': ") and " J, cost $" in lines[0]
    assert lines[1].startswith(f"  GPU 0 {m.devices[0].name} ({m.devices[0].uuid}): ")
    assert "[counter]" in lines[1] and "W mean" in lines[1]
    assert any(line.startswith("  GPU 1 ") and "not measured [none]" in line for line in lines)
    assert any(line.startswith("    note: no reading at the end") for line in lines)
    assert "Measurement(" not in text and max(len(line) for line in lines) < 200
    assert repr(m).startswith("Measurement(")  # repr() keeps every field
    json.dumps(m.to_dict(), allow_nan=False)


def test_the_configs_gap_factor_applies_when_prices_are_given(tmp_path, monkeypatch):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[prices]\nusd_per_kwh = 0.2\n\n[thresholds]\nenergy_gap_factor = 7\n")
    monkeypatch.setenv("PHASESCOPE_CONFIG", str(cfg))
    with Monitor("host") as mon:
        assert mon.gap_factor == 7.0
    # prices= replaces the file's [prices], not its thresholds (docs/design/config.md: they always apply).
    with Monitor("host", prices=PRICES) as mon:
        assert mon.gap_factor == 7.0 and mon._prices == PRICES
    with Monitor("host", prices={"usd_per_kwh": 0.3}) as mon:
        assert mon.gap_factor == 7.0


def test_a_host_window_too_short_for_rapl_says_zero_is_a_lower_bound(tmp_path, monkeypatch):
    from phasescope.sources import rapl
    from tests.fakes.fake_powercap import make_zone

    make_zone(tmp_path, "intel-rapl:0", "package-0", 1_000)
    monkeypatch.setattr(rapl, "POWERCAP", tmp_path)
    with Monitor("host", prices=PRICES) as mon:
        mon.begin_window("tiny")
        (host,) = mon.end_window("tiny").devices  # the counter has not moved: as a sub-ms window on RAPL
    assert host.method == "counter" and host.energy_j == 0.0
    assert any("did not advance" in n and "lower bound" in n for n in host.notes)


def test_print_of_a_long_window_reads_without_exponents():
    from phasescope.kpi.cost import Cost
    from phasescope.monitor import DeviceMeasurement, Measurement

    gpu = DeviceMeasurement("GPU-1", "NVIDIA H200", 0, "counter", 2_345_678.9, 7200.0, 7200.0, 0.93,
                            Cost(9.0, 0.08))
    first = str(Measurement("epoch", 0.0, 7200.4, (gpu,), 1441)).splitlines()[0]
    assert first == "window 'epoch': 7,200 s, energy 2,345,679 J, cost $9.08"


def test_devices_given_as_one_index_or_uuid_or_empty(fake_nvml, sg_traces):
    fake_nvml(sg_traces, energy_from_power=True)
    gpu1 = sg_traces[1].device.uuid
    for one in (1, gpu1, gpu1[:12]):  # not iterated character by character / "'int' is not iterable"
        with Monitor("nvml", prices=PRICES, devices=one) as mon:
            assert [d.uuid for d in mon.devices] == [gpu1]
    with pytest.raises(InputError, match=r"^Monitor: devices: expected NVML indices or uuids"):
        Monitor("nvml", prices=PRICES, devices=[])  # would measure no device at all
    with pytest.raises(InputError, match="interval_s"):
        Monitor("nvml", prices=PRICES, interval_s=True)  # a bool is not a period (it read as 1 s)
