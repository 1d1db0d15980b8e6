"""Edges of the CLI's float options, of `live_interval` in `top`, of Ctrl-C and of `-h` (review of d096091 /
1ce0af6).

- `--interval nan` passed click's FloatRange (nan < 0.1 is false) and ended in a traceback from the view's
  ring size; `--interval inf`, let through once top's 3600 s maximum was gone, stopped the sampler at once
  and exited 0 with an empty table; 1e10 s overflows the sampler's wait. Each is now a usage error (2).
- `top --once` on a replay waited for a second sample at the replay's own rate: 57 s on Alibaba's
  one-a-minute file, where it took 2 s before.
- Ctrl-C ends a plain `top` with exit 0 and its last table; a `--once` cut short of its two samples must
  not print a half-read snapshot with exit 0 (a script would take it for a good one).
"""

from __future__ import annotations

import _thread
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from phasescope.cli import main
from phasescope.cli import top as top_mod
from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState

ALIBABA = "alibaba-gentd26/pod_gpu_duty_cycle_anon.csv"  # one sample a minute


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("value", ["nan", "inf", "1e10", "0.05"])
@pytest.mark.parametrize(
    "argv",
    [
        ["top", "--once", "--source", "host"],
        ["record", "--duration", "1", "--source", "host"],
        ["ledger", "--duration", "1", "--source", "host"],
        ["run", "--source", "none", "--report", "-", "--", "true"],
        ["serve", "--source", "host"],
    ],
    ids=lambda a: a[0],
)
def test_an_interval_that_is_not_a_usable_number_is_a_usage_error(
    argv: list[str], value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[0] in ("record", "ledger"):
        argv = [*argv, "-o", str(tmp_path / "out")]
    assert main([argv[0], "--interval", value, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--interval'" in err and "Traceback" not in err


def test_once_on_a_slow_replay_does_not_wait_a_replay_interval_for_its_second_sample(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_run_live(source: Any, interval_s: float, **kwargs: Any) -> None:
        seen["interval"] = interval_s
        source.close()

    monkeypatch.setattr(top_mod, "run_live", fake_run_live)
    src = f"replay:{shared_data / ALIBABA}"
    assert main(["top", "--once", "--no-classify", "--source", src]) == 0
    assert seen["interval"] <= 1.0  # was 57 s: the file's own spacing
    assert main(["top", "--plain", "--no-classify", "--source", src]) == 0
    assert seen["interval"] == pytest.approx(57.0)  # a running view keeps the replay's own rate
    assert main(["top", "--once", "--no-classify", "--interval", "30", "--source", src]) == 0
    assert seen["interval"] == 30.0  # an --interval given is kept


class _Source:
    name = "fake"

    def close(self) -> None:
        pass


def _interrupted(mode: str) -> LiveState:
    """`_watch` whose sampler thread sends the main thread a Ctrl-C before any sample."""

    def sample(stop: threading.Event, seconds: float | None) -> None:
        time.sleep(0.3)  # the view is in its loop
        _thread.interrupt_main()
        stop.wait(5)

    loop = TickLoop(_Source(), 0.5, LiveState("fake"))  # type: ignore[arg-type]
    return top_mod._watch(loop, mode, None, "order", "", sample=sample)


def test_ctrl_c_ends_a_plain_view_normally() -> None:
    assert _interrupted("plain").ticks == 0  # returns: the last table, exit 0


def test_ctrl_c_before_once_has_its_two_samples_is_an_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt):
        _interrupted("once")


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--plain", "--interval", "nan"],  # was a traceback from the view's ring size
        ["top", "--once", "--source", "host", "--duration", "inf"],  # was "sampling stopped: OverflowError"
        ["run", "--source", "none", "--scrape-interval", "nan", "--report", "-", "--", "true"],
        ["scrape", "--window", "nan", "http://127.0.0.1:9/metrics"],
    ],
    ids=["demo-interval", "top-duration", "run-scrape-interval", "scrape-window"],
)
def test_every_float_option_refuses_nan_and_inf(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """click.FloatRange lets nan past any bound and inf past a missing maximum; every float option of the
    CLI is a FiniteFloatRange or, for a time, a Duration (90s, 15m or seconds): either is one usage line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "expected a finite number" in err or "expected a duration like 90s" in err
    assert "Traceback" not in err


def test_dash_h_alone_is_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    """With top's options forwarded, `phasescope -h` became "phasescope top: No such option '-h'"; it is
    the group's help (as --help), not one of top's errors."""
    assert main(["-h"]) == 0
    out = capsys.readouterr().out
    assert "Commands:" in out and "Usage: phasescope [OPTIONS] [COMMAND]" in out


def test_a_replay_faster_than_the_sampler_says_what_it_loses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 10 Hz file at speed=10 plays a sample every 0.01 s; the sampler's 0.1 s limit kept one in ten of
    them without a word (`record` wrote a tenth of the file)."""
    monkeypatch.setattr(top_mod, "run_live", lambda source, interval_s, **kw: source.close())
    ten_hz = Path(__file__).resolve().parents[2] / "data/h200/10hz/idle_released.parquet"
    assert main(["top", "--plain", "--no-classify", "--source", f"replay:{ten_hz}?speed=10"]) == 0
    assert "about 10% of its samples are kept" in capsys.readouterr().err
    assert main(["top", "--plain", "--no-classify", "--source", f"replay:{ten_hz}"]) == 0
    assert "samples are kept" not in capsys.readouterr().err  # 10 Hz at 1x: all of them
