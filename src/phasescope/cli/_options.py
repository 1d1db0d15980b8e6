"""Click options that several commands share, so a name, type or default is declared once.

Each takes the command's own help text: the meaning is the same, the wording fits the command.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def model_option(help: str) -> Callable[[F], F]:
    """`--model PATH` -> `model_path` (None: the shipped model)."""
    return click.option(
        "--model", "model_path", default=None, type=click.Path(dir_okay=False, path_type=str), help=help
    )


def key_option(help: str) -> Callable[[F], F]:
    """`--key NAME` -> `key_name`: the signing key; `ledger` and `verify` must default to the same one."""
    return click.option("--key", "key_name", default="default", show_default=True, help=help)


def duration_option(help: str) -> Callable[[F], F]:
    """`--duration SECONDS` (> 0; None: no limit)."""
    return click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, help=help)


def interval_option(help: str) -> Callable[[F], F]:
    """`--interval SECONDS` between live samples (>= sampler.MIN_INTERVAL_S = 0.1; None: `live_interval`)."""
    return click.option(
        "--interval",
        type=click.FloatRange(min=0.1),
        default=None,
        help=f"{help}  [default: 1; a replay: its own recorded rate x speed]",
    )


def live_interval(source: Any, interval: float | None) -> float:
    """The sampling interval for `source`: `interval` when given; else a replay's own recorded interval
    divided by its speed (1 s would keep one sample in ten of a 1 Hz file replayed at speed=10), within the
    sampler's 0.1 s limit; else 1 s."""
    from phasescope.sampler import DEFAULT_INTERVAL_S, MIN_INTERVAL_S
    from phasescope.sources.replay_live import ReplaySource

    if interval is not None:
        return interval
    if isinstance(source, ReplaySource):
        return max(MIN_INTERVAL_S, source.interval_s)
    return DEFAULT_INTERVAL_S


def price_options(gpu_hour_help: str, kwh_help: str, config_help: str) -> Callable[[F], F]:
    """`--price-gpu-hour`, `--price-kwh` (USD, >= 0; None: from the config) and `--config PATH`."""
    options = [
        click.option("--price-gpu-hour", type=click.FloatRange(min=0), default=None, help=gpu_hour_help),
        click.option("--price-kwh", type=click.FloatRange(min=0), default=None, help=kwh_help),
        click.option(
            "--config", "config_path", type=click.Path(dir_okay=False), default=None, help=config_help
        ),
    ]

    def wrap(f: F) -> F:
        for opt in reversed(options):
            f = opt(f)
        return f

    return wrap
