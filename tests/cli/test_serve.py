"""`phasescope serve` as a real process: replayed real trace in, clean /metrics and guarded API out."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from phasescope.serve.server import is_loopback
from tests.serve.conftest import MIGRATION_RUN, promtool_check, serve_process


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "phasescope", "serve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_serves_a_replay_with_token_and_public_metrics(shared_data: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASESCOPE_TOKEN", "t0ken")  # the env var keeps the token off the command line
    src = f"replay:{shared_data / MIGRATION_RUN}?speed=10"
    with serve_process(["--source", src, "--usd-per-kwh", "0.2"], tmp_path) as url:
        deadline = time.monotonic() + 30
        while True:
            status, body = _get(url + "metrics")
            assert status == 200  # /metrics is public unless --metrics-token
            up = b'phasescope_source_up{source="replay"} 1.0' in body
            if up and b"phasescope_gpu_phase_probability{" in body:
                break
            assert time.monotonic() < deadline, body.decode()[-2000:]
            time.sleep(0.3)
        assert promtool_check(body) == ""
        assert b"phasescope_gpu_training_alarm{" in body  # the alarm is on by default
        assert _get(url + "api/state")[0] == 401
        status, state = _get(url + "api/state", token="t0ken")
        assert status == 200 and b'"source":"replay"' in state


@pytest.mark.slow
def test_metrics_token_flag_guards_metrics_too(shared_data: Path, tmp_path: Path) -> None:
    src = f"replay:{shared_data / MIGRATION_RUN}?speed=10"
    with serve_process(["--source", src, "--token", "abc", "--metrics-token"], tmp_path) as url:
        assert _get(url + "metrics")[0] == 401
        assert _get(url + "metrics", token="abc")[0] == 200


def test_a_taken_port_is_one_clear_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        done = _run("--port", str(port), "--source", "host")
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bad_source_and_missing_replay_file_are_one_clear_line(tmp_path: Path) -> None:
    for spec in ("bogus", f"replay:{tmp_path / 'nope.csv'}"):
        done = _run("--port", "0", "--source", spec)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert done.stderr.startswith("phasescope: ") and len(lines) == 1, done.stderr


def test_loopback_detection() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "::1", "localhost", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "10.0.0.1", "example.org", "::"]))


def test_help_has_an_example() -> None:
    done = _run("--help")
    assert done.returncode == 0 and "phasescope serve --source" in done.stdout
    assert "--metrics-token / --metrics-public" in done.stdout
    assert "--alarm / --no-alarm" in done.stdout


@pytest.mark.slow
def test_no_alarm_flag_turns_the_training_alarm_off(shared_data: Path, tmp_path: Path) -> None:
    import json

    # Both GPUs of this run are labelled training from ~80 s in (labels.csv); speed 10 gets there in ~8 s.
    src = f"replay:{shared_data / MIGRATION_RUN}?speed=10"
    with serve_process(["--source", src, "--no-alarm"], tmp_path) as url:
        deadline = time.monotonic() + 40
        while True:
            state = json.loads(_get(url + "api/state")[1])
            phases = [d["phase"] for d in state["devices"]]
            if phases and all(p is not None and p["phase"] == "training" for p in phases):
                break
            assert time.monotonic() < deadline, phases
            time.sleep(0.3)
        assert all(p["training_alarm"] is False and p["alarm_at"] is None for p in phases)
        status, body = _get(url + "metrics")
        assert status == 200 and b"phasescope_gpu_phase_probability{" in body
        assert b"phasescope_gpu_training_alarm" not in body


@pytest.mark.slow
def test_config_min_confidence_turns_low_readings_unknown_with_the_reason(
    shared_data: Path, tmp_path: Path
) -> None:
    import json

    cfg = tmp_path / "config.toml"
    cfg.write_text("[thresholds]\nmin_confidence = 1.0\n")  # no reading is that sure: all say why
    src = f"replay:{shared_data / MIGRATION_RUN}?speed=10"
    with serve_process(["--source", src, "--no-alarm", "--config", str(cfg)], tmp_path) as url:
        deadline = time.monotonic() + 40
        while True:
            state = json.loads(_get(url + "api/state")[1])
            phases = [d["phase"] for d in state["devices"]]
            if phases and all(p is not None and p["unknown_reason"] for p in phases):
                break
            assert time.monotonic() < deadline, phases
            time.sleep(0.3)
        for p in phases:
            assert p["phase"] == "unknown" and p["confidence"] is None
            assert p["unknown_reason"].endswith("< min_confidence 1"), p


@pytest.mark.slow
def test_store_history_is_served_from_the_start(shared_data: Path, tmp_path: Path) -> None:
    """`serve --store` over a store holding five minutes of a real training run: the history and its phase
    are on the API at once, ahead of the replay's own samples, and new samples go into the same store."""
    import json

    from phasescope.store.live import Store
    from tests.cli.test_top import _store_from_the_training_run
    from tests.live_helpers import TRAINING_RUN, training_traces
    from tests.views.test_tui import HISTORY_ROWS

    path = tmp_path / "live.sqlite"
    before = _store_from_the_training_run(shared_data, path)
    newest = time.time() - 5.0
    src = f"replay:{shared_data / TRAINING_RUN}?speed=10"
    with serve_process(["--source", src, "--store", str(path)], tmp_path) as url:
        status, body = _get(url + "api/history")
        assert status == 200
        history = json.loads(body)
        status, body = _get(url + "api/state")
        state = json.loads(body)
        train = training_traces(shared_data)[0].device.uuid
        assert len(history[train]["t"]) >= HISTORY_ROWS and history[train]["t"][0] < newest - 290
        assert {d["uuid"]: d["phase"]["phase"] for d in state["devices"]}[train] == "training"
        time.sleep(1.0)
    log = (tmp_path / "serve.log").read_text()
    assert f"phasescope: history: {path}: {HISTORY_ROWS * 2} samples of 2 device(s)" in log
    with Store(path, read_only=True) as store:
        assert store.count() > before


