"""`phasescope top --once --duration` on replayed shared traces shows the telemetry-only KPIs of each GPU's
phase (issue 19's "done when"): a step period and stall share on training, busy fraction and bursts on
inference. Real CLI, sources, sampler and clock: each test replays tens of seconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from phasescope.cli import main
from phasescope.views.display import MISSING
from phasescope.views.table import COLUMNS
from tests.live.test_telemetry_kpis import SERVING_RUN
from tests.live_helpers import TRAINING_RUN

RHYTHM = [c.key for c in COLUMNS].index("rhythm")


def _cells(out: str, gpu: int) -> list[str]:
    line = [ln for ln in out.splitlines() if ln.startswith(f"│ #{gpu} ")][-1]
    return [c.strip() for c in line.split("│")[1:-1]]


@pytest.mark.slow
def test_once_shows_a_step_period_and_stall_share_on_a_training_replay(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # nothing cut
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=10"  # 1 Hz recorded: every sample at 0.1 s
    assert main(["top", "--once", "--duration", "46s", "--interval", "0.1", "--source", spec]) == 0
    out = capsys.readouterr().out
    assert "Telemetry KPIs" in out
    train, idle = _cells(out, 0), _cells(out, 1)
    assert train[1].startswith("training")
    cell = train[RHYTHM]
    assert re.fullmatch(r"step [\d.]+ (ms|s|m|h) · steps/h [\d.]+k? · stall \d+%", cell), cell
    assert idle[1].startswith("idle") and idle[RHYTHM] == MISSING


@pytest.mark.slow
def test_once_shows_busy_fraction_and_bursts_on_an_inference_replay(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    spec = f"replay:{shared_data / SERVING_RUN}?speed=2"  # 4 Hz recorded: every sample at 0.125 s
    assert main(["top", "--once", "--duration", "20s", "--source", spec]) == 0
    out = capsys.readouterr().out
    serve = _cells(out, 0)
    assert serve[1].startswith("inference")
    assert re.fullmatch(r"busy \d+% · bursts/min [\d.]+ · (headroom|saturated)", serve[RHYTHM]), serve[RHYTHM]
