"""NVML's sample buffers (nvmlDeviceGetSamples) read each tick by NvmlSource, scripted in the fake NVML from
our own 10 Hz H200 recordings (data/h200): a 1 Hz poll sees every 10 Hz sample once, at its own time.

data/h200 holds no workload with a true period between the 10 Hz and 1 Hz limits (its training steps take
11-55 ms; other_bursty's gaps are random), so the KPI test checks the mechanics: a 1 Hz agent with the fine
samples gets the same telemetry KPIs as a 10 Hz recorder of the same GPU, and a shortest visible period a 1 Hz
poll alone cannot reach."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pynvml
import pytest

from phasescope.kpi import rhythm
from phasescope.live.annotate import ring_kpis
from phasescope.live.fine import FineSamples, near
from phasescope.live.state import LiveState
from phasescope.schema import DeviceInfo, TickBatch, Trace
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read

H200_10HZ = Path(__file__).resolve().parents[2] / "data" / "h200" / "10hz"
PER_POLL = 10  # fake ticks (10 Hz samples) per read: a 1 Hz poll of a 10 Hz trace
POLLS = 29  # other_bursty holds 295 samples: 29 polls reach sample 280, inside the recording


@pytest.fixture(scope="module")
def bursty() -> Trace:
    (trace,) = read(str(H200_10HZ / "other_bursty.parquet"), "auto")
    return trace


def _poll(src: NvmlSource, fake, polls: int = POLLS) -> list[TickBatch]:
    out = []
    for _ in range(polls):
        out.append(src.read())
        fake.advance(PER_POLL)
    return out


def _joined(batches: list[TickBatch], uuid: str, signal: str) -> tuple[np.ndarray, np.ndarray]:
    parts = [b.fine[uuid][signal] for b in batches if signal in b.fine.get(uuid, {})]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def test_a_1hz_poll_of_a_10hz_trace_returns_every_sample_once_at_its_own_time(fake_nvml, bursty):
    epoch = time.time() - 100.0  # a driver stamping Unix microseconds, as real ones do
    fake = fake_nvml([bursty], sample_clock=(epoch, 0.1), loop=False)
    src = NvmlSource(processes=False, health=False)
    uuid = src.devices()[0].uuid
    batches = _poll(src, fake)
    last = (POLLS - 1) * PER_POLL
    want_t = epoch + np.arange(last + 1) * 0.1
    for signal, nvml_scale in (("gpu_util", 100.0), ("power", 1000.0), ("mem_util", 100.0)):
        t, v = _joined(batches, uuid, signal)
        assert np.all(np.diff(t) > 0), f"{signal}: a sample repeated or out of order across ticks"
        np.testing.assert_allclose(t, np.round(want_t * 1e6) / 1e6, atol=2e-6, err_msg=signal)
        want_v = np.round(bursty[signal][: last + 1] * nvml_scale) / nvml_scale  # NVML's integer units
        np.testing.assert_allclose(v, want_v, rtol=0, atol=1e-9, err_msg=signal)
    assert fake.calls["nvmlDeviceGetSamples"] == 3 * POLLS  # one call per kind and tick
    assert "nvmlDeviceGetSamples" not in src.error_counts()


def test_a_driver_clock_that_is_not_unix_time_is_anchored_to_the_tick(fake_nvml, bursty):
    fake = fake_nvml([bursty], sample_clock=(1000.0, 0.1))  # seconds since boot, say
    src = NvmlSource(processes=False, health=False)
    uuid = src.devices()[0].uuid
    batches = _poll(src, fake, 5)
    t, _ = _joined(batches, uuid, "power")
    assert t[0] == pytest.approx(batches[0].time, abs=1e-6)  # the first sample is read as of its tick
    np.testing.assert_allclose(np.diff(t), 0.1, atol=1e-6)  # the rest keep the driver's spacing
    assert t.size == 4 * PER_POLL + 1


def test_not_supported_is_asked_once_per_kind_and_the_rows_go_on(fake_nvml, bursty):
    fake = fake_nvml([bursty])
    fake.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_NOT_SUPPORTED)
    src = NvmlSource(processes=False, health=False)
    batches = _poll(src, fake, 5)
    assert fake.calls["nvmlDeviceGetSamples"] == 3
    assert src.error_counts()["nvmlDeviceGetSamples"] == 3
    uuid = src.devices()[0].uuid
    assert [c for c in src.unsupported_calls()[uuid] if "Samples" in c] == [
        "nvmlDeviceGetSamples:gpu_util", "nvmlDeviceGetSamples:mem_util", "nvmlDeviceGetSamples:power"]
    assert all(not b.fine for b in batches)
    assert all(np.isfinite(b.value(uuid, "power")) for b in batches)


def test_a_driver_error_is_counted_and_the_next_tick_gets_what_was_missed(fake_nvml, bursty):
    epoch = time.time() - 100.0
    fake = fake_nvml([bursty], sample_clock=(epoch, 0.1))
    fake.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_UNKNOWN, from_tick=PER_POLL, until_tick=2 * PER_POLL)
    src = NvmlSource(processes=False, health=False)
    uuid = src.devices()[0].uuid
    batches = _poll(src, fake, 4)
    assert src.error_counts()["nvmlDeviceGetSamples"] == 3  # one failing call per kind, in one tick
    assert uuid not in batches[1].fine
    assert np.isfinite(batches[1].value(uuid, "gpu_util"))  # the tick itself went on
    assert not any("Samples" in c for c in src.unsupported_calls().get(uuid, []))  # asked again next tick
    t, _ = _joined(batches, uuid, "gpu_util")
    np.testing.assert_allclose(t, epoch + np.arange(3 * PER_POLL + 1) * 0.1, atol=2e-6)


def test_a_gpu_lost_in_the_sample_call_is_marked_lost(fake_nvml, bursty):
    fake = fake_nvml([bursty])
    fake.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_GPU_IS_LOST, from_tick=PER_POLL)
    src = NvmlSource(processes=False, health=False)
    batches = _poll(src, fake, 3)
    assert any(e.startswith("GPU lost") and "nvmlDeviceGetSamples" in e for e in batches[1].events)
    assert np.isnan(batches[2].values).all() and not batches[2].fine


def test_impossible_samples_are_dropped_and_counted(fake_nvml, bursty):
    cols = {name: bursty[name] for name in bursty.present_signals()}
    broken = Trace(bursty.device, bursty.time, {**cols, "power": cols["power"] * 100.0})  # 12 kW: garbage
    fake_nvml([broken], sample_clock=(time.time() - 100.0, 0.1))
    src = NvmlSource(processes=False, health=False)
    batch = src.read()
    assert "power" not in batch.fine.get(src.devices()[0].uuid, {})
    assert src.error_counts()["impossible power sample"] == 1


def _state(batches: list[TickBatch], epoch: float, fine: bool) -> LiveState:
    """The batches into a LiveState on the data clock (each tick at its poll's sample time)."""
    state = LiveState("nvml")
    for k, b in enumerate(batches):
        state.ingest(dataclasses.replace(b, time=epoch + k * PER_POLL * 0.1, fine=b.fine if fine else {}))
    return state


def test_the_fine_samples_give_a_1hz_agent_the_10hz_kpis(fake_nvml, bursty):
    epoch = time.time() - 100.0
    fake = fake_nvml([bursty], sample_clock=(epoch, 0.1), loop=False)
    src = NvmlSource(processes=False, health=False)
    uuid = src.devices()[0].uuid
    batches = _poll(src, fake)
    coarse = ring_kpis(_state(batches, epoch, fine=False), uuid, "training")
    fine = ring_kpis(_state(batches, epoch, fine=True), uuid, "training")
    # What a 10 Hz recorder of the same GPU over the same samples gives (NVML's integer units).
    n = (POLLS - 1) * PER_POLL + 1
    u = np.round(bursty["gpu_util"][:n] * 100) / 100
    p = np.round(bursty["power"][:n] * 1000) / 1000
    ten_hz = rhythm.training_figures(epoch + np.arange(n) * 0.1, u, p)
    assert fine["fine_samples"] == n and "fine_samples" not in coarse
    for key in ("step_period_s", "stall_fraction", "shortest_visible_period_s"):
        assert fine[key]["value"] == pytest.approx(ten_hz[key].value, rel=1e-6), key
    # A 1 Hz poll alone cannot see a period under two seconds; with the driver's samples, down to 0.3 s.
    assert coarse["shortest_visible_period_s"]["value"] >= 2.0
    assert fine["shortest_visible_period_s"]["value"] == pytest.approx(0.3, abs=0.01)


def test_fine_samples_are_bounded_and_read_since_a_time() -> None:
    ring = FineSamples(capacity=5)
    dev = [DeviceInfo(uuid="GPU-a")]
    for k in range(3):
        t = np.arange(4.0) + 4 * k
        ring.ingest(TickBatch(float(t[-1]), dev, np.empty((1, 0)), fine={"GPU-a": {"power": (t, t * 10)}}))
    t, v = ring.signal("GPU-a", "power")
    np.testing.assert_array_equal(t, [7.0, 8.0, 9.0, 10.0, 11.0])
    np.testing.assert_array_equal(v, t * 10)
    assert ring.signal("GPU-a", "power", start=10.0)[0].tolist() == [10.0, 11.0]
    assert ring.signal("GPU-b", "power")[0].size == 0
    assert ring.span("GPU-a", 0.0) is None  # fewer than MIN_SAMPLES: the rows' KPIs stand


def test_the_other_signal_is_not_drawn_across_its_gaps() -> None:
    src_t = np.array([0.0, 0.1, 0.2, 0.3, 2.0, 2.1])
    got = near(np.array([0.05, 0.25, 1.0, 2.05, 3.0]), src_t, src_t * 10)
    np.testing.assert_allclose(got[:2], [0.5, 2.5])
    assert np.isnan(got[2]) and np.isnan(got[4])  # in the 1.7 s gap, and after the last sample
    assert got[3] == pytest.approx(20.5)
