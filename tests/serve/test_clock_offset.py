"""/api/state's `clock_offset_s`: what the page adds to every time so a replay plots the trace's own clock."""

from __future__ import annotations

from pathlib import Path

from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.serve.agent import Agent
from phasescope.sources.host import HostSource
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource
from tests.serve.conftest import MIGRATION_RUN

WALL = 1_800_000_000.0  # the wall clock the replay starts at


def test_a_replay_hands_its_offset_and_a_live_source_zero(shared_data: Path) -> None:
    traces = read(shared_data / MIGRATION_RUN)
    src = ReplaySource(traces, wall_clock=lambda: WALL)
    model = PhaseModel.load()
    snap = Agent(src, 1.0, classifier=LiveClassifier(model)).snapshot()
    anchor = float(traces[0].meta.get("utc_offset") or 0.0)  # a raw clock's tie to UTC, where the log has one
    assert snap["clock_offset_s"] == round(src.t0 + anchor - WALL, 3) != 0
    # A tick stamped at the replay's start is the recording's first moment (in Unix time) once it is added.
    assert abs(WALL + snap["clock_offset_s"] - float(min(t.time[0] for t in traces)) - anchor) < 2
    host = HostSource()
    try:
        assert Agent(host, 1.0, classifier=LiveClassifier(model)).snapshot()["clock_offset_s"] == 0
    finally:
        host.close()
