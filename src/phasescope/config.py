"""The user's config file (TOML): prices, thresholds and the server port. Command-line flags override it.

Where it is read from, first found wins:
1. the path a command is given (`--config`), which must exist;
2. `$PHASESCOPE_CONFIG`, which must exist;
3. `$XDG_CONFIG_HOME/phasescope/config.toml` (default `~/.config/phasescope/config.toml`), optional.

Example::

    [prices]
    usd_per_gpu_hour = 2.50          # what a held GPU costs per hour
    usd_per_kwh = 0.12               # what energy costs

    [prices.gpu."H100"]              # overrides for devices whose name contains "H100" (case-insensitive)
    usd_per_gpu_hour = 4.00

    [thresholds]
    min_confidence = 0.6             # below this, a window or a live reading says "unknown" (unset: 0.5)
    idle_util = 0.05                 # GPU utilisation (ratio) under which a device counts as idle
    min_segment_s = 30.0             # shortest phase segment kept (unset: the built-in hysteresis)
    energy_gap_factor = 3.0          # power is not integrated across gaps longer than this many periods

    [serve]
    host = "127.0.0.1"
    port = 9464

A malformed file gives one line: the file, the key, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phasescope.errors import InputError
from phasescope.kpi.cost import Prices

ENV_PATH = "PHASESCOPE_CONFIG"
DEFAULT_PORT = 9464


@dataclass(frozen=True)
class PriceConfig:
    usd_per_gpu_hour: float | None = None
    usd_per_kwh: float | None = None
    # device-name substring (matched case-insensitively, longest first) -> override
    gpu: Mapping[str, Prices] = field(default_factory=dict)

    def default(self) -> Prices:
        return Prices(self.usd_per_gpu_hour, self.usd_per_kwh)

    def for_device(self, name: str) -> Prices:
        """Prices for a device by model name: the longest matching override, filled in from the defaults."""
        lowered = name.lower()
        for key in sorted(self.gpu, key=len, reverse=True):
            if key.lower() in lowered:
                over = self.gpu[key]
                return Prices(
                    over.usd_per_gpu_hour if over.usd_per_gpu_hour is not None else self.usd_per_gpu_hour,
                    over.usd_per_kwh if over.usd_per_kwh is not None else self.usd_per_kwh,
                )
        return self.default()


@dataclass(frozen=True)
class ThresholdConfig:
    # None = not set: `classify`, `top`, `serve` and `demo` keep the rules every evaluated figure was
    # measured with (the model's own 0.5 bar, the segments' switch cost, which the live badge decodes with).
    # Set, they change those commands' outputs (`cli/classify.py`, `LiveClassifier`); `eval` never reads them.
    min_confidence: float | None = None
    idle_util: float = 0.05
    min_segment_s: float | None = None
    energy_gap_factor: float = 3.0


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT


@dataclass(frozen=True)
class RunConfig:
    report_dir: str = "phasescope-runs"  # `phasescope run`'s default reports, relative to the current folder


@dataclass(frozen=True)
class Config:
    prices: PriceConfig = field(default_factory=PriceConfig)
    thresholds: ThresholdConfig = field(default_factory=ThresholdConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    run: RunConfig = field(default_factory=RunConfig)
    path: str | None = None  # the file it came from; None = built-in defaults

    def override(self, **flags: Any) -> Config:
        """A copy with flags applied; keys are "section.key" spelled with "__" (prices__usd_per_kwh=0.2).

        None means "flag not given" and leaves the file's value. Values are checked like the file's.
        """
        sections: dict[str, dict[str, Any]] = {}
        for key, value in flags.items():
            if value is None:
                continue
            section, _, name = key.partition("__")
            if section not in _SECTIONS or name not in _FIELDS[section] or name == "gpu":
                raise ValueError(f"unknown config flag {key!r}")
            sections.setdefault(section, {})[name] = _check("command line", section, name, value)
        out = self
        for section, values in sections.items():
            out = dataclasses.replace(out, **{section: dataclasses.replace(getattr(out, section), **values)})
        return out


_SECTIONS: dict[str, type] = {"prices": PriceConfig, "thresholds": ThresholdConfig, "serve": ServeConfig,
                              "run": RunConfig}
_FIELDS: dict[str, dict[str, dataclasses.Field[Any]]] = {
    name: {f.name: f for f in dataclasses.fields(cls)} for name, cls in _SECTIONS.items()
}
_PROBABILITY = {"min_confidence", "idle_util"}


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "phasescope" / "config.toml"


def _number(path: str, key: str, value: Any, *, lo: float = 0.0, hi: float = math.inf, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (lo <= float(value) <= hi)
        or not math.isfinite(float(value))
    ):
        raise InputError(path, key, what, value)
    return float(value)


def _check(path: str, section: str, name: str, value: Any) -> Any:
    key = f"{section}.{name}"
    if section == "prices":
        return _number(path, key, value, what="a number >= 0 (USD)")
    if section == "thresholds":
        if name in _PROBABILITY:
            return _number(path, key, value, hi=1.0, what="a number between 0 and 1")
        if name == "energy_gap_factor":
            return _number(path, key, value, lo=1.0, what="a number >= 1 (sample periods)")
        return _number(path, key, value, what="a number >= 0 (seconds)")
    if name == "port":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            raise InputError(path, key, "an integer port between 1 and 65535", value)
        return value
    if not isinstance(value, str) or not value:
        raise InputError(path, key, "a non-empty string", value)
    return value


def _table(path: str, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(path, key, "a table", value)
    return value


def _unknown(path: str, key: str, allowed: Any) -> InputError:
    return InputError(path, key, f"one of the known keys ({', '.join(sorted(allowed))})", "an unknown key")


def parse(data: Mapping[str, Any], path: str = "<config>") -> Config:
    """A Config from already-parsed TOML; raises InputError naming the file and key for anything wrong."""
    sections: dict[str, Any] = {}
    for section, body in data.items():
        if section not in _SECTIONS:
            raise _unknown(path, section, _SECTIONS)
        table = _table(path, section, body)
        values: dict[str, Any] = {}
        for name, value in table.items():
            if name not in _FIELDS[section]:
                raise _unknown(path, f"{section}.{name}", _FIELDS[section])
            if section == "prices" and name == "gpu":
                values["gpu"] = _gpu_overrides(path, _table(path, "prices.gpu", value))
            else:
                values[name] = _check(path, section, name, value)
        sections[section] = _SECTIONS[section](**values)
    return Config(**sections, path=path)


def _gpu_overrides(path: str, table: Mapping[str, Any]) -> dict[str, Prices]:
    out: dict[str, Prices] = {}
    allowed = {"usd_per_gpu_hour", "usd_per_kwh"}
    for model, body in table.items():
        where = f'prices.gpu."{model}"'
        values: dict[str, float] = {}
        for name, value in _table(path, where, body).items():
            if name not in allowed:
                raise _unknown(path, f"{where}.{name}", allowed)
            values[name] = _number(path, f"{where}.{name}", value, what="a number >= 0 (USD)")
        out[model] = Prices(**values)
    return out


def load(path: str | Path | None = None) -> Config:
    """The config from `path`, else $PHASESCOPE_CONFIG, else the default file, else built-in defaults."""
    required = True
    if path is None:
        env = os.environ.get(ENV_PATH)
        if env:
            path = env
        else:
            path, required = default_path(), False
    p = Path(path).expanduser()
    if not p.exists():
        if required:
            raise InputError(p, "file", "an existing TOML config file", "no such file")
        return Config()
    from phasescope.sources.replay import check_file

    check_file(p)  # a FIFO or device would block the read forever
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        # "Expected ']' at the end of a table declaration (at line 1, column 8)" -> where + what.
        m = re.match(r"(?P<what>.*?)\s*\(at (?P<where>line \d+, column \d+|end of document)\)$", str(exc))
        where, what = (m["where"], m["what"]) if m else ("syntax", str(exc))
        raise InputError(p, where, "valid TOML", what) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(p, "file", "a readable UTF-8 TOML file", str(exc)) from None
    return parse(data, str(p))
