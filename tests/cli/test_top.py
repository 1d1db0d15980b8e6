"""`phasescope top --once / --plain` end to end through the real CLI, sources and sampler."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from phasescope.cli import main
from phasescope.live.loop import TickLoop
from phasescope.views.display import MISSING
from tests.live_helpers import TRAINING_RUN

GEMM_ON_GPU1 = "sensorguard-rtx3090/20260825_hpc_gemm_verifier-gpu1_s3_r03/nvml.csv"


def _device_lines(out: str, n_devices: int) -> list[str]:
    return [ln for ln in out.splitlines() if re.search(r"│ #\d ", ln)][-n_devices:]


def test_once_on_a_replayed_training_run(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--interval", "0.1", "--source", spec]) == 0
    out = capsys.readouterr().out
    lines = _device_lines(out, 2)
    assert len(lines) == 2 and lines[0].startswith("│ #0 ") and lines[1].startswith("│ #1 ")
    for line in lines:
        assert f"/ {MISSING}" in line  # no memory total / power limit in this log
        assert re.search(r"│ \d+%\s+│", line)  # utilisation is present
    # A replay shows its speed and the trace's own time (a date, or a log's own clock), not the wall's.
    at = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|t=\d+s)"
    assert re.search(rf"replay 20× · {at} \(trace time\) · 2 device\(s\) · tick 2", out), out[-500:]


@pytest.mark.parametrize("flag", [None, "--no-alarm"])
def test_no_alarm_flag_reaches_the_live_classifier(
    shared_data: Path, flag: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phasescope.live import classify as live_classify

    made: list[live_classify.LiveClassifier] = []

    class Spy(live_classify.LiveClassifier):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr(live_classify, "LiveClassifier", Spy)
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    args = ["top", "--once", "--interval", "0.1", "--source", spec]
    assert main(args + ([flag] if flag else [])) == 0
    capsys.readouterr()
    assert len(made) == 1 and made[0].runs > 0
    on = flag is None
    assert made[0].alarm_enabled is on and (made[0].alarm_runs > 0) is on


@pytest.mark.parametrize(
    "config", ["", "[thresholds]\nmin_confidence = 0.8\nmin_segment_s = 30\nenergy_gap_factor = 7\n"]
)
def test_config_thresholds_reach_the_live_classifier(
    shared_data: Path, config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from phasescope.cli import top as top_module
    from phasescope.live import classify as live_classify

    made: list[live_classify.LiveClassifier] = []
    loops: list[TickLoop] = []

    class SpyLoop(TickLoop):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            loops.append(self)

    monkeypatch.setattr(top_module, "TickLoop", SpyLoop)

    class Spy(live_classify.LiveClassifier):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr(live_classify, "LiveClassifier", Spy)
    cfg = tmp_path / "config.toml"
    cfg.write_text(config)
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--interval", "0.1", "--source", spec, "--config", str(cfg)]) == 0
    capsys.readouterr()
    (lc,) = made
    (loop,) = loops
    if config:  # the verdict's thresholds, passed on to the live decoder
        assert lc.min_confidence == 0.8 and lc.min_segment_s == 30.0
        assert loop.energy.gap_factor == 7.0  # the energy meter's gap rule follows the config too
    else:  # unset: the rules the live path was evaluated with
        assert lc.min_confidence is None and lc.min_segment_s is None
        assert loop.energy.gap_factor == 3.0


def test_plain_ends_when_a_replay_ends(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"replay:{shared_data / GEMM_ON_GPU1}?speed=300"  # 338 recorded seconds in about 1.1 s
    t0 = time.monotonic()
    assert main(["top", "--plain", "--interval", "0.1", "--sort", "util", "--source", spec]) == 0
    assert time.monotonic() - t0 < 20
    out = capsys.readouterr().out
    assert "replay finished" in out
    tables = out.count("Device / process")
    assert tables >= 5  # one table per tick
    busy = [ln for ln in out.splitlines() if "│ #1 " in ln]
    assert any(re.search(r"│ 9\d%|│ 100%", ln) for ln in busy)  # the GEMM really shows up


def test_plain_on_the_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--plain", "--source", "host", "--interval", "0.2", "--duration", "0.7"]) == 0
    out = capsys.readouterr().out
    assert out.count("Device / process") >= 2 and "logical cores" in out
    assert "host · 1 device(s)" in out


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("bogus", "--source: spec: expected auto, nvml, host or replay"),
        ("replay:/nonexistent/run.csv", "/nonexistent/run.csv"),
        ("replay:x.csv?speed=-1", "speed"),
    ],
)
def test_bad_source_is_one_line(spec: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--once", "--source", spec]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]


def test_once_on_gpus_through_nvml(
    fake_nvml: Callable[..., object], shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.live_helpers import training_traces

    fake_nvml(training_traces(shared_data), mem_total_bytes=24 * 2**30)
    assert main(["top", "--once", "--interval", "0.1", "--source", "nvml"]) == 0
    out = capsys.readouterr().out
    lines = _device_lines(out, 2)
    assert len(lines) == 2 and all("/ 24.0 GiB" in ln for ln in lines)
    assert "nvml+host · 2 device(s)" in out


def test_auto_without_nvml_falls_back_to_the_host(fake_nvml: Callable[..., object], shared_data: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import pynvml

    from tests.live_helpers import training_traces

    fake_nvml(training_traces(shared_data), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert main(["top", "--once", "--interval", "0.1"]) == 0
    captured = capsys.readouterr()
    assert "host · 1 device(s)" in captured.out
    notice = [ln for ln in captured.err.splitlines() if "libnvidia-ml" in ln]
    # auto watches the host already: the one line says so, and asks no CPU-only machine to install a driver
    assert len(notice) == 1 and "watching the host" in notice[0] and "install" not in notice[0]


@pytest.mark.parametrize("spec", ["auto", "nvml"])
def test_open_watched_gives_the_host_row_when_asked_on_gpus(
    fake_nvml: Callable[..., object], shared_data: Path, spec: str
) -> None:
    """`demo` (host_row=True, default --source auto) shows the host row, where its CPU workloads appear;
    `auto` used to leave it out on a GPU machine, so they showed as "processes (no device)"."""
    from phasescope.cli.top import open_watched
    from phasescope.sources.host import is_host_device
    from tests.live_helpers import training_traces

    fake_nvml(training_traces(shared_data))
    for host_row in (True, False):
        source = open_watched(spec, lambda line: None, host_row=host_row)
        try:
            hosts = [d for d in source.devices() if is_host_device(d)]
            assert len(source.devices()) == 2 + len(hosts) and len(hosts) == int(host_row)
            assert len(source.read().devices) == len(source.devices())
        finally:
            source.close()


# ---- `top --store`: history from the live store on start, new samples written to it ----

SPAR_A100 = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"


@pytest.fixture
def no_default_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PHASESCOPE_HOME in tmp: the user's own default store never leaks into a test."""
    home = tmp_path / "home"
    monkeypatch.setenv("PHASESCOPE_HOME", str(home))
    return home


