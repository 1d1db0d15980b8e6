"""File readers: turn recorded telemetry logs into `Trace`s in base units.

    read(path, format="auto") -> list[Trace]    one Trace per device
    detect(path) -> str                         the format name, or InputError
    FORMATS                                     name -> reader module (imported on first use)

A format spec may carry options after a colon, separated by ';':
    nvidia-smi-csv:gpus=8
    nvidia-smi-csv:columns=timestamp,utilization.gpu,memory.used
    nvidia-smi-dmon:interval=2
Each reader module has NAME, sniff(path) -> bool and read(path, options=None) -> list[Trace]; see
docs/FORMATS.md for what each reads and its options.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import import_module
from pathlib import Path
from types import ModuleType

from phasescope.errors import InputError
from phasescope.schema import Trace
from phasescope.sources.replay import _not_telemetry
from phasescope.sources.replay._common import (
    PathLike,
    check_file,
    check_times,
    drop_impossible,
    head_text,
    read_head,
    split_clock_steps,
)

# Detection order matters: the most specific signatures first, the loose nvidia-smi CSV last.
_MODULES: dict[str, str] = {
    "phasescope": "phasescope_rec",
    "spar": "spar",
    "sensorguard": "sensorguard",
    "alibaba-gentd26": "alibaba",
    "nvidia-smi-table": "nvidia_smi_table",
    "nvidia-smi-q": "nvidia_smi_q",
    "dcgmi-dmon": "dcgmi_dmon",
    "nvidia-smi-dmon": "nvidia_smi_dmon",
    "dcgm-prom": "dcgm_prom",
    "nvidia-smi-csv": "nvidia_smi_csv",
    "csv": "generic_csv",  # people's own CSV logs: claims only headers nvidia-smi-csv does not
}
# Other names people will type for the same formats.
_ALIASES: dict[str, str] = {
    "dcgm": "dcgm-prom",
    "dcgm-exporter": "dcgm-prom",
    "prometheus": "dcgm-prom",
    "nvidia-smi": "nvidia-smi-csv",
    "dmon": "nvidia-smi-dmon",
    "nvidia-smi-query": "nvidia-smi-q",
    "dcgmi": "dcgmi-dmon",
    "alibaba": "alibaba-gentd26",
    "parquet": "spar",
}


class _LazyFormats(Mapping[str, ModuleType]):
    """name -> reader module, imported on first access (the `phasescope` module may not exist yet)."""

    def __getitem__(self, name: str) -> ModuleType:
        mod = _MODULES[name]
        try:
            return import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{mod}":
                raise KeyError(name) from None
            raise

    def __iter__(self) -> Iterator[str]:
        return iter(_MODULES)

    def __len__(self) -> int:
        return len(_MODULES)


FORMATS: Mapping[str, ModuleType] = _LazyFormats()


def known_formats() -> str:
    return ", ".join(_MODULES)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'nvidia-smi-csv:gpus=8;columns=a,b' -> ('nvidia-smi-csv', {'gpus': '8', 'columns': 'a,b'})."""
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    options: dict[str, str] = {}
    for part in rest.split(";") if rest.strip() else []:
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise InputError(spec, f"option {part.strip()!r}", "key=value (options separated by ';')")
        if key.strip() in options:  # a silent last-one-wins would hide which value was meant
            raise InputError(spec, f"option {key.strip()!r}", "each option once",
                             f"{key.strip()}={options[key.strip()]}; {part.strip()}")
        options[key.strip()] = value.strip()
    return _ALIASES.get(name, name), options


def _module(path: PathLike, name: str) -> ModuleType:
    if name not in _MODULES:
        raise InputError(path, "format", f"one of: auto, {known_formats()}", name)
    try:
        return FORMATS[name]
    except KeyError:
        raise InputError(
            path,
            "format",
            f"the reader module for {name!r} to be installed",
            f"no module phasescope.sources.replay.{_MODULES[name]}",
        ) from None


def _looks_like_phasescope(p: Path) -> bool:
    """Cheap stand-in for the `phasescope` reader's sniff when that module is not there."""
    if p.is_dir():
        return p.name.endswith(".partial")
    return read_head(p, 4) == b"PAR1" and b"phasescope" in _parquet_footer(p)


def _parquet_footer(p: Path) -> bytes:
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            fh.seek(max(0, size - 65536))
            return fh.read()
    except OSError:
        return b""


def detect(path: PathLike) -> str:
    """The name of the format of `path`; InputError when it is none we read (or not telemetry at all)."""
    p = check_file(path, allow_dir=True)
    if p.is_dir() and not (p / "nvml.csv").is_file() and not p.name.endswith(".partial"):
        raise InputError(
            p, "file", f"a telemetry file or a SensorGuard run directory ({known_formats()})", "a directory"
        )
    if p.is_file():
        verdict = _not_telemetry.explain(head_text(p, 16384))
        if verdict is not None:
            raise InputError(p, verdict[0], verdict[1])
    for name in _MODULES:
        try:
            mod = FORMATS[name]
        except KeyError:
            if name == "phasescope" and _looks_like_phasescope(p):
                return name
            continue
        if mod.sniff(p):
            return name
    raise InputError(
        p,
        "format",
        f"one of the known formats ({known_formats()}); force one with --format F, or format=F in a"
        " --source 'replay:PATH?format=F' spec",
        "unrecognised content",
    )


def read(path: PathLike, format: str = "auto") -> list[Trace]:
    """Read a telemetry file into one Trace per device.

    `format` is 'auto' or a spec like 'nvidia-smi-csv:gpus=8'.
    """
    name, options = parse_spec(format or "auto")
    if name == "auto":
        if options:
            raise InputError(path, "format", "options only after an explicit format name", format)
        name = detect(path)
    else:
        check_file(path, allow_dir=True)
    mod = _module(path, name)
    traces: list[Trace] = mod.read(path, options) if options else mod.read(path)
    if not traces:
        raise InputError(path, "data", f"at least one device in this {name} file", "none")
    for t in traces:
        t.meta.setdefault("source_path", str(path))
        t.meta.setdefault("format", name)
    # Every reader's traces pass here: a clock step is cut, an impossible reading is dropped, each said once.
    return drop_impossible(path, split_clock_steps(path, check_times(path, traces)))


__all__ = ["FORMATS", "check_file", "detect", "known_formats", "parse_spec", "read"]
