"""Split a fleet between replicas by a stable hash of each device's uuid.

`--shard i/n` keeps the devices whose sha256(uuid) falls in bucket i of n. The hash is of the uuid only
(not the host, index or pod), so a device stays with its replica across restarts, re-labelling and
rescheduling, and every replica computes the same split with no coordination.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from phasescope.errors import InputError


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def owns(self, uuid: str) -> bool:
        return bucket(uuid, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def bucket(uuid: str, count: int) -> int:
    digest = hashlib.sha256(uuid.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


def parse_shard(text: str | None) -> Shard | None:
    """'1/4' -> Shard(1, 4) (replica 1 of 4, counting from 0); None or '' -> no sharding."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if m is None or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise InputError("--shard", "shard", "I/N with 0 <= I < N, e.g. 0/4", text)
    return Shard(int(m.group(1)), int(m.group(2)))
