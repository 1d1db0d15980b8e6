"""`phasescope demo` for real: two PyTorch child processes, watched by the host source, and none left over;
the dashboard it serves from the same samples as its table."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from phasescope.cli import main
from phasescope.views.table import COLUMN_KEYS

REPO = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"demo: started training pid (\d+), inference pid (\d+)")
DASHBOARD = re.compile(r"demo: dashboard at (http://127\.0\.0\.1:\d+/)")


@functools.cache
def _empty_config() -> Path:
    """A config file that sets nothing, so the demo's prices are its labelled example, whatever this
    machine's own config file says."""
    root = Path(tempfile.mkdtemp(prefix="phasescope-demo-config-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    (root / "config.toml").write_text("")
    return root / "config.toml"


def _start_demo(duration: float, *web: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="340", PHASESCOPE_CONFIG=str(_empty_config()))
    return subprocess.Popen(
        [sys.executable, "-m", "phasescope", "demo", "--plain", "--source", "host",
         "--duration", str(duration), "--interval", "0.5", *(web or ("--no-web",))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
        errors="replace",  # a signal may cut a table mid-character
    )


def _child_pids(demo: subprocess.Popen[str]) -> tuple[int, int]:
    assert demo.stdout is not None
    line = demo.stdout.readline()
    match = STARTED.search(line)
    assert match, f"no start line, got {line!r}"
    return int(match.group(1)), int(match.group(2))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: tuple[int, ...], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_demo_runs_two_real_workloads_and_leaves_none(tmp_path: Path) -> None:
    demo = _start_demo(duration=8)
    try:
        train, infer = _child_pids(demo)
        for pid, kind in ((train, "train"), (infer, "infer")):
            proc = psutil.Process(pid)
            assert proc.ppid() == demo.pid
            assert proc.cmdline()[1:4] == ["-m", "phasescope.demo.workloads", kind]
            assert os.getpgid(pid) == pid  # its own process group: a terminal's Ctrl-C goes to the demo only
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, err
    # The host source saw both as torch processes, labelled with their role, with real CPU readings.
    rows = {pid: [ln for ln in out.splitlines() if f"└ {pid} " in ln] for pid in (train, infer)}
    assert rows[train] and rows[infer], out[-3000:]
    assert "demo training" in rows[train][-1] and "torch" in rows[train][-1]
    assert "demo inference" in rows[infer][-1]
    cpu = re.search(r"cpu (\d+)%", rows[train][-1])
    assert cpu and int(cpu.group(1)) > 20, rows[train][-1]  # an endless training loop keeps a core busy
    assert f"demo: stopped {train}, {infer}" in out
    assert _wait_gone((train, infer), 0.5) == []
    # The host row never shows the GPU classifier's verdict on CPU load: only the hooks' phases, or "–".
    host_rows = [ln for ln in out.splitlines() if ln.startswith("│ ") and "└" not in ln]
    assert host_rows, out[-3000:]
    for ln in host_rows:
        phase, energy = _cell(ln, 1), _cell(ln, COLUMN_KEYS.index("energy"))
        assert phase == "–" or "(hooks" in phase, ln
        assert "%" not in phase, ln  # no classifier confidence
        assert energy.startswith("– kWh · $"), ln  # no power sensor: device time at the demo price
    assert "demo prices: $2.50/device-hour" in out
    # A workload row with its hook KPIs also has the phase its hooks report, marked as such.
    for pid, kpi, phase in ((train, "samp/s", "training (hooks)"), (infer, "req/s", "inference (hooks)")):
        reported = [ln for ln in rows[pid] if kpi in _cell(ln, COLUMN_KEYS.index("kpi"))]
        assert all(_cell(ln, 1) == phase for ln in reported), reported[-1:]


def _cell(line: str, column: int) -> str:
    """One cell of a plain-table row (columns as in views/table.py COLUMNS)."""
    return line.split("│")[column + 1].strip()


def test_sigterm_to_the_demo_stops_its_children() -> None:
    demo = _start_demo(duration=60)
    try:
        pids = _child_pids(demo)
        time.sleep(1.0)
        demo.send_signal(signal.SIGTERM)
        demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode != 0  # it was ended, not finished
    assert _wait_gone(pids, 1.0) == []


def test_ctrl_c_ends_the_demo_as_q_does() -> None:
    """README: "q or Ctrl-C to end it". A SIGINT used to end in "phasescope: aborted", exit 130, and no
    "demo: stopped" line; now it is a normal end: the workloads stopped, the stop line, exit 0."""
    demo = _start_demo(duration=60)
    try:
        pids = _child_pids(demo)
        time.sleep(2.0)  # a few tables in: the sampler and the view are running
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, err
    assert "aborted" not in err and "Traceback" not in err, err
    assert f"demo: stopped {pids[0]}, {pids[1]}" in out
    assert _wait_gone(pids, 1.0) == []


def test_children_exit_on_their_own_when_the_demo_is_killed() -> None:
    """kill -9 skips every finally and atexit: the workloads notice their parent is gone."""
    demo = _start_demo(duration=60)
    pids: tuple[int, ...] = ()
    try:
        pids = _child_pids(demo)
        demo.kill()
        demo.communicate(timeout=10)
        left = _wait_gone(pids, 20.0)  # they check after each step/request (torch may still be importing)
    finally:
        for pid in pids:  # never leave a stray workload behind, even if the assertion below fails
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
    assert left == []


def test_demo_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["demo", "--plain", "--duration", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install torch==2.13.0" in err[0]


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _stream_events(url: str, n: int) -> list[dict[str, Any]]:
    """The first `n` updates of the page's live stream (Server-Sent Events)."""
    out: list[dict[str, Any]] = []
    with urllib.request.urlopen(url, timeout=20) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for raw in r:
            line = raw.decode()
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if len(out) == n:
                    break
    return out


@contextmanager
def _demo_with_dashboard() -> Iterator[tuple[subprocess.Popen[str], tuple[int, int], str]]:
    """A running demo with its dashboard on a free port: (process, workload pids, URL); none left after."""
    demo = _start_demo(90, "--port", "0")
    pids: tuple[int, int] | tuple[()] = ()
    try:
        pids = _child_pids(demo)
        assert demo.stdout is not None
        line = demo.stdout.readline()
        match = DASHBOARD.search(line)
        assert match, f"no dashboard line, got {line!r}"
        yield demo, pids, match.group(1)
    finally:
        if demo.poll() is None:  # SIGTERM first: the demo's own cleanup (workloads, temp dirs) runs
            demo.send_signal(signal.SIGTERM)
            try:
                demo.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.communicate(timeout=30)
        for pid in pids:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)


def _wait_for_both_kpis(url: str, pids: tuple[int, int], timeout: float = 40) -> dict[str, Any]:
    """/api/state once both workloads' hook KPIs are in it (torch takes seconds to import on a busy box)."""
    deadline = time.monotonic() + timeout
    while True:
        state: dict[str, Any] = _get_json(url + "api/state")
        procs = state["devices"][0].get("process_kpis", []) if state["devices"] else []
        if {p["pid"] for p in procs} == set(pids) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


@pytest.mark.slow
def test_demo_serves_the_dashboard_from_the_same_samples() -> None:
    with _demo_with_dashboard() as (demo, pids, url):
        roles = {pids[0]: "demo training", pids[1]: "demo inference"}
        # Live while the demo runs: the phase, both workloads' hook KPIs, energy and cost per phase.
        state = _wait_for_both_kpis(url, pids)
        dev = state["devices"][0]
        by_pid = {p["pid"]: p for p in dev["process_kpis"]}
        assert state["source"] == "host" and state["up"] is True
        assert set(by_pid) == set(roles), dev
        assert {p: by_pid[p]["label"] for p in by_pid} == roles
        assert by_pid[pids[0]]["kpis"]["samples_per_s"] > 0 and by_pid[pids[0]]["kpis"]["step_time_p50_s"] > 0
        assert by_pid[pids[1]]["kpis"]["requests_per_s"] > 0 and by_pid[pids[1]]["kpis"]["latency_p99_s"] > 0
        assert dev["kpis"]  # the device's phase KPIs, from the same hooks
        # The host's phase is what its workloads' hooks report, not the classifier's read of CPU load.
        assert dev["phase"]["source"] == "hooks" and dev["phase"]["confidence"] is None, dev["phase"]
        assert set(dev["phase"]["phase"].split("+")) <= {"training", "inference"}
        assert {p: by_pid[p]["phase"] for p in by_pid} == {pids[0]: "training", pids[1]: "inference"}
        assert "other" not in dev["energy"]["phases"]
        assert "demo prices: $2.50/device-hour" in state["status"]
        assert dev["processes"] >= 2
        for label, e in dev["energy"]["phases"].items():  # the host has no power reading: time, no joules
            assert e["seconds"] > 0 and set(e["cost"]) >= {"time_usd", "energy_usd", "total_usd"}, label
            # ... so its cost is device time at the demo's example price, and no energy cost (not $0)
            assert e["cost"]["time_usd"] == pytest.approx(e["seconds"] / 3600 * 2.5, rel=1e-3, abs=1e-6)
            assert e["cost"]["energy_usd"] is None
        assert dev["energy"]["method"] == "none" and state["totals"]
        # Pushed as it changes: two stream events, the second a later tick of the same sampler.
        first, second = _stream_events(url + "api/stream", 2)
        assert second["state"]["ticks"] > first["state"]["ticks"] >= state["ticks"]
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        assert "<title>phasescope" in page and "EventSource" in page
        demo.send_signal(signal.SIGTERM)  # seen enough: end it the way a service manager would
        out, err = demo.communicate(timeout=30)
    assert demo.returncode == 128 + signal.SIGTERM, err
    assert _wait_gone(pids, 1.0) == []
    # The table is drawn from the same state as the page: its status line carries the dashboard's note.
    assert f"dashboard: {url}" in out
    assert f"phasescope · dashboard {url}" in out  # and every table's title names it (the app: its header)
    port = int(url.rsplit(":", 1)[1].strip("/"))
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the server stopped with the demo


@pytest.mark.slow
def test_demo_page_in_chromium_shows_phase_kpis_and_energy(tmp_path: Path) -> None:
    from tests.serve.conftest import CHROMIUM, system_tool
    from tests.serve.test_dashboard_browser import sync_playwright_or_skip

    chromium = system_tool(CHROMIUM)
    sync_playwright = sync_playwright_or_skip()
    with _demo_with_dashboard() as (_, pids, url), sync_playwright() as pw:
        _wait_for_both_kpis(url, pids)
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            response = page.goto(url)
            assert response is not None and response.status == 200
            page.wait_for_function("() => document.body.dataset.transport === 'sse'", timeout=20_000)
            kpis = '[data-testid="phase-kpis"]'
            page.wait_for_function(
                f"() => /samples\\/s/.test(document.querySelector('{kpis}')?.textContent || '')"
                f" && /req\\/s/.test(document.querySelector('{kpis}')?.textContent || '')", timeout=30_000)
            text = page.locator(kpis).inner_text()
            assert f"demo training {pids[0]}" in text and f"demo inference {pids[1]}" in text
            page.wait_for_function("() => document.querySelector('section.device .conf')?.textContent"
                                   " === 'from hooks (exact)'", timeout=20_000)
            badge = page.locator('[data-testid="phase-badge"]').text_content() or ""
            assert set(badge.split("+")) <= {"training", "inference"}, badge  # the hooks' phase(s)
            assert page.locator("section.device .energy tbody tr").count() >= 1  # time per phase so far
            energy_table = page.locator("section.device .energy").inner_text()
            assert "– kWh" in energy_table and "$" in energy_table, energy_table
            assert "demo prices" in page.locator("#pricing").inner_text()
            assert page.locator("#totals tbody tr").count() >= 1
            start = int(page.evaluate("() => document.body.dataset.updates"))
            page.wait_for_function(f"() => Number(document.body.dataset.updates) > {start}", timeout=10_000)
            assert not errors, errors
            page.screenshot(path=str(tmp_path / "demo.png"), full_page=True)
            if os.environ.get("PHASESCOPE_DEMO_SHOT"):  # to look at it: a path to copy the picture to
                shutil.copyfile(tmp_path / "demo.png", os.environ["PHASESCOPE_DEMO_SHOT"])
        finally:
            browser.close()


def test_demo_port_taken_is_one_clear_error() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "phasescope", "demo", "--plain", "--source", "host", "--duration", "1",
             "--port", str(port)], capture_output=True, text=True, cwd=REPO, timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"phasescope: cannot listen on 127.0.0.1:{port}")
    assert "demo: started" not in done.stdout  # nothing started: the port is checked first
