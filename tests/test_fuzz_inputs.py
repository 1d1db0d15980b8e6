"""Suite-wide fuzz: every reader and `audit` over deterministic mutants of real files.

The corpus is small real files from ../shared/data (a few of each format the registry knows, cut to their
first lines), a phasescope recording written here from a real trace, and an evidence bundle made here.
Each mutant is a pure function of (seed file, mutant number), so a failure names what to rebuild:
`mutate(seed.data, k)`. The only acceptable outcomes are an answer or a PhasescopeError (one line on the
command line); any other exception, a case running past CASE_LIMIT_S, or a CLI run that dies on a
signal, prints a traceback or more than one error line, fails.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

from phasescope.errors import PhasescopeError
from phasescope.sources.replay import FORMATS, read
from phasescope.verify.audit import audit_bundle, audit_chain
from phasescope.verify.ledger import canonical
from tests.conftest import REPO, shared_data_dir
from tests.verify._bundle import AUDIT_KEY, make_bundle, resign

MUTANTS_PER_FILE = 8  # per seed file; the whole module stays near a minute on a loaded 2-core machine
BUNDLE_MUTANTS = 24  # byte-level mutants of the bundle, and as many re-signed record-level ones
CASE_LIMIT_S = 15.0  # one mutant through every call: anything longer is a hang
HEAD_LINES = 60  # big real logs are cut to their first lines: the header and some rows are what matter
CLI_LIMIT_S = 120.0

DATA = shared_data_dir()
SG_RUN = "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r02/"


@dataclass(frozen=True)
class Seed:
    name: str  # for messages
    fmt: str  # the registry's name for it ("auto" where no reader claims it)
    fname: str  # file name the reader expects
    data: bytes
    siblings: dict[str, bytes] = field(default_factory=dict)


def _head(rel: str, lines: int = HEAD_LINES) -> bytes:
    return b"".join((DATA / rel).read_bytes().splitlines(keepends=True)[:lines])


def _recording(out: Path) -> Path:
    """A phasescope recording of the first minute of a real two-GPU SensorGuard run."""
    from phasescope.schema import SIGNAL_NAMES, TickBatch
    from phasescope.store.recording import RecordingWriter

    traces = read(DATA / SG_RUN / "nvml.csv")
    n = min(60, *(len(t) for t in traces))
    values = np.stack([np.column_stack([t[s] for s in SIGNAL_NAMES]) for t in traces], axis=1)
    with RecordingWriter(out, source_spec="test", interval_s=1.0, host="node1") as w:
        for i in range(n):
            w.write(TickBatch(float(traces[0].time[i]), [t.device for t in traces], values[i], []))
    return out


def corpus(tmp: Path) -> list[Seed]:
    seeds = [
        Seed(
            "sensorguard",
            "sensorguard",
            "nvml.csv",
            _head(SG_RUN + "nvml.csv", 40),
            {"manifest.yaml": (DATA / SG_RUN / "manifest.yaml").read_bytes()},
        ),
        Seed(
            "alibaba",
            "alibaba-gentd26",
            "pod_gpu_duty_cycle_anon.csv",
            _head("alibaba-gentd26/pod_gpu_duty_cycle_anon.csv", 40),
            {
                "pod_gpu_memory_used_bytes_anon.csv": _head(
                    "alibaba-gentd26/pod_gpu_memory_used_bytes_anon.csv", 40
                )
            },
        ),
        Seed("h100-csv", "nvidia-smi-csv", "a.csv", _head("nvidia-smi-h100-training/ckpt1.csv")),
    ]
    spar = sorted((DATA / "spar-a100").glob("*.parquet"))[0]
    seeds.append(Seed("spar", "spar", "x.parquet", spar.read_bytes()))
    rec = _recording(tmp / "rec.parquet")
    seeds.append(Seed("recording", "phasescope", "rec.parquet", rec.read_bytes()))
    # Every small file the format directories hold, read whole or by its head; "auto" lets detection pick.
    for p in sorted((DATA / "formats").rglob("*")):
        if p.is_file() and p.suffix != ".md" and p.stat().st_size < 200_000:
            rel = str(p.relative_to(DATA))
            seeds.append(Seed(f"{p.parent.name}/{p.name[:40]}", "auto", p.name, _head(rel)))
    return seeds


# ---- deterministic mutations ------------------------------------------------------------------------

WEIRD_NUMBERS = [b"1e308", b"-1e308", b"1e309", b"-5", b"-0", b"NaN", b"nan", b"inf", b"-inf", b"Infinity",
                 b"99999999999999999999999999", b"7e19", b"1e-320", b"0x1F", b"", b"1,5", b"--1",
                 b"9" * 400, b"9" * 5000]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [data]


def _flip(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _line_op(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    op = rng.choice(["dup", "drop", "swap", "blank"])
    if op == "dup":
        lines.insert(i, lines[i])
    elif op == "drop":
        del lines[i]
    elif op == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines.insert(i, b"\n")
    return b"".join(lines)


def _numbers(rng: random.Random, data: bytes) -> bytes:
    found = list(_NUMBER.finditer(data))
    if not found:
        return data
    out = data
    for m in sorted(rng.sample(found, min(len(found), rng.randint(1, 6))), key=lambda m: -m.start()):
        out = out[: m.start()] + rng.choice(WEIRD_NUMBERS) + out[m.end() :]
    return out


def _header(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    head = lines[0].rstrip(b"\r\n")
    fields = head.split(b",")
    op = rng.choice(["drop", "dup", "rename", "empty", "upper"])
    if op == "drop" and len(fields) > 1:
        del fields[rng.randrange(len(fields))]
    elif op == "dup":
        k = rng.randrange(len(fields))
        fields.insert(k, fields[k])
    elif op == "rename":
        fields[rng.randrange(len(fields))] = rng.choice([b"x", b"", b" power.draw [W]", b"\xff\xfe"])
    elif op == "empty":
        fields = [b""]
    else:
        fields = [f.upper() for f in fields]
    lines[0] = b",".join(fields) + lines[0][len(head) :]
    return b"".join(lines)


def _bom(rng: random.Random, data: bytes) -> bytes:
    return rng.choice([b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"]) + data


def _nul(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + b"\x00" * rng.randint(1, 4) + data[at:]


def _newlines(rng: random.Random, data: bytes) -> bytes:
    return data.replace(b"\n", rng.choice([b"\r\n", b"\r", b"\n\n"]))


MUTATORS: list[Callable[[random.Random, bytes], bytes]] = [
    _flip, _truncate, _line_op, _numbers, _header, _bom, _nul, _newlines,
]


def mutate(data: bytes, k: int) -> tuple[bytes, str]:
    """Mutant number k of `data` (1-3 mutations, chosen by k alone), and the names of its mutations."""
    rng = random.Random(k)
    ops = [MUTATORS[k % len(MUTATORS)], *rng.sample(MUTATORS, rng.randint(0, 2))]
    for op in ops:
        data = op(rng, data)
    return data, "+".join(op.__name__.strip("_") for op in ops)


# ---- the in-process harness -------------------------------------------------------------------------


class Hang(BaseException):  # a BaseException: a reader's `except Exception` must not swallow it
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def outcome(call: Callable[[], Any]) -> str | None:
    """None for an answer or a one-line PhasescopeError; else what went wrong, with its traceback."""
    try:
        with warnings.catch_warnings():
            # numpy's overflow/invalid warnings are lines on the user's screen computed from bad values
            warnings.simplefilter("error", RuntimeWarning)
            call()
    except PhasescopeError as exc:
        if "\n" in str(exc) or not str(exc).strip():
            return f"{type(exc).__name__} not one line: {str(exc)!r}"
        return None
    except Exception:  # a Hang goes on up to run_case, which stops the case there
        return _tail()
    return None


def _tail() -> str:
    return "".join(traceback.format_exc().splitlines(keepends=True)[-12:])


def run_case(
    label: str, calls: list[tuple[str, Callable[[], Any]]], failures: list[str], limit_s: float = CASE_LIMIT_S
) -> None:
    what = ""
    try:
        with time_limit(limit_s):
            for what, call in calls:
                problem = outcome(call)
                if problem:
                    failures.append(f"{label} {what}:\n{problem}")
    except Hang:
        failures.append(f"{label} {what}:\n{_tail()}")


def write_mutant(d: Path, seed: Seed, k: int) -> tuple[Path, str]:
    data, ops = mutate(seed.data, k)
    d.mkdir(parents=True, exist_ok=True)
    p = d / seed.fname
    p.write_bytes(data)
    for i, (name, content) in enumerate(seed.siblings.items()):
        # every third mutant also damages the files read beside the main one
        (d / name).write_bytes(mutate(content, k + i + 1)[0] if k % 3 == 2 else content)
    return p, ops


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> list[Seed]:
    if not DATA.is_dir():
        pytest.fail(f"real data not found at {DATA} (set PHASESCOPE_SHARED_DATA)")
    return corpus(tmp_path_factory.mktemp("corpus"))


def test_the_corpus_covers_every_reader(seeds: list[Seed]) -> None:
    named = {s.fmt for s in seeds}
    detected = {s.fmt for s in seeds if s.fmt != "auto"}
    assert {"sensorguard", "alibaba-gentd26", "nvidia-smi-csv", "spar", "phasescope"} <= detected
    assert len(named) >= 5 and len(seeds) >= 20


def test_every_reader_over_mutated_real_files(seeds: list[Seed], tmp_path: Path) -> None:
    names = list(FORMATS)
    failures: list[str] = []
    forced: set[str] = set()
    for i, seed in enumerate(seeds):
        for k in range(MUTANTS_PER_FILE):
            p, ops = write_mutant(tmp_path / f"{i}-{k}", seed, k)
            other = names[(i + k) % len(names)]  # each reader also meets the other formats' mutants
            calls: list[tuple[str, Callable[[], Any]]] = [("read(auto)", lambda p=p: read(p))]
            if seed.fmt != "auto":
                calls.append((f"read({seed.fmt})", lambda p=p, f=seed.fmt: read(p, f)))
            calls.append((f"read({other})", lambda p=p, f=other: read(p, f)))
            forced.add(other)
            run_case(f"seed {seed.name!r} mutant {k} ({ops})", calls, failures)
    assert forced == set(names)  # every registered reader, the ones added since included
    shown = "\n\n".join(failures[:20])
    assert not failures, f"{len(failures)} fault(s); rebuild one with mutate(seed.data, k):\n\n{shown}"


# ---- audit ---------------------------------------------------------------------------------------------

WEIRD_VALUES: list[Any] = [1e308, -1e308, -1, 0, 10**30, 7e19, "x", "", None, [], {}, True, [1e308],
                           {"a": -1}]


def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(obj, dict):
        for key, v in obj.items():
            yield (*path, key)
            yield from _leaves(v, (*path, key))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):  # long sample columns: their first items are enough
            yield (*path, i)
            yield from _leaves(v, (*path, i))


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def resigned_mutant(pristine: bytes, k: int) -> tuple[bytes, str]:
    """Record-level mutant k, re-hashed and re-signed with the bundle's key so it passes the chain."""

    rng = random.Random(10_000 + k)
    recs = [json.loads(x) for x in pristine.splitlines()]
    edits = []
    for _ in range(rng.randint(1, 3)):
        r = rng.randrange(len(recs))
        leaves = [q for q in _leaves(recs[r]["body"])]
        if not leaves:
            continue
        where = rng.choice(leaves)
        value = rng.choice(WEIRD_VALUES)
        _set(recs[r]["body"], where, value)
        edits.append(f"record {r} body{''.join(f'[{q!r}]' for q in where)} = {value!r}")
    out = resign(recs, AUDIT_KEY)
    return b"".join(canonical(x) + b"\n" for x in out), "; ".join(edits)


