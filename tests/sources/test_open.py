"""--source specs: auto, nvml, host, replay:PATH?speed=N&loop=1&format=F."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope.errors import InputError
from phasescope.sources.open import ReplaySpec, open_source, parse_replay_spec
from phasescope.sources.replay_live import ReplaySource

RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"


def test_parse_replay_spec() -> None:
    assert parse_replay_spec("replay:/a/b.csv") == ReplaySpec("/a/b.csv")
    assert parse_replay_spec("replay:b.csv?speed=12.5&loop=1") == ReplaySpec("b.csv", 12.5, True)
    assert parse_replay_spec(
        "replay:b.csv?format=nvidia-smi-csv:gpus=8;columns=a,b&loop=false"
    ) == ReplaySpec("b.csv", 1.0, False, "nvidia-smi-csv:gpus=8;columns=a,b")
    assert (
        parse_replay_spec("replay:odd?name.csv?speed=2").path == "odd?name.csv"
    )  # the last '?' starts options


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("replay:", "replay path"),
        ("replay:x.csv?speed=0", "'speed': expected a positive number"),
        ("replay:x.csv?speed=fast", "'speed': expected a positive number"),
        ("replay:x.csv?loop=maybe", "'loop': expected 1 or 0"),
        ("replay:x.csv?sped=2", "replay option 'sped': expected one of speed, loop, format"),
        ("replay:x.csv?speed", "replay options"),
    ],
)
def test_bad_replay_specs(spec: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_replay_spec(spec)


def test_unknown_spec_names_the_choices() -> None:
    with pytest.raises(InputError, match=r"--source: spec: expected auto, nvml, host or replay:PATH"):
        open_source("gpu0")


def test_open_replay_of_a_real_file(shared_data: Path) -> None:
    src = open_source(f"replay:{shared_data / RUN}?speed=4&loop=1&format=sensorguard")
    assert isinstance(src, ReplaySource)
    assert src.speed == 4.0 and src.loop and len(src.devices()) >= 2
    assert src.read().values.shape[0] == len(src.devices())
    src.close()


def test_open_replay_of_a_missing_file_is_one_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        open_source(f"replay:{tmp_path / 'absent.csv'}")


def test_lean_host_is_the_measured_readings_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lean=True` (phasescope.measure's Monitor): the host without its torch scan; with no RAPL zone its
    energy is unknown, said in one line, and with a readable zone its row carries RAPL's joules."""
    from phasescope.schema import SIGNAL_COLUMN
    from phasescope.sources import rapl
    from phasescope.sources.host import HostSource
    from tests.fakes.fake_powercap import make_zone, set_uj

    monkeypatch.setattr(rapl, "POWERCAP", tmp_path)  # no zones
    said: list[str] = []
    src = open_source("host", say=said.append, lean=True)
    assert isinstance(src, HostSource) and not src._find_torch
    assert len(said) == 1 and said[0].startswith("host energy not measured: no RAPL energy counters")
    src.close()
    make_zone(tmp_path, "intel-rapl:0", "package-0", 5_000_000)
    said.clear()
    src = open_source("host", say=said.append, lean=True)
    assert isinstance(src, rapl.WithRapl) and said == []
    set_uj(tmp_path, "intel-rapl:0", 7_500_000)
    batch = src.read()
    assert batch.values[0, SIGNAL_COLUMN["energy"]] == pytest.approx(2.5)  # J since the first reading
    src.close()
