"""One verdict (issue 20): the phase the agent exports and the fleet's verdict agree on the same samples.

The real 8x H100 training trace plays through the agent (the replay live source at full speed, its tick loop,
the live classifier, the `/metrics` collector) and through `fleet.judge` on the same samples. The agent's
`phasescope_gpu_phase` gauge must be the live classifier's phase at every scrape, and the live phase may
differ from the fleet's only where the design allows: before the live path has two full windows, and within
the decoder's lag of a change in the fleet's segments (docs/design/live-classifier.md, "One verdict").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from tests.serve.conftest import samples

from phasescope.classify.decide import SegmentParams
from phasescope.classify.model import PhaseModel
from phasescope.features import Floors, resample, sample_interval, window_features
from phasescope.fleet.judge import DeviceVerdict, judge
from phasescope.live.classify import LiveClassifier
from phasescope.serve.agent import Agent
from phasescope.serve.collector import registry_for
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource

H100_RUN = "nvidia-smi-h100-training/power-trace_2025-07-27-00-22-27.csv"
SCRAPE_EVERY_S = 15.0  # data seconds between scrapes, as a Prometheus at its default interval


def lag_bound_s(model: PhaseModel, every_s: float) -> float:
    """The longest the live phase may trail a change in the fleet's segments. The decoder switches once the
    new phase's evidence beats `switch_cost`; a window gives at most log(1/floor) nats, so k windows are
    needed (2 with the shipped 6 nats and 4.6 per window). The fleet puts the change halfway between the
    centres of the last old window and the first new one; the live path sees the k-th new window at its end,
    at the next run: (k - 1/2) strides + half a window + a run's period."""
    p = SegmentParams()
    per_window = -math.log(p.floor)
    k = int(p.switch_cost // per_window) + 1
    cfg = model.config
    return (k - 0.5) * cfg.stride_s + cfg.window_s / 2 + every_s


def compare_with_fleet(fleet: DeviceVerdict, readings: Iterable[tuple[float, str]], start: float,
                       warm_up: float, lag: float) -> tuple[int, int]:
    """(compared, disagreeing) of the agent's (time, phase) readings against the fleet's segments, leaving out
    the warm-up after `start`, the lag bound after each change, and the time past the fleet's last window."""
    changes = [s.start for s in fleet.segments[1:]]
    compared = disagree = 0
    for t, phase in sorted(readings):
        if t < start + warm_up or any(c <= t <= c + lag for c in changes):
            continue
        seg = next((s for s in fleet.segments if s.start <= t <= s.end), None)
        if seg is None:
            continue  # past the fleet's last full window it says nothing
        compared += 1
        disagree += phase != seg.label
    return compared, disagree


def test_agent_phase_gauge_is_the_live_phase_and_agrees_with_the_fleet(
    shared_data: Path, model: PhaseModel
) -> None:
    traces = read(shared_data / H100_RUN)
    assert len(traces) == 8
    clock = [0.0]
    source = ReplaySource(traces, clock=lambda: clock[0], wall_clock=lambda: 0.0)
    classifier = LiveClassifier(model, alarm=False)
    agent = Agent(source, source.native_interval_s, classifier=classifier)
    registry = registry_for(agent, host="h100")
    by_gpu = {str(t.device.index): t.device.uuid for t in traces}
    gauge: dict[str, list[tuple[float, str]]] = {u: [] for u in by_gpu.values()}
    next_scrape = source.t0
    while True:
        batch = source.read()
        if source.exhausted:
            break
        batch.time += source.t0  # the recorded clock, which the fleet's verdict is on
        agent.on_tick(batch)
        clock[0] += source.native_interval_s
        if batch.time < next_scrape:
            continue
        next_scrape += SCRAPE_EVERY_S
        current = samples(generate_latest(registry))["phasescope_gpu_phase"]
        shown = {lab["gpu"]: lab["phase"] for lab, v in current if v == 1.0}
        assert set(shown) == set(by_gpu)  # one phase per GPU, every scrape
        for gpu, phase in shown.items():
            uuid = by_gpu[gpu]
            r = classifier.reading(uuid)
            assert phase == (r.phase if r else "unknown"), (gpu, batch.time)  # the gauge is the live phase
            gauge[uuid].append((batch.time, phase))

    warm_up = model.config.window_s + model.config.stride_s + classifier.every_s
    lag = lag_bound_s(model, classifier.every_s)
    for trace in traces:
        fleet = judge(trace, model)
        assert fleet.label == "training"
        readings = gauge[trace.device.uuid]
        compared, disagree = compare_with_fleet(fleet, readings, float(trace.time[0]), warm_up, lag)
        assert compared >= 40, trace.device.label()  # 687 s at a 15 s scrape, less the warm-up
        assert disagree == 0, f"{trace.device.label()}: {disagree} of {compared} scrapes disagree"


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


def test_a_cut_trace_with_the_floors_before_it_has_the_whole_traces_windows(shared_data: Path) -> None:
    """`features.Floors`: what the live path carries so that a window cut from its recent samples reads
    the power and memory floors the verdict's window reads from the device's first sample. On the H100
    run GPU 0's memory rose 40 GiB in its first minutes: without the floors a window 5 minutes in read a
    0.02 GiB rise, and the model called the run inference."""
    trace = read(shared_data / H100_RUN)[0]
    cfg = PhaseModel.load().config
    whole = window_features(trace, cfg)
    t0 = float(trace.time[0])
    cut = t0 + 12 * cfg.stride_s  # on the whole trace's window grid
    before = trace.take(np.flatnonzero(trace.time < cut - 0.05))
    after = trace.take(np.flatnonzero(trace.time >= cut - 0.05))
    dt = max(sample_interval(trace.time), cfg.min_grid_s)
    _, grid = resample(before, dt, ["power", "mem_used"])
    floors = Floors(float(np.nanmin(grid["power"])), float(np.nanmin(grid["mem_used"])))
    cut_plain, cut_floored = window_features(after, cfg), window_features(after, cfg, floors=floors)
    k = int(np.argmin(np.abs(whole.start - cut_floored.start[0])))
    assert abs(whole.start[k] - cut_floored.start[0]) < 0.1  # the same windows, to a sample's jitter
    n = len(cut_floored.start)
    for name in ("mem_rise_gib", "power_above_floor"):
        want = whole.column(name)[k:k + n]
        np.testing.assert_allclose(cut_floored.column(name), want, rtol=0.02, atol=0.05)
    rise = whole.column("mem_rise_gib")[k:k + n]
    # What the floors fix: most windows read ~40 GiB of rise; cut without them, almost none.
    assert np.nanmedian(rise) > 30 and np.nanmedian(cut_plain.column("mem_rise_gib")) < 1
