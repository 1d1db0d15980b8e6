"""What a GPU's processes are, from what the host shows: context beside the telemetry's verdict, never it.

A process is recognised by, in this order of trust:
1. its executable or launcher (`argv[0]`'s name, and the subcommand where one tool does several things:
   `vllm serve`, `accelerate launch`, `ollama serve`);
2. the Python module it runs (`python -m vllm.entrypoints.openai.api_server`, `-m torch.distributed.run`)
   or the package its script lives in;
3. the native libraries of a package mapped into it (`/proc/PID/maps`: `site-packages/vllm/_C.abi3.so`).
   Pure-Python packages leave no trace there, so this only ever adds evidence.
The TCP ports it listens on are read too: a serving engine's metrics port is where `auto-scrape` looks.

Everything here is a claim the process makes about itself (a command line is easy to rename), so views show
it as context, and `verify` lists it as unverified. Where the claim and the telemetry disagree (a vLLM server
whose GPU looks like training) that is worth a mark and an alert, never a change of the verdict.
Command lines are read here and never leave: the result names an engine, a role and ports only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

INFERENCE, TRAINING = "inference", "training"


@dataclass(frozen=True)
class Engine:
    """One serving engine or trainer, and how its processes name themselves."""

    name: str  # as users write it
    role: str  # INFERENCE or TRAINING
    launchers: tuple[str, ...] = ()  # argv[0] basename, "name subcommand", or "prefix*" (a process title)
    modules: tuple[str, ...] = ()  # dotted prefixes of `python -m MODULE` or of a script's package path
    packages: tuple[str, ...] = ()  # site-packages folders whose native libraries show in /proc/PID/maps
    metrics_ports: tuple[int, ...] = ()  # where its Prometheus metrics are served by default
    scrape: str | None = None  # its key in sources/scrape/engines.ENGINES, where we read its metrics


# One table. Ports are the engines' documented defaults; a deployment may change them, which is why the
# listening ports are read from the process rather than assumed.
ENGINES: tuple[Engine, ...] = (
    # vLLM V1 and SGLang rename their engine and worker processes (setproctitle): "VLLM::EngineCore".
    Engine("vLLM", INFERENCE, ("vllm serve", "VLLM::*"), ("vllm.entrypoints",), ("vllm",), (8000,), "vllm"),
    Engine("SGLang", INFERENCE, ("sglang::*",), ("sglang.launch_server", "sglang.srt"),
           ("sglang", "sgl_kernel"), (30000,), "sglang"),
    Engine("TGI", INFERENCE, ("text-generation-launcher", "text-generation-server"),
           ("text_generation_server",), ("text_generation_server",), (80, 3000, 9000), "tgi"),
    Engine("Triton", INFERENCE, ("tritonserver",), ("tritonserver",), ("tritonserver",), (8002,), "triton"),
    Engine("TensorRT-LLM", INFERENCE, ("trtllm-serve",),
           ("tensorrt_llm.serve", "tensorrt_llm.commands.serve"), ("tensorrt_llm",), (8000,)),
    Engine("llama.cpp", INFERENCE, ("llama-server",), ("llama_cpp.server",), ("llama_cpp",), (8080,)),
    Engine("Ollama", INFERENCE, ("ollama serve", "ollama runner"), (), (), (11434,)),
    Engine("TorchServe", INFERENCE, ("torchserve",), ("ts.model_service_worker", "org.pytorch.serve"), (),
           (8082,)),
    Engine("Ray Serve", INFERENCE, ("serve run", "serve deploy"), ("ray.serve",), (), (8000,)),
    Engine("torchrun", TRAINING, ("torchrun",), ("torch.distributed.run", "torch.distributed.launch")),
    Engine("DeepSpeed", TRAINING, ("deepspeed",), ("deepspeed.launcher",), ("deepspeed",)),
    Engine("Accelerate", TRAINING, ("accelerate launch",), ("accelerate.commands.launch",)),
    Engine("Megatron", TRAINING, (), ("megatron", "pretrain_gpt", "pretrain_bert", "pretrain_t5"),
           ("megatron",)),
    Engine("Lightning", TRAINING, ("lightning run",), ("lightning.pytorch", "pytorch_lightning")),
    Engine("NeMo", TRAINING, (), ("nemo.collections", "nemo_run", "megatron_gpt_pretraining")),
)

ENGINE_ROLES: dict[str, str] = {e.name: e.role for e in ENGINES}

_PACKAGE_RE = re.compile(rb"/(?:site|dist)-packages/([A-Za-z0-9_]+)/")


@dataclass(frozen=True)
class Evidence:
    """What one process says it is. `how` names the kind of clue, not its text (command lines stay here)."""

    pid: int
    engine: str | None = None  # Engine.name, None where nothing is recognised
    role: str | None = None
    how: str = ""  # "launcher", "module", "library", "parent" (what started it was recognised)
    listening: tuple[int, ...] = ()  # TCP ports it listens on
    scrape: str | None = None

    @property
    def metrics_ports(self) -> tuple[int, ...]:
        """Its listening ports, the engine's default metrics ports first."""
        eng = next((e for e in ENGINES if e.name == self.engine), None)
        default = [p for p in (eng.metrics_ports if eng else ()) if p in self.listening]
        return (*default, *(p for p in self.listening if p not in default))