@pytest.fixture(scope="module")
def pristine_bundle(tmp_path_factory: pytest.TempPathFactory) -> bytes:

    return make_bundle(DATA, tmp_path_factory.mktemp("b") / "bundle.jsonl", AUDIT_KEY).read_bytes()


def _audit_calls(p: Path) -> list[tuple[str, Callable[[], Any]]]:

    pub = AUDIT_KEY.public_key()
    return [
        ("audit_bundle", lambda: audit_bundle(p, pub, not_before=1.0)),
        ("audit_chain", lambda: audit_chain(p, None, True)),
    ]


def test_audit_over_mutated_bundles(pristine_bundle: bytes, tmp_path: Path) -> None:

    assert audit_bundle(_write(tmp_path / "ok.jsonl", pristine_bundle), AUDIT_KEY.public_key()).ok
    failures: list[str] = []
    passed: list[str] = []
    for k in range(BUNDLE_MUTANTS):
        data, ops = mutate(pristine_bundle, k)
        p = _write(tmp_path / f"bytes-{k}.jsonl", data)
        run_case(f"bundle byte mutant {k} ({ops})", _audit_calls(p), failures)
        if data != pristine_bundle and _ok(p):
            passed.append(f"byte mutant {k} ({ops})")
        data, edits = resigned_mutant(pristine_bundle, k)
        p = _write(tmp_path / f"records-{k}.jsonl", data)
        run_case(f"bundle record mutant {k} ({edits})", _audit_calls(p), failures)
    assert not failures, f"{len(failures)} fault(s):\n\n" + "\n\n".join(failures[:20])
    # A byte changed in a signed bundle is a tamper: none may pass a pinned-key audit.
    assert not passed, "tampered bundles passed audit: " + "; ".join(passed)


