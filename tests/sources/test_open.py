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
