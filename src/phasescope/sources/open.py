"""`--source SPEC` for every live command: which LiveSource to watch.

auto                                   NVML (+ host process details) when it sees a GPU, else the host
nvml                                   NVIDIA GPUs only; SourceError when NVML is unusable
host                                   host CPU, memory and processes (psutil)
replay:PATH[?speed=N&loop=1&format=F]  play a recorded log as live devices (F as in --format)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from phasescope.errors import InputError
from phasescope.sources.base import LiveSource

SPEC_HELP = "auto, nvml, host or replay:PATH[?speed=N&loop=1&format=F]"
_REPLAY_KEYS = ("speed", "loop", "format")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class ReplaySpec:
    path: str
    speed: float = 1.0
    loop: bool = False
    format: str = "auto"


def _say_stderr(line: str) -> None:
    print(f"phasescope: {line}", file=sys.stderr)


def parse_replay_spec(spec: str) -> ReplaySpec:
    """'replay:run.csv?speed=10&loop=1' -> ReplaySpec. The query starts at the last '?'."""
    body = spec[len("replay:") :]
    path, sep, query = body.rpartition("?") if "?" in body else (body, "", "")
    if not path:
        raise InputError("--source", "replay path", "replay:PATH[?speed=N&loop=1&format=F]", spec)
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(sep and query))
    except ValueError:
        raise InputError("--source", "replay options", "key=value pairs joined by '&'", query) from None
    opts: dict[str, str] = {}
    for key, value in pairs:
        if key not in _REPLAY_KEYS:
            raise InputError("--source", f"replay option {key!r}", f"one of {', '.join(_REPLAY_KEYS)}", spec)
        opts[key] = value
    speed = 1.0
    if "speed" in opts:
        try:
            speed = float(opts["speed"])
        except ValueError:
            raise InputError(
                "--source", "replay option 'speed'", "a positive number", opts["speed"]
            ) from None
        if not (speed > 0 and speed != float("inf")):
            raise InputError("--source", "replay option 'speed'", "a positive number", opts["speed"])
    loop = False
    if "loop" in opts:
        flag = opts["loop"].strip().lower()
        if flag not in _TRUE | _FALSE:
            raise InputError("--source", "replay option 'loop'", "1 or 0", opts["loop"])
        loop = flag in _TRUE
    return ReplaySpec(path, speed, loop, opts.get("format") or "auto")


def check_spec(spec: str) -> None:
    """Raise the InputError `open_source` would for a malformed spec (an unknown kind, bad replay options or
    format, a replay file that does not exist), without opening anything: for callers that must refuse a
    typo before they start work, e.g. `phasescope run` before the user's command."""
    text = (spec or "auto").strip()
    kind = text.lower()
    if kind in ("auto", "nvml", "host"):
        return
    if kind.startswith("replay:"):
        replay = parse_replay_spec(text)
        path = Path(replay.path)
        if not path.exists():
            raise InputError(path, "--source", "a recording to replay", "no such file or directory")
        _check_format(path, replay.format)
        return
    raise InputError("--source", "spec", SPEC_HELP, spec)


def _check_format(path: Path, fmt: str) -> None:
    """Raise the InputError `replay.read` would for `format=F` naming no reader (or options after auto)."""
    from phasescope.sources.replay import FORMATS, known_formats, parse_spec

    what = "--source replay option 'format'"
    name, options = parse_spec(fmt or "auto")
    if name == "auto":
        if options:
            raise InputError(path, what, "options only after an explicit format name", fmt)
    elif name not in set(FORMATS):  # the names alone: no reader module is imported here
        raise InputError(path, what, f"one of: auto, {known_formats()}", name)


def open_source(spec: str = "auto", *, say: Callable[[str], None] | None = None) -> LiveSource:
    """The LiveSource a `--source` spec names. `say` gets one-line notices (default: stderr)."""
    say = say or _say_stderr
    text = (spec or "auto").strip()
    kind = text.lower()
    if kind == "auto":
        from phasescope.sources.nvml import open_nvml_or_none

        nvml = open_nvml_or_none(say)
        if nvml is None:
            return _host()
        from phasescope.sources.host import CombinedSource, HostSource

        # GPU rows from NVML; their processes enriched with CPU, RSS, threads, I/O and the torch flag.
        return CombinedSource(nvml, HostSource())
    if kind == "nvml":
        from phasescope.sources.nvml import NvmlSource

        return NvmlSource()
    if kind == "host":
        return _host()
    if kind.startswith("replay:"):
        from phasescope.sources.replay_live import ReplaySource

        r = parse_replay_spec(text)
        return ReplaySource.from_path(r.path, speed=r.speed, loop=r.loop, format=r.format)
    raise InputError("--source", "spec", SPEC_HELP, spec)


def _host() -> LiveSource:
    from phasescope.sources.host import HostSource

    return HostSource()
