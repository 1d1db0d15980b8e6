"""`phasescope report` end to end: real files in, one HTML file out; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from phasescope.cli import cli, main
from phasescope.display import fmt_usd
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
    from phasescope.recording import RecordingWriter
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
