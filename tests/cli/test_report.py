"""`phasescope report` end to end: real files in, one HTML file out; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from phasescope.cli import cli, main
from phasescope.views.display import fmt_usd
from tests.live_helpers import TRAINING_RUN

SPAR = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"


def test_report_of_two_files_with_prices_from_config(shared_data: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('[prices]\nusd_per_gpu_hour = 2.0\nusd_per_kwh = 0.5\n'
                   '[prices.gpu."A100"]\nusd_per_gpu_hour = 4.0\n')
    out = tmp_path / "r.html"
    rc = main(["report", str(shared_data / TRAINING_RUN), str(shared_data / SPAR), "-o", str(out),
               "--config", str(cfg), "--price-kwh", "0.25", "--no-progress"])
    assert rc == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"wrote {out}") and "3 device(s)" in said[0]
    assert f"{Path(TRAINING_RUN).name} #0 " in said[0] and f"{Path(SPAR).name} " in said[0]  # which file
    page = out.read_text()
    assert "$4.00/GPU-hour" in page and "$2.00/GPU-hour" in page  # per-model price from the file
    assert f"{fmt_usd(0.25)}/kWh" in page and f"{fmt_usd(0.5)}/kWh" not in page  # the flag wins
    assert "data-phase='training'" in page


def test_progress_bar_does_not_disturb_the_output(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", str(shared_data / SPAR), "-o", str(out), "--progress"])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 1_000_000  # plotly inline


def test_hook_kpis_in_the_report(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.hook_events import shared_hook_events

    events, pids = shared_hook_events()
    monkeypatch.setenv("XDG_CACHE_HOME", str(events.parent / "cache"))
    out = tmp_path / "r.html"
    rc = main(["report", str(shared_data / SPAR), "-o", str(out), "--events", str(events), "--no-progress"])
    assert rc == 0
    page = out.read_text()
    assert "KPIs from in-process hooks" in page
    for pid in pids.values():
        assert f"pid {pid} on " in page
    for kpi in ("step time p50", "samples/s", "MFU", "requests/s", "latency p99"):
        assert f"<td>{kpi}</td>" in page


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["/nonexistent/run.csv"], "/nonexistent/run.csv: file: expected an existing file"),
        (["{data}/formats/SOURCES.md"], "format: expected one of the known formats"),
        (["{data}/" + SPAR, "-o", "/nonexistent-dir/r.html"],
         "output: expected a file in an existing directory"),
        (["{data}/" + SPAR, "--events", "/nonexistent-events"], "events directory"),
        (["{data}/" + SPAR, "--model", "{data}/labels.csv"], "labels.csv"),
    ],
)
def test_bad_input_is_one_line(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               args: list[str], says: str) -> None:
    argv = ["report", *(a.format(data=shared_data) for a in args)]
    if "-o" not in argv:
        argv += ["-o", str(tmp_path / "r.html")]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "r.html").exists()


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(cli, ["report", "--help"])
    assert result.exit_code == 0 and "phasescope report run.parquet -o run.html" in result.output


def test_report_of_a_phasescope_recording(shared_data: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The real training run written as our own Parquet recording (the writer `phasescope record` uses)
    reports the same phases as the original log."""
    from phasescope.store.recording import RecordingWriter
    from tests.live_helpers import ticks, training_traces

    rec = tmp_path / "run.parquet"
    with RecordingWriter(rec, source_spec="replay", interval_s=1.0) as writer:
        for batch in ticks(training_traces(shared_data)):
            writer.write(batch)
    out = tmp_path / "r.html"
    assert main(["report", str(rec), "-o", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "#0 device: training" in said and "#1 device: idle" in said
    page = out.read_text()
    assert "· phasescope</p>" in page  # the format the reader detected


def test_the_summary_line_keeps_a_device_name_with_parentheses(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The line after writing named each device by its title up to the first " (", which cut a name such as
    "NVIDIA H100 (PCIe)" to "NVIDIA H100"; only the title's own " (uuid)" is dropped now."""
    log = tmp_path / "smi.csv"
    rows = ["timestamp, index, name, uuid, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    rows += [f"2024/01/01 12:00:{s:02d}.000, 0, NVIDIA H100 (PCIe), GPU-1234, 50 %, 1000 MiB, 200.00 W"
             for s in range(30)]
    log.write_text("\n".join(rows) + "\n")
    out = tmp_path / "r.html"
    assert main(["report", str(log), "-o", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "#0 NVIDIA H100 (PCIe): " in said, said


def test_the_summary_line_names_unnamed_devices_by_uuid(shared_data: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Alibaba's pods have no device name or index: the line said "device: unknown" 80 times over."""
    out = tmp_path / "r.html"
    path = shared_data / "alibaba-gentd26" / "pod_gpu_duty_cycle_anon.csv"
    assert main(["report", str(path), "-o", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "device: " not in said and "alibaba-gentd26:" in said, said


def test_progress_shows_a_device_name_with_brackets_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the progress bar read each "classifying <device>" as rich markup: a uuid or name such
    as "GPU-[/]x" raised MarkupError (a traceback over the bar)."""
    from phasescope.cli.report import _progress

    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws as on a terminal
    with _progress(True, 2) as step:
        step("classifying #0 GPU-[/]x [red]")
