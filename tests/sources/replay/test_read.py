"""`read()` and `detect()` on every file in shared data: telemetry is read, the rest is refused clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.errors import InputError
from phasescope.sources.replay import FORMATS, detect, parse_spec, read
from tests.conftest import shared_data_dir
from tests.sources.replay.conftest import expect_input_error

# Directory (relative to shared data) -> the format its telemetry files are in.
TELEMETRY_DIRS = {
    "sensorguard-rtx3090": "sensorguard",
    "sensorguard-markers": "sensorguard",
    "spar-a100": "spar",
    "nvidia-smi-h100-training": "nvidia-smi-csv",
    "alibaba-gentd26": "alibaba-gentd26",
    "formats/nvidia-smi-csv": "nvidia-smi-csv",
    "formats/nvidia-smi-csv-noheader": "nvidia-smi-csv",
    "formats/nvidia-smi-dmon": "nvidia-smi-dmon",
    "formats/dcgm-exporter-prom": "dcgm-prom",
    "formats/other": "nvidia-smi-dmon",
}
# Folders whose logs sit beside run metadata and results: the logs (by file name) are telemetry in this
# format; every other file there (per-iteration results CSVs, epoch stamps, topology) is refused as unknown.
TELEMETRY_NAMES = {
    "energy-inference": ("nvidia-smi.csv", "nvidia-smi-csv"),
    "powertrace-vllm": ("power.csv", "nvidia-smi-csv"),
}
# Not device telemetry: the words the refusal must contain.
REFUSED_DIRS = {
    "formats/vllm-metrics": "vLLM /metrics scrape",
    "formats/tgi-metrics": "TGI /metrics scrape",
    "formats/dcgmi-dmon": "error line",
}
# Noheader files whose columns cannot be told from the values: the query list from the source's reference doc.
NEEDS_COLUMNS = {
    "sugarcraft__candy-top__skynet2_query-gpu-noheader-nounits.csv": (
        "index,uuid,name,pci.bus_id,driver_version,utilization.gpu,utilization.memory,memory.total,memory.used,"
        "memory.free,temperature.gpu,temperature.memory,power.draw,power.limit,clocks.gr,clocks.mem,"
        "clocks.max.gr,clocks.max.mem,fan.speed,pstate,pcie.link.gen.current,pcie.link.width.current,"
        "encoder.stats.sessionCount"
    ),
    "sugarcraft__candy-top__skynet2_query-gpu-power-throttle-noheader-nounits.csv": (
        "index,power.draw.average,power.draw.instant,clocks_throttle_reasons.active,memory.reserved,"
        "ecc.mode.current,mig.mode.current"
    ),
}
DOC_SUFFIXES = (".md", ".yaml", ".json")
DOC_NAMES = ("labels.csv", "labels-sensorguard.csv")

# Plausible ranges of each signal in base units: a unit slip (MiB for bytes, % for ratio) lands outside.
RANGES = {
    "gpu_util": (0, 1.0001),
    "mem_util": (0, 1.0001),
    "sm_active": (0, 1.0001),
    "tensor_active": (0, 1.0001),
    "dram_active": (0, 1.0001),
    "power": (0, 2000),
    "power_limit": (10, 2000),
    "temperature": (-40, 130),
    "sm_clock": (0, 5e9),
    "mem_clock": (0, 2e10),
    "mem_used": (0, 300 * 2**30),
    "mem_total": (2**30, 300 * 2**30),
    "pcie_tx": (0, 1e11),
    "pcie_rx": (0, 1e11),
    "energy": (0, 1e12),
}


def _all_files() -> list[str]:
    root = shared_data_dir()
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _kind(rel: str) -> tuple[str, str]:
    name = Path(rel).name
    if name.endswith(DOC_SUFFIXES) or name in DOC_NAMES:
        return "doc", ""
    parent = str(Path(rel).parent)
    for d, words in REFUSED_DIRS.items():
        if parent == d:
            return "refused", words
    for d, fmt in TELEMETRY_DIRS.items():
        if parent == d or parent.startswith(d + "/"):
            return "telemetry", fmt
    for d, (log_name, fmt) in TELEMETRY_NAMES.items():
        if parent == d or parent.startswith(d + "/"):
            return ("telemetry", fmt) if name == log_name else ("not telemetry", "")
    return "unknown", ""


ALL_FILES = _all_files()


def test_shared_data_has_every_kind(shared_data: Path) -> None:
    kinds = [_kind(f)[0] for f in ALL_FILES]
    assert kinds.count("telemetry") >= 115 and kinds.count("refused") == 5
    assert kinds.count("not telemetry") >= 10  # results CSVs, epoch stamps and topology beside the logs
    assert "unknown" not in kinds, [f for f in ALL_FILES if _kind(f)[0] == "unknown"]


def check_trace_sane(trace, fmt: str) -> None:  # type: ignore[no-untyped-def]
    assert trace.meta["format"] == fmt and trace.meta["source_path"]
    assert trace.device.uuid
    assert len(trace) >= 1 and np.all(np.isfinite(trace.time)) and np.all(np.diff(trace.time) >= 0)
    for sig, col in trace.columns.items():
        vals = col[np.isfinite(col)]
        if sig in RANGES and vals.size:
            lo, hi = RANGES[sig]
            assert lo <= vals.min() and vals.max() <= hi, (sig, vals.min(), vals.max())


@pytest.mark.parametrize("rel", ALL_FILES)
def test_every_shared_file(shared_data: Path, rel: str) -> None:
    path = shared_data / rel
    kind, expect = _kind(rel)
    if kind == "telemetry" and path.name in NEEDS_COLUMNS:
        expect_input_error(read, path, match=(str(path), "columns="))
        traces = read(path, f"{expect}:columns={NEEDS_COLUMNS[path.name]}")
    elif kind == "telemetry":
        assert detect(path) == expect
        traces = read(path)
    elif kind == "refused":
        expect_input_error(read, path, match=(str(path), expect))
        return
    else:
        expect_input_error(read, path, match=(str(path), "known formats"))
        return
    assert traces
    for t in traces:
        check_trace_sane(t, expect)
    if expect in ("sensorguard", "spar", "nvidia-smi-csv"):
        assert sum(t.has("power") or t.has("gpu_util") for t in traces) == len(traces)


def test_sensorguard_run_directory(shared_data: Path) -> None:
    run = shared_data / "sensorguard-rtx3090/20260825_idle_verifier-gpu0_s2_r03"
    assert detect(run) == "sensorguard"
    assert len(read(run)) == len(read(run / "nvml.csv"))


def test_missing_file() -> None:
    expect_input_error(read, "/no/such/file.csv", match=("/no/such/file.csv", "no such file"))
    expect_input_error(detect, "/no/such/file.csv", match=("/no/such/file.csv",))


def test_plain_directory(tmp_path: Path) -> None:
    expect_input_error(read, tmp_path, match=(str(tmp_path), "directory"))


def test_unknown_format_name_lists_the_known(shared_data: Path) -> None:
    p = shared_data / "spar-a100" / next(iter(sorted(x.name for x in (shared_data / "spar-a100").iterdir())))
    err = expect_input_error(read, p, "xml", match=(str(p), "xml"))
    for name in FORMATS:
        assert name in str(err)


def test_forcing_the_wrong_reader_is_an_input_error(shared_data: Path) -> None:
    spar_file = sorted((shared_data / "spar-a100").iterdir())[0]
    for fmt in ("nvidia-smi-csv", "nvidia-smi-dmon", "dcgm-prom", "sensorguard", "alibaba-gentd26"):
        with pytest.raises(InputError):
            read(spar_file, fmt)
    with pytest.raises(InputError):
        read(shared_data / "nvidia-smi-h100-training/ckpt1.csv", "spar")


def test_registry_and_specs() -> None:
    assert list(FORMATS)[:3] == ["phasescope", "spar", "sensorguard"]
    assert parse_spec("nvidia-smi-csv:gpus=8;columns=a,b") == (
        "nvidia-smi-csv",
        {"gpus": "8", "columns": "a,b"},
    )
    assert parse_spec("dcgm") == ("dcgm-prom", {})
    with pytest.raises(InputError):
        parse_spec("nvidia-smi-csv:gpus")
    for name in FORMATS:
        mod = FORMATS[name]
        assert name == mod.NAME and callable(mod.sniff) and callable(mod.read)


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.csv"
    p.write_text("")
    expect_input_error(read, p, match=(str(p), "known formats"))