def _store_from_the_training_run(shared_data: Path, path: Path, newest_age_s: float = 5.0) -> int:
    """Five minutes of the real training run (GPU 0 trains, GPU 1 idles) in a store; returns samples."""
    from phasescope.store.live import Store
    from tests.live_helpers import training_traces
    from tests.views.test_tui import _training_rows, write_store

    traces = training_traces(shared_data)
    lo, hi = _training_rows(traces)
    write_store(path, traces, lo, hi, time.time() - newest_age_s)
    with Store(path, read_only=True) as store:
        return store.count()


def _spark(line: str) -> str:
    """The utilisation sparkline cell of a device line."""
    from phasescope.views.table import COLUMN_KEYS

    return line.split("│")[1 + COLUMN_KEYS.index("spark_util")]


def test_store_history_shows_in_the_first_table_and_new_samples_are_written(
    shared_data: Path, tmp_path: Path, no_default_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phasescope.store.live import Store

    path = tmp_path / "live.sqlite"
    before = _store_from_the_training_run(shared_data, path)
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--store", str(path),
                 "--source", spec]) == 0
    out, err = capsys.readouterr()
    said = [ln for ln in err.splitlines() if "history" in ln]
    assert len(said) == 1 and f"{before} samples of 2 device(s)" in said[0] and "written to it" in said[0]
    train, idle = _device_lines(out, 2)
    # 30 columns of history (the replay itself starts idle): the training GPU's line is tall, not blank.
    assert len(_spark(train).strip()) >= 28 and "█" in _spark(train) and _spark(train) != _spark(idle)
    with Store(path, read_only=True) as store:
        assert store.count() >= before + 2 * 2  # --once: two live ticks of two devices, written


