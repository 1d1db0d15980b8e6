"""Click options that several commands share, so a name, type or default is declared once.

Each takes the command's own help text: the meaning is the same, the wording fits the command.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf: click lets nan past every bound (nan < 0.1 is false)
    and inf past a missing maximum, and either then fails deep inside (a sampler's wait, a ring's size)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"expected a finite number, got {value!r}", param, ctx)
        return rv


class Duration(click.ParamType):
    """A time span on the command line, as everywhere in phasescope: 90s, 15m, 1h30m, 2d, or bare seconds
    (0.5), within [min, max] (`min_open`: min itself refused). Converts to float seconds."""

    name = "duration"

    def __init__(self, min: float = 0.0, max: float = math.inf, min_open: bool = True) -> None:
        self.min, self.max, self.min_open = min, max, min_open

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from phasescope.timespec import DURATION_HELP, parse_duration

        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value), param.opts[0] if param else "duration", allow_zero=True)
            except ValueError:
                self.fail(f"expected {DURATION_HELP} (or seconds), got {value!r}", param, ctx)
        if not math.isfinite(seconds) or seconds < self.min or (self.min_open and seconds == self.min):
            bound = f"more than {self.min:g} s" if self.min_open else f"at least {self.min:g} s"
            self.fail(f"expected {bound}, got {value!r}", param, ctx)
        if seconds > self.max:
            self.fail(f"expected at most {self.max:g} s, got {value!r}", param, ctx)
        return seconds


def model_option(help: str) -> Callable[[F], F]:
    """`--model PATH` -> `model_path` (None: the shipped model)."""
    return click.option(
        "--model", "model_path", default=None, type=click.Path(dir_okay=False, path_type=str), help=help
    )


def key_option(help: str) -> Callable[[F], F]:
    """`--key NAME` -> `key_name`: the signing key; `ledger` and `verify` must default to the same one."""
    return click.option("--key", "key_name", default="default", show_default=True, help=help)


def duration_option(help: str) -> Callable[[F], F]:
    """`--duration 90s|15m|SECONDS` (> 0; None: no limit)."""
    return click.option("--duration", type=Duration(), default=None, help=help)


MAX_INTERVAL_S = 86400.0  # a day: beyond, the sampler's wait overflows the platform's time_t (1e10 s)


def interval_option(help: str) -> Callable[[F], F]:
    """`--interval SECONDS` between live samples (sampler.MIN_INTERVAL_S = 0.1 to a day; None:
    `live_interval`)."""
    return click.option(
        "--interval",
        type=Duration(min=0.1, max=MAX_INTERVAL_S, min_open=False),
        default=None,
        help=f"{help}  [default: 1; a replay: its own recorded rate x speed]",
    )


def live_interval(source: Any, interval: float | None, say: Callable[[str], None] | None = None) -> float:
    """The sampling interval for `source`: `interval` when given; else a replay's own recorded interval
    divided by its speed (1 s would keep one sample in ten of a 1 Hz file replayed at speed=10), within the
    sampler's 0.1 s limit; else 1 s. A replay that plays faster than that limit loses samples: `say` (default:
    a line on stderr) tells how many are kept."""
    from phasescope.sources.replay_live import ReplaySource
    from phasescope.sources.sampler import DEFAULT_INTERVAL_S, MIN_INTERVAL_S

    if interval is not None:
        return interval
    if isinstance(source, ReplaySource):
        ratio = MIN_INTERVAL_S / source.interval_s
        if ratio > 1.05:  # not a 10 Hz file at 1x, whose median spacing is a hair under 0.1 s
            (say or _say)(f"the replay plays a sample every {source.interval_s:.3g} s at {source.speed:g}x; "
                          f"sampled every {MIN_INTERVAL_S:g} s (the sampler's limit), about "
                          f"{100 / ratio:.0f}% of its samples are kept: a lower speed keeps them all")
        return max(MIN_INTERVAL_S, source.interval_s)
    return DEFAULT_INTERVAL_S


def _say(line: str) -> None:
    click.echo(f"phasescope: {line}", err=True)


def price_options(gpu_hour_help: str, kwh_help: str, config_help: str) -> Callable[[F], F]:
    """`--price-gpu-hour`, `--price-kwh` (USD, >= 0; None: from the config) and `--config PATH`."""
    options = [
        click.option("--price-gpu-hour", type=FiniteFloatRange(min=0), default=None, help=gpu_hour_help),
        click.option("--price-kwh", type=FiniteFloatRange(min=0), default=None, help=kwh_help),
        click.option(
            "--config", "config_path", type=click.Path(dir_okay=False), default=None, help=config_help
        ),
    ]

    def wrap(f: F) -> F:
        for opt in reversed(options):
            f = opt(f)
        return f

    return wrap
