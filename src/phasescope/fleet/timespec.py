"""The fleet commands' durations and instants: the shared grammar in `phasescope.timespec`."""

from __future__ import annotations

from phasescope.timespec import parse_duration, parse_instant

__all__ = ["parse_duration", "parse_instant"]