def recognise(argv: Sequence[str], mapped_packages: Iterable[str] = ()) -> tuple[Engine, str] | None:
    """The engine a command line (and the packages mapped into it) name, and which clue named it."""
    if argv:
        words = [os.path.basename(argv[0]), *argv[1:3]]
        launched = _after_interpreter(argv)
        for eng in ENGINES:
            for launcher in eng.launchers:
                if launcher.endswith("*"):
                    if argv[0].startswith(launcher[:-1]):
                        return eng, "launcher"
                    continue
                parts = launcher.split()
                if parts in (words[: len(parts)], launched[: len(parts)]):
                    return eng, "launcher"
        target = _python_target(argv)
        if target:
            for eng in ENGINES:
                if any(target == m or target.startswith(m + ".") for m in eng.modules):
                    return eng, "module"
    mapped = set(mapped_packages)
    for eng in ENGINES:
        if mapped.intersection(eng.packages):
            return eng, "library"
    return None


def _after_interpreter(argv: Sequence[str]) -> list[str]:
    """`python /usr/bin/torchrun ...` or `uv run vllm serve`: the words after the interpreter's options."""
    for i, word in enumerate(argv[:-1]):
        if os.path.basename(word).startswith(("python", "uv", "pipx")):
            rest = [w for w in argv[i + 1 :] if not w.startswith("-")]
            if rest and rest[0] == "run":
                rest = rest[1:]
            return [os.path.basename(rest[0]), *rest[1:3]] if rest else []
    return []


def _python_target(argv: Sequence[str]) -> str:
    """The module `python -m X` runs, or a script's path as a dotted name (`.../megatron/training.py` ->
    `...megatron.training`) so that module prefixes match scripts inside a package."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return ""
    args = list(argv[1:])
    while args:
        word = args.pop(0)
        if word == "-m" and args:
            return args[0]
        if word.startswith("-m") and len(word) > 2:
            return word[2:]
        if word in ("-c",):
            return ""
        if not word.startswith("-"):
            stem = word[:-3] if word.endswith(".py") else word
            parts = [p for p in stem.replace("\\", "/").split("/") if p not in ("", ".", "..")]
            # the last two path parts: `Megatron-LM/pretrain_gpt.py` -> `pretrain_gpt`, `nemo/x.py` ...
            for k in range(len(parts)):
                dotted = ".".join(parts[k:])
                if any(dotted == m or dotted.startswith(m + ".") for e in ENGINES for m in e.modules):
                    return dotted
            return parts[-1] if parts else ""
    return ""


def mapped_packages(pid: int) -> set[str]:
    """The site-packages folders with a native library mapped into `pid` (empty when unreadable)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            data = fh.read()
    except OSError:
        return set()
    return {m.decode() for m in set(_PACKAGE_RE.findall(data))}


def listening_ports(proc: psutil.Process) -> tuple[int, ...]:
    """The TCP ports `proc` listens on, sorted (empty when not allowed to see them)."""
    try:
        conns = proc.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return ()
    return tuple(sorted({c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}))


