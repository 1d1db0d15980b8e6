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

from phasescope.errors import InputError, SourceError
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


def open_source(spec: str = "auto", *, say: Callable[[str], None] | None = None,
                lean: bool = False) -> LiveSource:
    """The LiveSource a `--source` spec names. `say` gets one-line notices (default: stderr).

    lean: the readings a window's energy needs and no more (`phasescope.measure`'s Monitor): NVML without
    process, GPM, NVLink or health calls, the host without its torch scan, and where RAPL can be read the
    host row with CPU package + DRAM energy (`sources/rapl.WithRapl`), beside the GPUs under auto.
    """
    say = say or _say_stderr
    text = (spec or "auto").strip()
    kind = text.lower()
    if lean and kind in ("auto", "nvml", "host"):
        return _open_lean(kind, say)
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


def _open_lean(kind: str, say: Callable[[str], None]) -> LiveSource:
    """`open_source(kind, lean=True)` for auto, nvml and host: energy readings only, RAPL where readable."""
    if kind == "host":
        return _lean_host(None, say)
    from phasescope.sources.nvml import INSTALL_HINT, NvmlSource, nvml_available

    if kind == "auto":
        ok, line = nvml_available()
        if not ok:  # falling back to the host already: the hint to ask for it is moot
            return _lean_host(line.replace(f", {INSTALL_HINT}", ""), say)
    try:
        nvml = NvmlSource(processes=False, gpm=False, nvlink=False, health=False)
    except SourceError as exc:
        if kind == "nvml":
            raise
        return _lean_host(str(exc).replace(f", {INSTALL_HINT}", ""), say)
    if kind == "nvml":
        return nvml
    from phasescope.sources.rapl import WithRapl, rapl_or_reason

    rapl = rapl_or_reason()
    if isinstance(rapl, str):  # no CPU energy: the GPUs alone (as Zeus without RAPL), and nothing to say
        return nvml
    from phasescope.sources.host import CombinedSource, HostSource

    return WithRapl(CombinedSource(nvml, HostSource(find_torch=False), host_row=True), rapl)


def _lean_host(no_gpu: str | None, say: Callable[[str], None]) -> LiveSource:
    """The host alone (CPU share and memory, no torch scan), with RAPL's energy where it can be read; one
    line says why there is no GPU (`no_gpu`) and what the host's energy comes from, or why it is unknown."""
    from phasescope.sources.host import HostSource
    from phasescope.sources.rapl import WithRapl, rapl_or_reason

    host = HostSource(find_torch=False)  # no process scan on the measured program's time
    rapl = rapl_or_reason()
    if isinstance(rapl, str):
        why = f"host energy not measured: {rapl}; time and CPU share are still measured"
        say(f"{no_gpu}; {why}" if no_gpu else why)
        return host
    if no_gpu:
        say(f"{no_gpu}; measuring the host (CPU packages + DRAM through RAPL)")
    return WithRapl(host, rapl)
