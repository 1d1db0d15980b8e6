"""Sharding by a stable hash of the device uuid."""

from __future__ import annotations

import subprocess
import sys

import pytest

from phasescope.errors import InputError
from phasescope.fleet.shard import Shard, bucket, parse_shard

UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i * 7919:012x}" for i in range(2000)]


def test_shards_partition_the_fleet_evenly() -> None:
    shards = [Shard(i, 4) for i in range(4)]
    owners = [[s for s in shards if s.owns(u)] for u in UUIDS]
    assert all(len(o) == 1 for o in owners)
    sizes = [sum(o[0] is s for o in owners) for s in shards]
    assert all(abs(n - 500) < 90 for n in sizes), sizes


def test_assignment_is_stable_across_processes() -> None:
    # Python's own hash() is salted per process; the shard must not be.
    code = f"from phasescope.fleet.shard import bucket; print([bucket(u, 7) for u in {UUIDS[:50]!r}])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    )
    assert out.stdout.strip() == str([bucket(u, 7) for u in UUIDS[:50]])


@pytest.mark.parametrize("bad", ["4/4", "1", "a/b", "-1/3", "0/0"])
def test_bad_shard_specs(bad: str) -> None:
    with pytest.raises(InputError, match="--shard"):
        parse_shard(bad)


def test_shard_spec() -> None:
    assert parse_shard("1/4") == Shard(1, 4)
    assert parse_shard(None) is None
