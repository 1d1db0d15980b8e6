"""`phasescope verify` on real recordings, the live store and a live (replayed) source."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from phasescope.cli import main
from phasescope.schema import SIGNAL_NAMES, TickBatch
from phasescope.store.live import Store
from tests.verify._data import DUTY_SHAPING, INFERENCE_CONTROL, labelled

DUTY_FILE = DUTY_SHAPING[0]
CONTROL_FILE = INFERENCE_CONTROL[0]


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASESCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict], str]:
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(x) for x in out.splitlines() if x.startswith("{")], err


def test_disguised_training_fails_no_training(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, objs, err = run(
        ["--declare", "no-training", "--json", "--input", str(shared_data / DUTY_FILE)], capsys
    )
    assert code == 1
    assert err.strip().splitlines() == [
        "phasescope: 'no-training' is inconsistent with the telemetry in 1 of 1 device-windows"
    ]
    v, summary = objs
    assert v["verdict"] == "inconsistent" and v["model_version"] and v["coverage"]["samples"] > 100
    assert summary["summary"] == {"consistent": 0, "inconsistent": 1, "unverifiable": 0}


def test_inference_control_passes_inference(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The file holds the run's marker bursts too: the labelled span is cut out through the live store test;
    # here --devices picks the GPU under test and the verdict covers the whole file, markers included.
    code, objs, _ = run(
        ["--declare", "no-training", "--json", "--input", str(shared_data / CONTROL_FILE), "--window", "600"],
        capsys,
    )
    assert objs[-1]["summary"]["inconsistent"] == 0 and code == 0


def test_human_table(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["verify", "--declare", "no-training", "--input", str(shared_data / DUTY_FILE), "--window", "120"]
    )
    out, _ = capsys.readouterr()
    assert code == 1
    assert "inconsistent" in out and "training for" in out and "not authenticated" in out


def test_bundle_then_audit(
    shared_data: Path, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = tmp_path / "evidence.jsonl"
    code, _, _ = run(
        ["--declare", "inference", "--json", "--input", str(shared_data / DUTY_FILE), "--bundle", str(b)],
        capsys,
    )
    assert code == 1 and b.exists()
    assert (home / "keys" / "default.key").stat().st_mode & 0o777 == 0o600
    assert main(["audit", str(b), "--pubkey", str(home / "keys" / "default.pub")]) == 0
    out, _ = capsys.readouterr()
    assert "audit OK" in out and "re-run with model" in out
    assert (
        main(
            ["verify", "--declare", "inference", "--input", str(shared_data / DUTY_FILE), "--bundle", str(b)]
        )
        == 2
    )  # never overwrites a bundle
    assert "exists" in capsys.readouterr().err


def test_live_store_window(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = labelled(shared_data, DUTY_SHAPING)
    now = time.time()
    shift = now - 10 - float(t.time[-1])
    with Store(tmp_path / "live.sqlite") as st:
        for i in range(len(t)):
            vals = np.array([[t[s][i] for s in SIGNAL_NAMES]])
            st.ingest(TickBatch(float(t.time[i]) + shift, [t.device], vals))
    code, objs, _ = run(
        ["--declare", "no-training", "--json", "--store", str(tmp_path / "live.sqlite"), "--since", "10m"],
        capsys,
    )
    assert code == 1 and objs[0]["verdict"] == "inconsistent"
    assert objs[0]["coverage"]["samples"] == len(t)
    code, objs, err = run(
        [
            "--declare",
            "no-training",
            "--json",
            "--store",
            str(tmp_path / "live.sqlite"),
            "--since",
            "10m",
            "--until",
            "5m",
        ],
        capsys,
    )
    assert code == 2 and "at least one device with samples" in err


def test_live_source_with_bundle(
    shared_data: Path, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = tmp_path / "live.jsonl"
    src = f"replay:{shared_data / DUTY_FILE}?speed=40"
    code, objs, err = run(
        [
            "--declare",
            "no-training",
            "--json",
            "--source",
            src,
            "--duration",
            "1.5",
            "--interval",
            "0.1",
            "--bundle",
            str(b),
        ],
        capsys,
    )
    assert code in (0, 1), err
    assert objs[-1]["bundle"] == str(b) and objs[0]["coverage"]["samples"] >= 8
    assert main(["audit", str(b), "--pubkey", str(home / "keys" / "default.pub")]) == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--declare", "serving", "--input", "x"], "--declare: claim: expected inference, idle"),
        (["--declare", "idle"], "exactly one of --input, --since/--until or --source"),
        (["--declare", "idle", "--source", "host"], "--duration: expected seconds"),
        (["--declare", "idle", "--since", "yesterday-ish"], "--since: time: expected Unix s"),
        (["--declare", "idle", "--input", "/nonexistent/x.csv"], "/nonexistent/x.csv"),
    ],
)
def test_bad_input_is_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", *args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_unknown_device(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["verify", "--declare", "idle", "--input", str(shared_data / DUTY_FILE), "--devices", "GPU-nope"]
    )
    assert code == 2 and "--devices: uuid: expected a device in the telemetry" in capsys.readouterr().err


def test_missing_cryptography_is_one_line(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cryptography", None)  # as if the `verify` extra were not installed
    code = main(
        [
            "verify",
            "--declare",
            "idle",
            "--input",
            str(shared_data / DUTY_FILE),
            "--bundle",
            str(tmp_path / "b.jsonl"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        "phasescope: signing and auditing need the cryptography package: pip install 'phasescope[verify]'"
    ]
    assert main(["audit", str(tmp_path / "b.jsonl")]) == 2


def test_one_device_in_several_inputs_is_one_timeline(
    shared_data: Path, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A device's recordings given as several inputs (a log per day, here a real trace in two halves, the
    later one first, plus the same half again) are one timeline: one verdict per device, and a bundle its
    own audit accepts. Each input used to be checked apart, and audit rejected the bundle ("telemetry
    reordered or duplicated", "2 verdicts stated, re-running gives 1")."""
    t = labelled(shared_data, DUTY_SHAPING)
    halves = []
    first = np.arange(len(t)) < len(t) // 2
    for k, part in enumerate((t.take(first), t.take(~first))):
        f = tmp_path / f"day{k}" / "gpu.csv"  # no uuid column: both read as device file:gpu#0
        f.parent.mkdir()
        stamps = [time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(1.7e9 + x)) + f".{round(x % 1 * 1000):03d}"
                  for x in part.time]
        rows = [f"{s}, {u * 100:.0f} %, {m / 2**20:.0f} MiB, {p:.2f} W"
                for s, u, m, p in zip(stamps, part["gpu_util"], part["mem_used"], part["power"], strict=True)]
        f.write_text("timestamp, utilization.gpu [%], memory.used [MiB], power.draw [W]\n" + "\n".join(rows))
        halves.append(str(f))
    b = tmp_path / "evidence.jsonl"
    inputs = ["--input", halves[1], "--input", halves[0], "--input", halves[1]]
    code, rows, _ = run(["--declare", "no-training", "--json", *inputs, "--bundle", str(b)], capsys)
    assert code == 1  # the disguised training is found in the joined timeline
    verdicts = [r for r in rows if "verdict" in r]
    assert len(verdicts) == 1 and verdicts[0]["coverage"]["samples"] == len(t)
    pub = str(home / "keys" / "default.pub")
    assert main(["audit", str(b), "--pubkey", pub]) == 0, capsys.readouterr().err


