"""RaplReader over a fake powercap tree laid out as Linux lays out /sys/class/powercap."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from phasescope.errors import SourceError
from phasescope.sources import rapl
from phasescope.sources.rapl import RaplReader
from tests.fakes.fake_powercap import MAX_UJ, make_zone, set_uj


def two_socket_server(root: Path) -> Path:
    """Two packages with core and DRAM subzones, and a platform (psys) zone that overlaps them all."""
    make_zone(root, "intel-rapl:0", "package-0", 1_000_000)
    make_zone(root, "intel-rapl:0:0", "core", 500_000)
    make_zone(root, "intel-rapl:0:1", "dram", 2_000_000, 65_712_999_613)
    make_zone(root, "intel-rapl:1", "package-1", 7_000_000)
    make_zone(root, "intel-rapl:1:0", "dram", 0, 65_712_999_613)
    make_zone(root, "intel-rapl:2", "psys", 9_000_000)
    return root


def test_sums_packages_and_dram_only_and_counts_from_the_first_reading(tmp_path):
    root = two_socket_server(tmp_path)
    reader = RaplReader(root)
    assert [z.label for z in reader.zones] == [
        "package-0", "package-0/core", "package-0/dram", "package-1", "package-1/dram", "psys"]
    set_uj(root, "intel-rapl:0", 31_000_000)  # +30 J
    set_uj(root, "intel-rapl:0:0", 20_500_000)  # +20 J, inside package-0's 30 J
    set_uj(root, "intel-rapl:0:1", 7_000_000)  # +5 J
    set_uj(root, "intel-rapl:1", 17_000_000)  # +10 J
    set_uj(root, "intel-rapl:1:0", 1_500_000)  # +1.5 J
    set_uj(root, "intel-rapl:2", 109_000_000)  # +100 J: the platform, overlapping all of it
    got = reader.read()
    assert got["package-0/core"] == pytest.approx(20.0) and got["psys"] == pytest.approx(100.0)
    assert reader.total_j(got) == pytest.approx(30 + 5 + 10 + 1.5)


def test_a_wrap_is_unwrapped(tmp_path):
    root = tmp_path
    make_zone(root, "intel-rapl:0", "package-0", MAX_UJ - 4_000_000)
    reader = RaplReader(root)
    set_uj(root, "intel-rapl:0", 6_000_000)  # wrapped: 4 J to the top, then 6 J
    assert reader.total_j(reader.read()) == pytest.approx(10.0)
    set_uj(root, "intel-rapl:0", 16_000_000)
    assert reader.total_j(reader.read()) == pytest.approx(20.0)


def test_a_failed_zone_reads_nan_and_the_total_with_it(tmp_path):
    root = two_socket_server(tmp_path)
    reader = RaplReader(root)
    (root / "intel-rapl:1:0" / "energy_uj").write_text("garbage\n")
    got = reader.read()
    assert math.isnan(got["package-1/dram"]) and math.isnan(reader.total_j(got))
    assert got["package-0"] == 0.0


def test_no_rapl_and_no_permission_are_one_line_each(tmp_path, monkeypatch):
    with pytest.raises(SourceError, match="no RAPL energy counters") as err:
        RaplReader(tmp_path)
    assert "\n" not in str(err.value)
    make_zone(tmp_path, "intel-rapl:0", "package-0", 1)
    real = rapl._read_number

    def forbidden(path: Path) -> float:
        if path.name == "energy_uj":  # what a non-root user gets on Linux >= 5.10
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(rapl, "_read_number", forbidden)
    with pytest.raises(SourceError, match=r"readable by root only .*chmod a\+r") as err:
        RaplReader(tmp_path)
    assert "\n" not in str(err.value)