def test_read_only_store_and_the_default_store_are_never_written(
    shared_data: Path, tmp_path: Path, no_default_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phasescope.store.live import Store, default_store_path

    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    path = tmp_path / "live.sqlite"
    before = _store_from_the_training_run(shared_data, path)
    default = default_store_path()
    default.parent.mkdir(parents=True)
    path.rename(default)
    for extra in (["--store", str(default), "--read-only-store"], []):  # no --store: the default, if there
        assert main(["top", "--once", "--no-classify", "--interval", "0.1", *extra, "--source", spec]) == 0
        out, err = capsys.readouterr()
        said = [ln for ln in err.splitlines() if "history" in ln]
        assert len(said) == 1 and f"{default}: {before} samples" in said[0] and "written" not in said[0]
        assert len(_spark(_device_lines(out, 2)[0]).strip()) >= 28
        with Store(default, read_only=True) as store:
            assert store.count() == before
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--history", "0",
                 "--source", spec]) == 0
    assert "history" not in capsys.readouterr().err  # --history 0: the store is not even opened


def test_a_store_another_process_writes_is_only_read(
    shared_data: Path, tmp_path: Path, no_default_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While serve/record --store hold the store open for writing, top reads its history and writes
    nothing; the entry a killed writer left behind does not count once its process is gone."""
    import os
    import sqlite3
    import subprocess
    import sys

    from phasescope.store.live import Store

    path = tmp_path / "live.sqlite"
    before = _store_from_the_training_run(shared_data, path)
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    args = ["top", "--once", "--no-classify", "--interval", "0.1", "--store", str(path), "--source", spec]
    with Store(path) as agent:  # another writer, as `serve --store` keeps it
        assert main(args) == 0
        err = capsys.readouterr().err
        assert f"process {os.getpid()} is writing it now" in err and "top only reads it" in err
        assert agent.count() == before
    # A writer killed outright: its entry stays, its pid does not.
    code = (f"import os, sys; from phasescope.store.live import Store; s = Store({str(path)!r}); "
            "sys.stdout.write(str(os.getpid())); sys.stdout.flush(); os._exit(0)")
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    with sqlite3.connect(path) as conn:
        (entry,) = conn.execute("SELECT value FROM meta WHERE key='writer'").fetchone()
    assert f'"pid": {dead}' in entry  # left behind...
    with Store(path, read_only=True) as store:
        assert store.active_writer() is None  # ...and ignored
    assert main(args) == 0
    assert "new samples are written to it" in capsys.readouterr().err
    with Store(path, read_only=True) as store:
        assert store.count() >= before + 4


def _not_a_store(path: Path, shared_data: Path) -> None:
    path.write_text("time,gpu_util\n1,2\n")


def _newer_store(path: Path, shared_data: Path) -> None:
    import sqlite3

    _store_from_the_training_run(shared_data, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")


def _damaged_store(path: Path, shared_data: Path) -> None:
    import sqlite3

    _store_from_the_training_run(shared_data, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE blocks SET data = substr(data, 1, 100) WHERE id = 1")


def _other_devices(path: Path, shared_data: Path) -> None:
    """The training run's GPUs plus an A100 from another machine that is not watched now."""
    from phasescope.sources.replay import read
    from tests.views.test_tui import write_store

    _store_from_the_training_run(shared_data, path)
    a100 = read(shared_data / SPAR_A100)
    write_store(path, a100, 0, len(a100[0]), time.time() - 5.0)


@pytest.mark.parametrize(
    ("make", "flags", "says"),
    [
        (None, ["--read-only-store"], "no such store, nothing loaded"),
        (_not_a_store, [], "store: expected a phasescope SQLite store"),
        (_newer_store, [], "meta.schema_version: expected <= 2, got '99'"),
        (_damaged_store, ["--read-only-store"], "got 'a damaged block': nothing loaded"),
        (_other_devices, [], "1 device(s) in it are not watched now, left out: "),
    ],
)
def test_store_problems_are_one_line_and_top_goes_on(
    make: Callable[[Path, Path], None] | None, flags: list[str], says: str, shared_data: Path,
    tmp_path: Path, no_default_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "live.sqlite"
    if make is not None:
        make(path, shared_data)
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--store", str(path), *flags,
                 "--source", spec]) == 0
    out, err = capsys.readouterr()
    said = [ln for ln in err.splitlines() if says in ln]
    assert len(said) == 1 and said[0].startswith("phasescope: history: ") and "Traceback" not in err
    assert len(_device_lines(out, 2)) == 2  # the live table still comes