PARENTS = 4  # launchers (torchrun, deepspeed, accelerate, a server's front end) sit this close above a worker


def evidence_of(pid: int) -> Evidence:
    """What process `pid` says it is, or failing that what launched it (a torchrun worker's own command line
    is `python -u train.py`); an Evidence with no engine where it is gone, hidden or unknown."""
    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
    except (psutil.Error, OSError):
        return Evidence(pid)
    ports = listening_ports(proc)
    found = recognise(argv, mapped_packages(pid))
    if found is None:
        found = _launched_by(proc)
    if found is None:
        return Evidence(pid, listening=ports)
    eng, how = found
    return Evidence(pid, eng.name, eng.role, how, ports, eng.scrape)


def _launched_by(proc: psutil.Process) -> tuple[Engine, str] | None:
    try:
        parents = proc.parents()[:PARENTS]
    except (psutil.Error, OSError):
        return None
    for parent in parents:
        if parent.pid <= 1:
            break
        try:
            found = recognise(parent.cmdline())
        except (psutil.Error, OSError):
            continue
        if found is not None:
            return found[0], "parent"
    return None


@dataclass
class EvidenceCache:
    """Evidence per process, read once per (pid, start time): a command line does not change, and reading
    maps and sockets every tick for every process would cost more than the rest of a tick. Ports are read
    again after `ports_every_s`, since a server binds its port some time after it starts."""

    ports_every_s: float = 30.0
    _seen: dict[tuple[int, float], tuple[float, Evidence]] = field(default_factory=dict)

    def of(self, pid: int, start_time: float, now: float) -> Evidence:
        key = (pid, start_time)
        hit = self._seen.get(key)
        if hit is not None and now - hit[0] < self.ports_every_s:
            return hit[1]
        ev = evidence_of(pid)
        self._seen[key] = (now, ev)
        return ev

    def forget_except(self, alive: Iterable[tuple[int, float]]) -> None:
        keep = set(alive)
        for key in [k for k in self._seen if k not in keep]:
            del self._seen[key]


def engines_named(evidence: Iterable[Evidence]) -> tuple[str, ...]:
    """The engines and trainers a device's processes name, sorted, once each."""
    return tuple(sorted({e.engine for e in evidence if e.engine}))


def device_role(evidence: Iterable[Evidence]) -> str | None:
    """The role a GPU's processes claim: one role, or None where they claim none or both."""
    roles = {e.role for e in evidence if e.role}
    return roles.pop() if len(roles) == 1 else None


def disagrees(telemetry_phase: str, claimed_role: str | None) -> bool:
    """Whether the telemetry's phase contradicts what the processes claim. Only training against inference
    counts: a serving engine may sit idle, and `other` or `unknown` contradict nothing."""
    return claimed_role is not None and {telemetry_phase, claimed_role} == {TRAINING, INFERENCE}


def claims(pids_by_device: Mapping[str, Iterable[int]]) -> dict[str, dict[str, object]]:
    """Per device, what the processes seen on it say they are, for a report that must not rely on it
    (`verify`): `{engines, role, verified: False}`; devices whose processes claim nothing are left out."""
    out: dict[str, dict[str, object]] = {}
    for uuid, pids in pids_by_device.items():
        evs = [evidence_of(pid) for pid in sorted(set(pids))]
        engines = engines_named(evs)
        if engines:
            out[uuid] = {"engines": list(engines), "role": device_role(evs), "verified": False}
    return out


def engines_table() -> Mapping[str, tuple[str, ...]]:
    """Role -> engine names, for docs and help texts."""
    out: dict[str, list[str]] = {}
    for e in ENGINES:
        out.setdefault(e.role, []).append(e.name)
    return {k: tuple(v) for k, v in out.items()}


__all__ = ["ENGINES", "ENGINE_ROLES", "INFERENCE", "TRAINING", "Engine", "Evidence", "EvidenceCache",
           "claims", "device_role", "disagrees", "engines_named", "engines_table", "evidence_of",
           "listening_ports", "mapped_packages", "recognise"]
