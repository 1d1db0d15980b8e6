"""A fake Linux powercap tree (what /sys/class/powercap holds for RAPL) for tests of sources/rapl.py."""

from __future__ import annotations

from pathlib import Path

MAX_UJ = 262143328850  # a real package zone's max_energy_range_uj


def make_zone(root: Path, dirname: str, name: str, uj: int, max_uj: int = MAX_UJ) -> Path:
    zone = root / dirname
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "name").write_text(name + "\n")
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def set_uj(root: Path, dirname: str, uj: int) -> None:
    (root / dirname / "energy_uj").write_text(f"{uj}\n")
