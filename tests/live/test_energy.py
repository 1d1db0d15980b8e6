"""The live energy so far (the tick loop's one meter) at tick intervals other than 1 s: the same figure as the
offline `kpi.energy`; and one meter per process, by construction, for every view of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.kpi.cost import Prices
from phasescope.kpi.energy import FleetEnergyMeter, device_energy
from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState
from phasescope.schema import Trace
from phasescope.sources.replay_live import ReplaySource
from phasescope.views import table
from phasescope.views.display import MISSING
from tests.live_helpers import ticks, training_traces


@pytest.fixture(scope="module")
def traces(shared_data: Path) -> list[Trace]:
    return training_traces(shared_data)


@pytest.mark.parametrize("every", [5, 10])
def test_energy_at_sparse_ticks_matches_offline(traces: list[Trace], every: int) -> None:
    """Ticks 5 or 10 s apart (a replay of a 10 s recording, `top --interval 5` without an energy counter):
    the meter learns the period from the ticks, so it integrates what the offline method integrates on the
    same real samples, and still leaves a 100 s hole (over 3 periods) uncovered like it."""
    n = min(len(t) for t in traces)
    keep = np.arange(0, n, every)
    keep = keep[(keep < 200) | (keep >= 300)]
    state = LiveState("replay", prices=Prices(usd_per_gpu_hour=2.0, usd_per_kwh=0.3))
    loop = TickLoop(ReplaySource(traces), 1.0, state)
    wanted = set(keep.tolist())
    for i, batch in enumerate(ticks(traces)):
        if i in wanted:
            loop.on_tick(batch)
    for tr in traces:
        offline = device_energy(tr.take(keep))
        live = state.energy_results()[tr.device.uuid]
        assert live.method == offline.method == "integrated_power"
        assert live.joules == pytest.approx(offline.joules, rel=1e-6) and live.joules > 0
        assert live.covered_s == pytest.approx(offline.covered_s, rel=1e-6)
        assert offline.uncovered_s > 90  # the hole is left out, not bridged
    joules, _ = state.energy_totals()
    status = table.status_line(state)
    assert f"energy {joules / 3.6e6:.3f} kWh" in status and f"energy {MISSING} kWh" not in status


def test_counter_reset_at_10s_ticks_is_bridged_like_offline(traces: list[Trace]) -> None:
    """With an energy counter (built from the real power's running integral) that resets once, the one
    interval across the reset is bridged with power at 10 s ticks too, as the offline method bridges it."""
    n = min(len(t) for t in traces)
    keep = np.arange(0, n, 10)
    tr = traces[0].take(slice(0, n))
    t, p = tr.time, tr["power"]
    counter = 5e6 + np.concatenate(([0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * np.diff(t))))
    counter[400:] -= counter[400] - 10.0  # a driver reload between kept ticks 390 and 400
    tr = tr.with_columns(energy=counter)
    state = LiveState("replay")
    loop = TickLoop(ReplaySource([tr]), 1.0, state)
    for i, batch in enumerate(ticks([tr])):
        if i % 10 == 0:
            loop.on_tick(batch)
    offline = device_energy(tr.take(keep))
    live = loop.energy.meters[tr.device.uuid].result()
    assert (live.method, live.resets) == (offline.method, offline.resets) == ("counter", 1)
    assert live.joules == pytest.approx(offline.joules, rel=1e-9)
    assert live.covered_s == pytest.approx(offline.covered_s, rel=1e-9) == offline.span_s


def test_serve_agent_at_5s_ticks_over_a_1s_replay_matches_offline(traces: list[Trace]) -> None:
    """`serve --interval 5` over a real 1 s recording: the dashboard's energy and the status line's equal
    the offline figure on the ticks taken; before, both read 0 (all gaps)."""
    from phasescope.serve.agent import Agent

    now = [0.0]
    source = ReplaySource(traces, clock=lambda: now[0], wall_clock=lambda: 1.7e9)
    agent = Agent(source, 5.0)
    for k in range(60):
        now[0] = 5.0 * k
        agent.on_tick(source.read())
    state = agent.state
    for uuid in state.device_uuids():
        power = {"power": state.history(uuid, "power")}
        taken = Trace(state.device_info(uuid), state.history_times(uuid), power)
        assert len(taken) == 60
        offline = device_energy(taken).joules
        assert offline > 0
        assert agent.energy_results()[uuid].joules == pytest.approx(offline, rel=1e-9)
        assert state.energy_results()[uuid].joules == pytest.approx(offline, rel=1e-9)


def _meters(obj: object) -> list[FleetEnergyMeter]:
    return [v for v in vars(obj).values() if isinstance(v, FleetEnergyMeter)]


def test_serve_and_top_read_one_meter_by_construction(
    shared_data: Path, traces: list[Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One energy meter per process: `serve`'s dashboard (`Agent.energy_results`, /metrics), its status line
    and `top`'s table and status line (the state) all read the tick loop's one meter, and neither the agent
    nor the state holds a meter of its own. Driven through `top`'s real pipeline (`run_live --once` over a
    real replay) and `serve`'s agent on the same recording."""
    from phasescope.cli import top as top_module
    from phasescope.serve.agent import Agent
    from tests.live_helpers import TRAINING_RUN

    loops: list[TickLoop] = []

    class SpyLoop(TickLoop):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            loops.append(self)

    # serve: the agent's loop is the only pipeline; its readers and the state's read the same results.
    now = [0.0]
    source = ReplaySource(traces, clock=lambda: now[0], wall_clock=lambda: 1.7e9)
    agent = Agent(source, 1.0)
    for k in range(30):
        now[0] = float(k)
        agent.on_tick(source.read())
    assert _meters(agent) == [] and _meters(agent.state) == []
    assert isinstance(agent.loop.energy, FleetEnergyMeter)
    served, shown = agent.energy_results(), agent.state.energy_results()
    assert served.keys() == shown.keys() == agent.loop.energy.meters.keys() and served
    for uuid, result in served.items():
        assert result is shown[uuid]  # one meter's hand-over, not two meters kept equal by tests
        assert result.joules == agent.loop.energy.meters[uuid].joules > 0
    joules, _ = agent.state.energy_totals()
    assert joules == pytest.approx(sum(r.joules for r in served.values() if r.measured))

    # top: run_live builds one loop; the state it returns reads that loop's meter.
    monkeypatch.setattr(top_module, "TickLoop", SpyLoop)
    replay = ReplaySource.from_path(shared_data / TRAINING_RUN, speed=20)
    state = top_module.run_live(replay, 0.1, mode="once", classify=False, prices=Prices())
    (loop,) = loops
    assert loop.state is state and _meters(state) == []
    top_shown = state.energy_results()
    assert top_shown.keys() == loop.energy.meters.keys() and top_shown
    for uuid, result in top_shown.items():
        assert result.joules == loop.energy.meters[uuid].joules
