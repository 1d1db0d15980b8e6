"""The TOML config file: where it is found, what it holds, one clear line when it is wrong, flags over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope import config
from phasescope.errors import InputError
from phasescope.kpi.cost import Prices

VALID = """
[prices]
usd_per_gpu_hour = 2.5
usd_per_kwh = 0.12

[prices.gpu."H100"]
usd_per_gpu_hour = 4.0

[prices.gpu."H100 NVL"]
usd_per_kwh = 0.3

[thresholds]
min_confidence = 0.7
idle_util = 0.02
min_segment_s = 45
energy_gap_factor = 5

[serve]
host = "0.0.0.0"
port = 9000
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(config.ENV_PATH, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def _write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_file(tmp_path: Path) -> None:
    cfg = config.load(_write(tmp_path, VALID))
    assert cfg.prices.default() == Prices(2.5, 0.12)
    assert cfg.thresholds == config.ThresholdConfig(0.7, 0.02, 45.0, 5.0)
    assert (cfg.serve.host, cfg.serve.port) == ("0.0.0.0", 9000)
    assert cfg.path == str(tmp_path / "config.toml")


def test_gpu_model_overrides(tmp_path: Path) -> None:
    prices = config.load(_write(tmp_path, VALID)).prices
    assert prices.for_device("NVIDIA H100 80GB HBM3") == Prices(4.0, 0.12)
    # The longest matching name wins and fills in what it does not set from the defaults.
    assert prices.for_device("NVIDIA H100 NVL") == Prices(2.5, 0.3)
    assert prices.for_device("NVIDIA GeForce RTX 3090") == Prices(2.5, 0.12)


def test_no_file_means_defaults() -> None:
    cfg = config.load()
    assert cfg == config.Config()
    assert cfg.serve.port == config.DEFAULT_PORT
    assert not cfg.prices.default().priced


def test_default_path_follows_xdg_and_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "xdg" / "phasescope" / "config.toml"
    assert config.default_path() == default
    default.parent.mkdir(parents=True)
    default.write_text("[serve]\nport = 9100\n")
    assert config.load().serve.port == 9100
    monkeypatch.setenv(config.ENV_PATH, str(_write(tmp_path, "[serve]\nport = 9200\n", "env.toml")))
    assert config.load().serve.port == 9200
    assert config.load(_write(tmp_path, "[serve]\nport = 9300\n", "arg.toml")).serve.port == 9300


def test_named_file_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match=r"nope\.toml: file: expected an existing TOML config file"):
        config.load(tmp_path / "nope.toml")
    monkeypatch.setenv(config.ENV_PATH, str(tmp_path / "gone.toml"))
    with pytest.raises(InputError, match=r"gone\.toml"):
        config.load()


# (file text, the line expected after "<path>: ")
MALFORMED = [
    ("[prices\nusd_per_kwh = 1", "line 1, column 8: expected valid TOML, got \"Expected ']'"),
    ("[prices]\nusd_per_kwh = ", "end of document: expected valid TOML, got 'Invalid value'"),
    ('[prices]\nusd_per_kwh = "cheap"', "prices.usd_per_kwh: expected a number >= 0 (USD), got 'cheap'"),
    ("[prices]\nusd_per_gpu_hour = -1", "prices.usd_per_gpu_hour: expected a number >= 0 (USD), got -1"),
    (
        "[prices]\nusd_per_kwhh = 0.1",
        "prices.usd_per_kwhh: expected one of the known keys (gpu, usd_per_gpu_hour",
    ),
    ("[price]\nusd_per_kwh = 0.1", "price: expected one of the known keys (prices, run, serve, thresholds)"),
    ('[run]\nreport_dir = ""', "run.report_dir: expected a non-empty string"),
    (
        "[thresholds]\nmin_confidence = 1.5",
        "thresholds.min_confidence: expected a number between 0 and 1, got 1.5",
    ),
    ("[thresholds]\nidle_util = true", "thresholds.idle_util: expected a number between 0 and 1, got True"),
    ("[thresholds]\nenergy_gap_factor = 0.5", "thresholds.energy_gap_factor: expected a number >= 1"),
    ("[serve]\nport = 70000", "serve.port: expected an integer port between 1 and 65535, got 70000"),
    ("[serve]\nport = 80.5", "serve.port: expected an integer port"),
    ('[serve]\nhost = ""', "serve.host: expected a non-empty string"),
    ("serve = 3", "serve: expected a table, got 3"),
    (
        '[prices.gpu."A100"]\nusd_per_hour = 1',
        'prices.gpu."A100".usd_per_hour: expected one of the known keys',
    ),
    ('[prices.gpu."A100"]\nusd_per_kwh = "x"', 'prices.gpu."A100".usd_per_kwh: expected a number >= 0'),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED)
def test_malformed_file_gives_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as info:
        config.load(path)
    line = str(info.value)
    assert line.startswith(f"{path}: {message}")
    assert "\n" not in line


def test_flags_override_the_file(tmp_path: Path) -> None:
    cfg = config.load(_write(tmp_path, VALID))
    over = cfg.override(prices__usd_per_kwh=0.3, prices__usd_per_gpu_hour=None, serve__port=8080)
    assert over.prices.default() == Prices(2.5, 0.3)  # None = flag not given: the file's value stays
    assert over.serve.port == 8080
    assert over.prices.gpu == cfg.prices.gpu
    assert cfg.prices.usd_per_kwh == 0.12  # the original is untouched
    with pytest.raises(InputError, match=r"command line: serve\.port: expected an integer port"):
        cfg.override(serve__port=0)
    with pytest.raises(ValueError, match="unknown config flag"):
        cfg.override(serve__colour="red")
