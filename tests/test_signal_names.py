"""The one table of column names and units (signal_names): consistent with the schema, and the same table
docs/FORMATS.md prints (generated here, so the two cannot drift)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasescope import signal_names as sn
from phasescope.schema import MHZ, MIB, PERCENT, SIGNALS

FORMATS_MD = Path(__file__).resolve().parents[1] / "docs" / "FORMATS.md"


def test_every_name_means_a_signal_or_a_role_and_its_unit_fits() -> None:
    for table in (sn.NVIDIA_SMI, sn.SYNONYMS):
        for name, meaning in table.items():
            assert meaning.role in SIGNALS or meaning.role in sn.ROLES, name
            if meaning.role in SIGNALS and meaning.unit is not None:
                dim, _ = sn.UNITS[meaning.unit]
                assert dim == SIGNALS[meaning.role].unit, name
            if meaning.role in sn.ROLES:
                assert meaning.unit is None, name
    for unit, (dim, factor) in sn.UNITS.items():
        assert unit == unit.lower() and factor > 0 and dim in {s.unit for s in SIGNALS.values()}, unit


def test_synonyms_are_written_normalised_and_never_shadow_nvidia_smi() -> None:
    smi = {sn.normalise(k) for k in sn.NVIDIA_SMI}
    for name in sn.SYNONYMS:
        assert sn.normalise(name) == name, name
        assert name not in smi, f"{name!r} is an nvidia-smi field: list it in NVIDIA_SMI only"


@pytest.mark.parametrize(
    ("header", "role", "factor"),
    [
        ("power.draw [W]", "power", 1.0),
        ("power.draw", "power", 1.0),
        ("power_W", "power", 1.0),
        ("gpu_power_mW", "power", 1e-3),
        ("Power (kW)", "power", 1e3),
        ("utilization_gpu_percent", "gpu_util", PERCENT),
        ("utilization.gpu [%]", "gpu_util", PERCENT),
        ("gpu_util%", "gpu_util", PERCENT),
        ("util_gpu_pct", "gpu_util", PERCENT),
        ("GPU Utilization", "gpu_util", PERCENT),
        ("gpu_util_ratio", "gpu_util", 1.0),
        ("temperature_C", "temperature", 1.0),
        ("mem_used_mb", "mem_used", MIB),
        ("memory.used [MiB]", "mem_used", MIB),
        ("vram_used_gb", "mem_used", MIB * 1024),
        ("memory_total_bytes", "mem_total", 1.0),
        ("clocks.sm [MHz]", "sm_clock", MHZ),
        ("sm_clock_ghz", "sm_clock", 1e9),
        ("pcie_rx", "pcie_rx", 1000.0),
        ("energy_mJ", "energy", 1e-3),
    ],
)
def test_recognise_signal_headers(header: str, role: str, factor: float) -> None:
    col = sn.recognise(header)
    assert col.role == role and col.is_signal
    assert sn.unit_factor(col) == pytest.approx(factor)


@pytest.mark.parametrize(
    ("header", "role", "unit"),
    [
        ("timestamp", "time", None),
        ("time_ms", "time", "ms"),
        ("epoch", "time", None),
        ("gpu_index", "index", None),
        ("gpu", "index", None),
        ("pci.bus_id", "pci", None),
        ("gpu_uuid", "uuid", None),
        ("fan.speed [%]", None, "%"),
        ("price", None, None),
        ("power_ms", None, None),  # a time unit on a signal is no unit of it: not read
    ],
)
def test_recognise_other_headers(header: str, role: str | None, unit: str | None) -> None:
    col = sn.recognise(header)
    assert (col.role, col.unit) == (role, unit)


@pytest.mark.parametrize(
    ("header", "role", "device"),
    [
        ("gpu0_util", "gpu_util", 0),
        ("GPU 1 Power (W)", "power", 1),
        ("power_W_gpu12", "power", 12),
        ("cuda:3 temp", "temperature", 3),
        ("gpu_util", "gpu_util", None),  # no number: the signal of the row's own GPU
        ("gpu0_name", None, None),  # only signals are per GPU in a wide log
    ],
)
def test_recognise_wide_per_gpu_columns(header: str, role: str | None, device: int | None) -> None:
    col = sn.recognise(header)
    assert (col.role, col.device) == (role, device)


def test_a_unit_of_another_quantity_is_no_factor() -> None:
    assert sn.unit_factor(sn.recognise("power [MiB]")) is None
    assert sn.unit_factor(sn.recognise("power [furlong]")) is None


def _names(role: str, table: dict[str, sn.Name]) -> str:
    return ", ".join(f"`{k}`" for k, v in table.items() if v.role == role) or "—"


def _default_unit(role: str) -> str:
    units = {v.unit for t in (sn.NVIDIA_SMI, sn.SYNONYMS) for v in t.values() if v.role == role} - {None}
    return ", ".join(sorted(f"`{u}`" for u in units if u)) or "—"


def synonym_table() -> str:
    """The Markdown docs/FORMATS.md shows: one row per signal or role the table knows, then the units."""
    roles = list(dict.fromkeys(v.role for t in (sn.NVIDIA_SMI, sn.SYNONYMS) for v in t.values()))
    lines = [
        "| reads as | unit when none is written | nvidia-smi field | other names |",
        "|---|---|---|---|",
    ]
    for role in roles:
        lines.append(f"| {role} | {_default_unit(role)} | {_names(role, sn.NVIDIA_SMI)} | "
                     f"{_names(role, sn.SYNONYMS)} |")
    lines += ["", "| base unit | units as written (any case) × factor into the base unit |", "|---|---|"]
    for dim in dict.fromkeys(d for d, _ in sn.UNITS.values()):
        units = [f"`{u}` ×{f:.10g}" for u, (d, f) in sn.UNITS.items() if d == dim]
        lines.append(f"| {dim} | {', '.join(units)} |")
    times = ", ".join(f"`{u}` ×{f:g}" for u, f in sn.TIME_UNITS.items())
    lines.append(f"| seconds (time columns) | {times} |")
    return "\n".join(lines)


def test_formats_md_shows_the_table_as_the_code_has_it() -> None:
    """Regenerate with: python -c 'from tests.test_signal_names import synonym_table as t; print(t())'."""
    assert synonym_table() in FORMATS_MD.read_text(), "docs/FORMATS.md's synonym table is out of date"