def test_a_store_another_process_writes_is_one_clear_line(tmp_path: Path) -> None:
    """`serve --store` on a store `top`/`record`/`serve --store` writes now is refused, naming the writer:
    two writers would interleave one device's samples."""
    import os

    from phasescope.store.live import Store

    path = tmp_path / "live.sqlite"
    with Store(path):  # this test process is the live writer
        done = _run("--port", "0", "--source", "host", "--store", str(path))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"live.sqlite: process {os.getpid()} on " in done.stderr
    assert "is writing this store now" in done.stderr and "use a different --store path" in done.stderr


def test_a_store_that_cannot_be_created_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "live.sqlite"  # its directory cannot be made: a file is in the way
    done = _run("--port", "0", "--source", "host", "--store", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}: --store: expected a store file that can be created" in lines[0]


def test_metrics_token_without_a_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--metrics-token` with no token set served /metrics public (nothing to check it against), silently:
    the opposite of what was asked. It is one clear line instead, before anything starts."""
    monkeypatch.delenv("PHASESCOPE_TOKEN", raising=False)
    done = _run("--port", "0", "--source", "host", "--metrics-token")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("phasescope: --metrics-token: ") and "--token" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("token", ["", "  "])
def test_an_empty_token_is_refused_not_an_open_server(monkeypatch: pytest.MonkeyPatch, token: str) -> None:
    """`--token ""` (or an empty $PHASESCOPE_TOKEN) silently served every route without a check."""
    monkeypatch.delenv("PHASESCOPE_TOKEN", raising=False)
    done = _run("--port", "0", "--source", "host", "--token", token)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("phasescope: --token: ") and "non-empty" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_pricing_note_names_per_model_prices_rather_than_none() -> None:
    """Prices set only per GPU model in the config file ([prices.gpu."A100"]): the page said "No prices set"
    under a table whose rows those prices cost."""
    from phasescope.cli.serve import pricing_note

    note = pricing_note(None, None, ["H100", "A100"])
    assert "No prices set" not in note and "A100, H100" in note
    assert pricing_note(None, None).startswith("No prices set")
    assert pricing_note(2.5, None, ["A100"]).startswith("Priced at $2.5 per GPU-hour")
