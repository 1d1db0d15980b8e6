"""One tick loop and one energy meter per process (issue 17), by construction, for `run` and `Monitor` too.

`phasescope run`'s `DeviceWatch` used to own a sampler and a `FleetEnergyMeter`; `monitor.Monitor` chose its
sources itself. Now the watch is a thin user of `live/loop.py`'s `TickLoop` (whose meter `top`, `serve` and
`demo` use), and the Monitor opens sources only through `sources/open.py`. These tests do not compare
figures from two meters: they watch which meter objects the energy step runs on and where sources come from.
"""

from __future__ import annotations

import ast
import inspect
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import phasescope.monitor as monitor_mod
from phasescope.cli import run as run_mod
from phasescope.cli.run import DeviceWatch
from phasescope.kpi.cost import Prices
from phasescope.kpi.energy import EnergyMeter, FleetEnergyMeter
from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState
from phasescope.monitor import Monitor
from phasescope.sources.open import open_source

REPO = Path(__file__).resolve().parents[2]
H200_1HZ = REPO / "data" / "h200" / "1hz" / "other_bursty.parquet"  # NVML energy counter, 1 Hz


@pytest.fixture
def metered(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FleetEnergyMeter]]:
    """Every FleetEnergyMeter the energy step runs on, in call order (the real update still runs)."""
    calls: list[FleetEnergyMeter] = []
    real = FleetEnergyMeter.update

    def update(self: FleetEnergyMeter, batch: Any, phases: Any = None) -> None:
        calls.append(self)
        real(self, batch, phases)

    monkeypatch.setattr(FleetEnergyMeter, "update", update)
    yield calls


def test_run_meters_through_its_tick_loops_one_meter(metered: list[FleetEnergyMeter]) -> None:
    """A real recording watched as `phasescope run` watches it (its thread, its source spec): every energy
    step runs on the watch's TickLoop's meter, and the summary's energy is that meter's."""
    watch = DeviceWatch(f"replay:{H200_1HZ}?speed=20", 0.1)
    watch.start()
    deadline = time.monotonic() + 30
    while (watch.loop is None or watch.loop.state.ticks < 5) and time.monotonic() < deadline:
        time.sleep(0.05)
    telemetry = watch.finish()
    loop = watch.loop
    assert isinstance(loop, TickLoop) and loop.state.ticks >= 5, watch.notes
    assert metered and set(map(id, metered)) == {id(loop.energy)}  # one meter, the loop's
    # The watch keeps no meter of its own beside it.
    assert not [v for v in vars(watch).values() if isinstance(v, FleetEnergyMeter | EnergyMeter)]
    (device,) = telemetry["devices"]
    (result,) = loop.energy.results()
    assert device["uuid"] == result.device and device["energy_j"] == result.measured_joules
    assert device["energy"]["method"] == result.method == "counter"
    assert device["samples"] == loop.state.ticks


def test_monitor_windows_meter_with_the_loops_meter_class(metered: list[FleetEnergyMeter]) -> None:
    """Each window's energy is a FleetEnergyMeter's, the class the tick loop meters with: every reading a
    window takes goes through it, and the Measurement's figure is that meter's result."""
    with Monitor(f"replay:{H200_1HZ}?speed=20", interval_s=0.1, prices=Prices()) as mon:
        mon.begin_window("w")
        time.sleep(0.5)
        m = mon.end_window("w")
    loop = TickLoop(open_source(f"replay:{H200_1HZ}"), 1.0, LiveState())
    window_meters = {id(x): x for x in metered}
    assert len(window_meters) == 1 and len(metered) == m.samples >= 3
    (meter,) = window_meters.values()
    assert type(meter) is type(loop.energy) is FleetEnergyMeter
    loop.source.close()
    (dev,) = m.devices
    (result,) = meter.results()
    assert dev.energy_j == result.measured_joules and dev.method == result.method == "counter"
    assert (dev.span_s, dev.covered_s) == (result.span_s, result.covered_s)


def test_monitor_opens_its_sources_only_through_sources_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec goes to `sources/open.open_source` (lean); monitor.py builds no reader itself."""
    seen: list[tuple[str, bool]] = []
    real = monitor_mod.open_source

    def spy(spec: str, *, say: Any = None, lean: bool = False) -> Any:
        seen.append((spec, lean))
        return real(spec, say=say, lean=lean)

    monkeypatch.setattr(monitor_mod, "open_source", spy)
    with Monitor(" host ", interval_s=None, prices=Prices()) as mon:
        assert [d.extra.get("kind") for d in mon.devices] == ["host"]
    assert seen == [("host", True)]
    # No second source choice: monitor.py never names a reader class (the choice is open.py's alone).
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(ast.parse(inspect.getsource(
        monitor_mod))) if isinstance(n, ast.Name | ast.Attribute)}
    assert not names & {"NvmlSource", "HostSource", "CombinedSource", "RaplReader", "nvml_available"}


def test_run_module_owns_no_sampler_or_meter() -> None:
    """`cli/run.py` builds no Sampler or energy meter: the tick loop's are the only ones."""
    names = {n.id for n in ast.walk(ast.parse(inspect.getsource(run_mod))) if isinstance(n, ast.Name)}
    assert not names & {"Sampler", "FleetEnergyMeter", "EnergyMeter", "device_energy"}
    assert "TickLoop" in names
