"""`phasescope run` on real PyTorch workloads (CPU): exact phases, counts, KPIs and lint warnings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.instrument import runner
from tests.instrument.runner import SCRIPTS, phasescope_run


@pytest.fixture(scope="session")
def run_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return runner.run_env(tmp_path_factory.mktemp("cache"))


def _one_process(doc: dict[str, Any]) -> dict[str, Any]:
    assert len(doc["processes"]) == 1, doc.get("notes")
    proc: dict[str, Any] = doc["processes"][0]
    return proc


def _codes(doc: dict[str, Any]) -> set[str]:
    return {w["code"] for w in doc["warnings"]}


def test_mlp_training_counts_exact_steps(tmp_path: Path, run_env: dict[str, str]) -> None:
    proc, doc = phasescope_run(tmp_path, run_env, "mlp_train.py", "12")
    assert proc.returncode == 0, proc.stderr
    p = _one_process(doc)
    assert [s["phase"] for s in doc["segments"]] == ["training"]
    assert doc["steps"] == 12 and doc["requests"] == 0
    t = p["training"]
    assert t["steps"] == 12 and t["backward_passes"] == 12 and t["trained_forwards"] == 12
    assert t["samples"] == 12 * 32
    assert t["tokens_per_s"] is None  # float features, not token IDs
    assert 0 < t["step_time_p50_s"] <= t["step_time_p95_s"]
    assert t["flops_per_step"] > 0 and t["mfu"] is not None and 0 < t["mfu"] < 1
    assert 0 <= t["data_stall_fraction"] < 1
    # SGD with momentum: parameters + gradients + one momentum buffer = 3x the model.
    assert t["memory_multiple"] == pytest.approx(3.0)
    assert p["device"].startswith("host:")
    assert doc["warnings"] == []
    assert "12 steps" in proc.stdout  # the program's own output is untouched
    html = (tmp_path / "report.html").read_text()
    assert "<html>" in html and "training" in html


def test_tiny_lm_adamw_reports_tokens(tmp_path: Path, run_env: dict[str, str]) -> None:
    proc, doc = phasescope_run(tmp_path, run_env, "lm_train.py", "8")
    assert proc.returncode == 0, proc.stderr
    t = _one_process(doc)["training"]
    assert t["steps"] == 8
    assert t["tokens"] == 8 * 4 * 16  # batch 4, 16 input tokens per row
    assert t["tokens_per_s"] > 0
    assert t["optimizers"] == [{"name": "AdamW", "steps": 8}]
    assert t["memory_multiple"] == pytest.approx(4.0, rel=1e-3)  # params, grads, exp_avg, exp_avg_sq
    assert _codes(doc) == set()


def test_batch_inference_counts_requests(tmp_path: Path, run_env: dict[str, str]) -> None:
    proc, doc = phasescope_run(tmp_path, run_env, "batch_infer.py", "20")
    assert proc.returncode == 0, proc.stderr
    p = _one_process(doc)
    assert [s["phase"] for s in p["segments"]] == ["inference"]
    assert p["training"] is None
    i = p["inference"]
    assert i["requests"] == 20 and i["forwards"] == 20
    assert i["batch_size_mean"] == 16
    assert 0 < i["latency_p50_s"] <= i["latency_p95_s"] <= i["latency_p99_s"]
    assert doc["steps"] == 0 and _codes(doc) == set()


def test_poisson_server(tmp_path: Path, run_env: dict[str, str]) -> None:
    # The device is watched too (host source here, at 5 Hz): same identity as the hooks.
    proc, doc = phasescope_run(tmp_path, run_env, "poisson_server.py", "30", "100", source="host",
                               extra=("--interval", "0.2"))
    assert proc.returncode == 0, proc.stderr
    devices = doc["telemetry"]["devices"]
    assert devices and devices[0]["uuid"] == _one_process(doc)["device"]
    assert devices[0]["samples"] >= 1
    i = _one_process(doc)["inference"]
    assert i["requests"] == 30 and i["batch_size_mean"] == 1
    # 30 arrivals at 100/s take about 0.3 s; the rate seen is the arrival rate, not the model's speed.
    assert 30 < i["requests_per_s"] < 300
    assert _codes(doc) == set()


def test_train_then_evaluate_gives_two_segments_in_order(tmp_path: Path, run_env: dict[str, str]) -> None:
    proc, doc = phasescope_run(tmp_path, run_env, "train_then_eval.py", "10", "6")
    assert proc.returncode == 0, proc.stderr
    segs = doc["segments"]
    assert [s["phase"] for s in segs] == ["training", "inference"]
    assert segs[0]["steps"] == 10 and segs[1]["forwards"] == 6
    assert segs[0]["end"] <= segs[1]["start"]
    assert doc["steps"] == 10 and doc["requests"] == 6
    assert _codes(doc) == set()


def test_generation_loop_kpis(tmp_path: Path, run_env: dict[str, str]) -> None:
    proc, doc = phasescope_run(tmp_path, run_env, "generate_loop.py", "3", "6")
    assert proc.returncode == 0, proc.stderr
    i = _one_process(doc)["inference"]
    assert i["forwards"] == 18
    assert i["requests"] == 3  # one request per generate loop, not per forward
    g = i["generation"]
    assert g["loops"] == 3 and g["tokens"] == 3 * 6 * 2
    assert g["ttft_p50_s"] > 0 and g["inter_token_latency_p50_s"] > 0 and g["tokens_per_s"] > 0


@pytest.mark.parametrize(("script", "code"), [
    ("lint_train_mode_serving.py", "train_mode_inference"),
    ("lint_autograd_inference.py", "autograd_inference"),
    ("lint_eval_mode_training.py", "eval_mode_training"),
])
def test_lint_raised_only_when_the_bug_is_present(tmp_path: Path, run_env: dict[str, str], script: str,
                                                 code: str) -> None:
    proc, bug = phasescope_run(tmp_path, run_env, script, "bug")
    assert proc.returncode == 0, proc.stderr
    assert _codes(bug) == {code}
    (warning,) = bug["warnings"]
    assert "\n" not in warning["message"] and warning["count"] > 0
    assert ("torch.inference_mode()" if code == "autograd_inference" else "call model.") in warning["message"]
    assert warning["message"][:40] in proc.stderr  # printed in the summary too
    if code == "autograd_inference":
        # The first Linear's output (256 x 128 float32) is saved for ReLU's backward: >= 128 KiB per forward.
        assert warning["wasted_bytes_per_forward"] >= 256 * 128 * 4
        # In KiB under a MiB, as the bytes say: "0.0 MiB" was printed for 26 KiB.
        kib = round(warning["wasted_bytes_per_forward"] / 1024)
        assert f"{kib} KiB of activations" in warning["message"]
    proc, clean = phasescope_run(tmp_path, run_env, script, "clean")
    assert proc.returncode == 0, proc.stderr
    assert clean["warnings"] == []


@pytest.mark.parametrize("code", [3])
def test_exit_code_is_the_commands(tmp_path: Path, run_env: dict[str, str], code: int) -> None:
    proc, doc = phasescope_run(tmp_path, run_env, "exit_code.py", str(code))
    assert proc.returncode == code
    assert doc["exit_code"] == code and doc["forwards"] == 1


def test_missing_command_is_one_line(tmp_path: Path, run_env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none", "--report", "-", "--",
           str(tmp_path / "no-such-program")]
    proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 127
    assert proc.stderr.strip().count("\n") == 0 and "command not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_non_torch_command_runs_and_says_so(tmp_path: Path, run_env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none", "--report", "-", "--",
           sys.executable, "-c", "import sys; print('hi'); sys.exit(5)"]
    proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5 and proc.stdout == "hi\n"
    assert "no PyTorch forward" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded(tmp_path: Path, run_env: dict[str, str], sig: signal.Signals) -> None:
    marker = tmp_path / "got"
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none", "--report", "-", "--json", str(out),
           "--", sys.executable, str(SCRIPTS / "wait_for_signal.py"), str(marker)]
    # stdin is not a terminal here, so the forwarder does not assume the terminal already sent SIGINT.
    proc = subprocess.Popen(cmd, env=run_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ready = Path(str(marker) + ".ready")
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1]
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert marker.read_text() == sig.name
    assert proc.returncode == 42, err
    assert out.exists()  # the summary is still written after the signal


def test_an_unwritable_output_is_refused_before_the_command_runs(
    tmp_path: Path, run_env: dict[str, str]
) -> None:
    marker = tmp_path / "ran"
    for option in ("--json", "--report", "--events"):
        out = tmp_path / "no-such-dir" / "nested" / "out"
        cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none", "--report", "-", option,
               str(tmp_path / "a-file" / "out") if option == "--events" else str(out),
               "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
        (tmp_path / "a-file").write_text("")
        proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and option in lines[0] and "expected" in lines[0], proc.stderr
        assert not marker.exists()  # nothing ran


def test_an_output_that_fails_at_the_end_keeps_the_other_and_the_exit_code(
    tmp_path: Path, run_env: dict[str, str]
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    report = tmp_path / "report.html"
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none", "--quiet", "--json",
           str(gone / "out.json"), "--report", str(report), "--",
           sys.executable, "-c", f"import shutil, sys; shutil.rmtree({str(gone)!r}); sys.exit(5)"]
    proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if "--json" in ln and "expected a writable" in ln]
    assert "<html>" in report.read_text()


@pytest.mark.parametrize(
    "option",
    [["--interval", "0.05"], ["--scrape-interval", "0"], ["--scrape-interval", "inf"], ["--idle-gap", "0"]],
)
def test_bad_numbers_are_refused_before_the_command_runs(
    tmp_path: Path, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--scrape-interval 0 used to scrape in a tight loop; --interval 0.05 only said so after the run."""
    from phasescope.cli import main

    marker = tmp_path / "ran"
    args = ["run", "--source", "none", "--report", "-", *option, "--", sys.executable, "-c",
            f"open({str(marker)!r}, 'w')"]
    assert main(args) == 2
    assert option[0] in capsys.readouterr().err and not marker.exists()


