"""The three text-log readers (`nvidia-smi` table, `nvidia-smi -q`, `dcgmi dmon`) over seeded mutants of the
logs their tests build: every read gives traces or one InputError line, never another exception.
(shared data holds no such log, so the corpus fuzz in tests/test_fuzz_inputs.py cannot seed them.)"""

from __future__ import annotations

import random
import traceback
from pathlib import Path

import pytest

from phasescope.errors import InputError
from phasescope.sources.replay import FORMATS, read
from tests.sources.replay import test_dcgmi_dmon, test_nvidia_smi_q, test_nvidia_smi_table

SEEDS = {
    "nvidia-smi-table": test_nvidia_smi_table.two_gpu_log(3),
    "nvidia-smi-q": test_nvidia_smi_q.two_gpu_log(2),
    "dcgmi-dmon": test_dcgmi_dmon.log_text(5, header_every=2),
}
# Bytes that mean something to one of these layouts: cell walls, key separators, markers, huge numbers.
CHUNKS = [
    b"N/A", b" ", b"\n", b"|", b":", b"-1", b"1e400", b"99999999999", b"\xff", b"GPU 0 ", b"#Entity X\n",
    b"==NVSMI LOG==\n", b"+---+\n", b"Mon Dec  7 25:61:00 2026\n", b"\x00", b"\r",
]
MUTANTS = 150


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        if not out:
            break
        at, op = rng.randrange(len(out)), rng.random()
        if op < 0.3:
            out[at] = rng.randrange(256)
        elif op < 0.5:
            del out[at : at + rng.randint(1, 80)]
        elif op < 0.7:
            out[at:at] = rng.choice(CHUNKS)
        elif op < 0.85:
            del out[at:]  # the logger killed mid-write
        else:
            lines = bytes(out).split(b"\n")
            lines.insert(rng.randrange(len(lines)), lines[rng.randrange(len(lines))])
            out = bytearray(b"\n".join(lines))
    return bytes(out)


@pytest.mark.parametrize("name", list(SEEDS))
def test_mutants_give_traces_or_one_line(name: str, tmp_path: Path) -> None:
    rng = random.Random(name)  # seeded: a failure names its mutant number and reproduces
    data = SEEDS[name].encode()
    faults: list[str] = []
    read_count = 0
    for k in range(MUTANTS):
        p = tmp_path / f"{k}.log"
        p.write_bytes(mutate(data, rng))
        for how in ("module", "auto", "named"):
            try:
                if how == "module":
                    FORMATS[name].read(p)
                else:
                    read(p) if how == "auto" else read(p, name)
                read_count += 1
            except InputError as exc:
                assert "\n" not in str(exc)
            except Exception:  # the point: nothing else may escape
                faults.append(f"mutant {k}, {how}: {traceback.format_exc(limit=2)}")
    assert not faults, "\n".join(faults[:5])
    assert read_count > MUTANTS // 4  # most small damage is read around, not refused


@pytest.mark.parametrize("name", list(SEEDS))
def test_a_long_digit_run_is_read_in_linear_time(name: str, tmp_path: Path) -> None:
    """A value replaced by 20,000 digits and a letter: `\\d+\\.?\\d*` backtracked quadratically on it (5 s at
    5,000 digits); an answer or one line now comes at once (the limit is far above linear, far below that)."""
    import re

    from tests.test_fuzz_inputs import LONG_RUN, LONG_RUN_LIMIT_S, run_case

    data = SEEDS[name].encode()
    # a reading: before its unit (table, -q), or a row's first value (dcgmi prints no units)
    m = re.search(rb"(\d+(?:\.\d+)?)(?= ?(?:W|%|MiB)\b)|GPU \d+ +(\d+(?:\.\d+)?)", data)
    assert m is not None
    group = 1 if m.group(1) is not None else 2
    p = tmp_path / "long.log"
    p.write_bytes(data[: m.start(group)] + LONG_RUN + b"x" + data[m.end(group) :])
    failures: list[str] = []
    run_case(f"{name} with a long digit run", [("read(auto)", lambda: read(p))], failures, LONG_RUN_LIMIT_S)
    assert not failures, "\n\n".join(failures)