def test_a_new_store_is_created_and_filled(
    shared_data: Path, tmp_path: Path, no_default_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phasescope.store.live import Store

    path = tmp_path / "new" / "live.sqlite"
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--store", str(path),
                 "--source", spec]) == 0
    assert "a new store, nothing to load yet; new samples are written to it" in capsys.readouterr().err
    with Store(path, read_only=True) as store:
        assert {d.uuid for d in store.devices()} == {
            "GPU-42e33043-7008-2803-9ba8-9bb9ef7d0845", "GPU-bff95c83-0adb-feb7-9825-359f31b26de8"}
        assert store.count() >= 4


def test_a_store_that_cannot_be_created_is_said_and_not_called_new(
    shared_data: Path, tmp_path: Path, no_default_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last line said used to be "a new store, nothing to load yet", which hid (in the full-screen
    status line) that nothing was being stored."""
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "live.sqlite"
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--no-classify", "--interval", "0.1", "--store", str(path),
                 "--source", spec]) == 0
    out, err = capsys.readouterr()
    said = [ln for ln in err.splitlines() if "history:" in ln]
    assert len(said) == 1 and said[0].endswith("new samples are not stored"), said
    assert "a new store" not in out + err


def test_bad_history_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--once", "--history", "a while", "--source", "host"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--history: duration: expected a duration like 90s" in err[0]


def test_the_phase_comes_from_the_history_with_the_real_classifier(
    shared_data: Path, tmp_path: Path, no_default_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay starts idle, but the store says GPU 0 trained until 5 s ago: the badge says training
    from the first table on (the classifier ran over the history before the first sample)."""
    path = tmp_path / "live.sqlite"
    _store_from_the_training_run(shared_data, path)
    # At 1x: at 20x the seconds spent loading the history become minutes of data time before the first
    # tick, a gap whose windows the verdict's rule (and so the live phase) rightly calls unknown.
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=1"
    assert main(["top", "--once", "--interval", "0.1", "--store", str(path), "--source", spec]) == 0
    train, idle = _device_lines(capsys.readouterr().out, 2)
    assert re.search(r"│ +training( \d+%)? +│", train) and re.search(r"│ +idle( \d+%)? +│", idle)


def test_once_in_an_80_column_terminal_keeps_the_phase_readable(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a terminal, rich squeezed all 13 columns into 80: the phase shrank to nothing and each device
    name to "#0 A…". The table now drops columns in reverse priority (sparklines, PCIe, clocks, temperature,
    KPIs, energy; and says so) and wraps what is left, so the device, its phase, memory and power stay
    readable."""
    from phasescope.cli import top as top_module

    monkeypatch.setattr(top_module, "plain_console_width", lambda: 0)  # as on a terminal
    monkeypatch.setenv("COLUMNS", "80")
    spec = f"replay:{shared_data / TRAINING_RUN}?speed=20"
    assert main(["top", "--once", "--interval", "0.1", "--source", spec]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "column(s) hidden: widen the terminal" in out
    assert "Phase" in out and "Notes" in out
    for line in _device_lines(out, 2):  # each device's phase whole (a badge, "–" before the first call)
        assert re.search(r"│ #\d .*│ +(unknown|training|idle|other|inference|–) +│", line), line