def _write(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


def _ok(p: Path) -> bool:

    try:
        return audit_bundle(p, AUDIT_KEY.public_key()).ok
    except PhasescopeError:
        return False


# ---- the real command line: no signal, no traceback, one error line ---------------------------------

CLI_SEEDS = ("spar", "recording", "h100-csv", "sensorguard", "dcgm-exporter-prom/")  # prefixes of seed names
CLI_MUTANTS = (3,)  # _numbers first: huge, negative, NaN readings are what most likely reach the model


def _cli(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "phasescope", *args],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def test_the_cli_over_mutants_never_dies_on_a_signal(
    seeds: list[Seed], pristine_bundle: bytes, tmp_path: Path
) -> None:
    runs: list[tuple[str, list[str]]] = []
    for seed in [s for s in seeds if s.name.startswith(CLI_SEEDS)][:5]:
        for k in CLI_MUTANTS:
            p, ops = write_mutant(tmp_path / f"{seed.name.replace('/', '_')}-{k}", seed, k)
            runs.append((f"classify seed {seed.name!r} mutant {k} ({ops})", ["classify", str(p)]))
    for k in (0,):  # byte flips
        p = _write(tmp_path / f"bundle-{k}.jsonl", mutate(pristine_bundle, k)[0])
        runs.append((f"audit byte mutant {k}", ["audit", str(p), "--trust-bundle-key"]))
    p = _write(tmp_path / "bundle-r.jsonl", resigned_mutant(pristine_bundle, 1)[0])
    runs.append(("audit record mutant 1", ["audit", str(p), "--trust-bundle-key"]))

    failures: list[str] = []
    for batch in range(0, len(runs), 2):  # two at a time: the machine has two cores
        procs = [(label, _cli(args)) for label, args in runs[batch : batch + 2]]
        for label, proc in procs:
            try:
                _, err = proc.communicate(timeout=CLI_LIMIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                failures.append(f"{label}: still running after {CLI_LIMIT_S:g} s")
                continue
            lines = [x for x in err.splitlines() if x.strip()]
            # audit lists each problem on its own line before its one FAILED line; classify says one thing
            errors = [x for x in lines if not x.startswith("phasescope: warning")]
            one_error = label.startswith("audit") or len(errors) <= 1
            ours = all(x.startswith("phasescope: ") for x in lines)
            if proc.returncode not in (0, 1, 2) or "Traceback" in err or not one_error or not ours:
                failures.append(f"{label}: exit {proc.returncode}, stderr:\n{err[-2000:]}")
    assert not failures, "\n\n".join(failures)


LONG_RUN = b"9" * 20_000  # Python's backtracking re was quadratic on a digit run that fails: 43 s for this
LONG_RUN_LIMIT_S = 3.0  # linear parsing takes milliseconds


def test_a_long_digit_run_is_read_in_linear_time(seeds: list[Seed], tmp_path: Path) -> None:
    """Each text seed with its first number replaced by a 20000-digit run and a letter: an answer or one
    line within the case limit, never a regex grinding for minutes."""
    failures: list[str] = []
    for i, seed in enumerate(s for s in seeds if not s.data.startswith(b"PAR1")):
        m = _NUMBER.search(seed.data, seed.data.find(b"\n") + 1)  # past the header: a value
        if m is None:
            continue
        d = tmp_path / str(i)
        d.mkdir()
        p = d / seed.fname
        p.write_bytes(seed.data[: m.start()] + LONG_RUN + b"x" + seed.data[m.end() :])
        for name, content in seed.siblings.items():
            (d / name).write_bytes(content)
        run_case(
            f"seed {seed.name!r} with a long digit run",
            [("read(auto)", lambda p=p: read(p))],
            failures,
            LONG_RUN_LIMIT_S,
        )
    assert not failures, "\n\n".join(failures)