def test_process_claims_are_listed_as_unverified_context(
    shared_data: Path, tmp_path: Path, fake_nvml: Callable[..., object], capsys: pytest.CaptureFixture[str]
) -> None:
    """A vLLM server on the watched GPU is named beside the verdict, marked unverified: the verdict is the
    telemetry's alone (a command line is easy to rename), and the bundle holds none of it."""
    from tests.engine_helpers import running_as_vllm
    from tests.fakes.fake_nvml import FakeProcess
    from tests.live_helpers import training_traces

    with running_as_vllm(tmp_path) as (proc, _port):
        on_gpu = {0: [FakeProcess(proc.pid, 2**30, sm_util_pct=5)]}
        fake_nvml(training_traces(shared_data)[:1], processes=on_gpu)
        code, objs, err = run(["--declare", "inference", "--json", "--source", "auto", "--duration", "1",
                               "--interval", "0.2"], capsys)
        assert code in (0, 1), err
        (context,) = objs[-1]["process_context"].values()
        assert context == {"engines": ["vLLM"], "role": "inference", "verified": False}
        assert all("process_context" not in o for o in objs[:-1])  # not in any device-window verdict
        code = main(["verify", "--declare", "inference", "--source", "auto", "--duration", "1",
                     "--interval", "0.2"])
        out = capsys.readouterr().out
    assert code in (0, 1)
    assert "context (unverified, not part of the verdict):" in out and "vLLM (inference)" in out