@pytest.mark.parametrize("spec", ["nvmll", "replay:/no/such/recording.parquet", "replay:x.csv?speed=0"])
def test_a_malformed_source_is_refused_before_the_command_runs(
    tmp_path: Path, spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --source used to become a note after the run, with no telemetry recorded at all."""
    from phasescope.cli import main

    marker = tmp_path / "ran"
    args = ["run", "--source", spec, "--report", "-", "--", sys.executable, "-c",
            f"open({str(marker)!r}, 'w')"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--source" in err and len(err.strip().splitlines()) == 1 and not marker.exists()


def test_a_gpu_lost_during_the_run_is_said_in_the_summary(fake_nvml: Any, shared_data: Path) -> None:
    """NVML's "GPU lost" event used to be dropped: the summary showed the GPU's few samples as if whole."""
    from phasescope.cli.run import DeviceWatch
    from tests.live_helpers import training_traces

    fake = fake_nvml(training_traces(shared_data))
    fake.lose(1, from_tick=3)
    watch = DeviceWatch("nvml", 0.1)
    watch.start()
    deadline = time.monotonic() + 30
    while fake.calls["nvmlDeviceGetUtilizationRates"] < 12 and time.monotonic() < deadline:
        fake.advance()
        time.sleep(0.1)
    telemetry = watch.finish()
    assert len(telemetry["devices"]) == 2
    lost = [n for n in watch.notes if "GPU lost" in n]
    assert len(lost) == 1 and lost[0].startswith("device: GPU lost: #1 "), watch.notes


def test_a_kept_events_directory_summarises_only_this_run(tmp_path: Path, run_env: dict[str, str]) -> None:
    """Run twice with the same --events DIR: the second summary used to count the first run's steps too."""
    events = tmp_path / "events"
    docs = []
    for _ in range(2):
        proc, doc = phasescope_run(tmp_path, run_env, "mlp_train.py", "5", extra=("--events", str(events)))
        assert proc.returncode == 0, proc.stderr
        docs.append(doc)
    assert [d["steps"] for d in docs] == [5, 5]
    assert len(docs[1]["processes"]) == 1 and len(list(events.glob("meta-*.json"))) == 2
    assert any("1 process(es) of an earlier run" in n for n in docs[1]["notes"])


def test_default_reports_are_unique_and_in_their_folder(tmp_path: Path, run_env: dict[str, str]) -> None:
    """Two runs started in the same second wrote one `phasescope-run-<second>.html` in the current folder;
    each now writes its own file (time and PID) under phasescope-runs/ (or --report-dir), and says where."""
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none", "--",
           sys.executable, "-c", "pass"]
    procs = [subprocess.Popen(cmd, env=run_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    reports = sorted((tmp_path / "phasescope-runs").glob("phasescope-run-*.html"))
    assert len(reports) == 2 and not list(tmp_path.glob("*.html"))
    assert all(any(f"report: phasescope-runs/{r.name}" in e for e in errs) for r in reports)
    own = tmp_path / "mine"
    proc = subprocess.run([*cmd[:4], "--source", "none", "--report-dir", str(own), "--", *cmd[7:]],
                          env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(list(own.glob("phasescope-run-*.html"))) == 1


def test_the_config_names_the_reports_folder(tmp_path: Path, run_env: dict[str, str]) -> None:
    """`[run] report_dir` in the config file; `--report-dir` still wins."""
    conf = tmp_path / "config.toml"
    conf.write_text('[run]\nreport_dir = "from-config"\n')
    env = dict(run_env, PHASESCOPE_CONFIG=str(conf))
    cmd = [sys.executable, "-m", "phasescope", "run", "--source", "none"]
    for extra, folder in (([], "from-config"), (["--report-dir", "from-flag"], "from-flag")):
        proc = subprocess.run([*cmd, *extra, "--", sys.executable, "-c", "pass"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        (report,) = (tmp_path / folder).glob("phasescope-run-*.html")
        assert f"report: {folder}/{report.name}" in proc.stderr
