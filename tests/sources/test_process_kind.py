"""Process evidence: engines and trainers named from real command lines, real children and their ports."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from phasescope.sources.process_kind import (
    ENGINES,
    INFERENCE,
    TRAINING,
    Evidence,
    EvidenceCache,
    device_role,
    disagrees,
    evidence_of,
    mapped_packages,
    recognise,
)
from tests.engine_helpers import running_as_vllm

PY = "/usr/bin/python3"
# Command lines as the engines' docs and images start them (model names shortened).
KNOWN: list[tuple[list[str], str, str]] = [
    ([PY, "/usr/local/bin/vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000"], "vLLM", "launcher"),
    (["vllm", "serve", "Qwen/Qwen2.5-7B"], "vLLM", "launcher"),
    ([PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "facebook/opt-125m"], "vLLM", "module"),
    (["VLLM::EngineCore"], "vLLM", "launcher"),
    ([PY, "-m", "sglang.launch_server", "--model-path", "x", "--port", "30000"], "SGLang", "module"),
    (["sglang::scheduler_TP0"], "SGLang", "launcher"),
    (["text-generation-launcher", "--model-id", "bigscience/bloom-560m"], "TGI", "launcher"),
    (["/opt/conda/bin/text-generation-server", "serve", "x", "--uds-path", "/tmp/s"], "TGI", "launcher"),
    (["/opt/tritonserver/bin/tritonserver", "--model-repository=/models"], "Triton", "launcher"),
    (["trtllm-serve", "/models/llama", "--port", "8000"], "TensorRT-LLM", "launcher"),
    (["/app/llama-server", "-m", "model.gguf", "--port", "8080"], "llama.cpp", "launcher"),
    ([PY, "-m", "llama_cpp.server", "--model", "m.gguf"], "llama.cpp", "module"),
    (["/bin/ollama", "serve"], "Ollama", "launcher"),
    (["/usr/bin/ollama", "runner", "--model", "/root/.ollama/blobs/sha256-x"], "Ollama", "launcher"),
    ([PY, "/usr/local/lib/python3.11/site-packages/ts/model_service_worker.py", "--sock-type", "unix"],
     "TorchServe", "module"),
    ([PY, "/usr/local/bin/serve", "run", "app:deployment"], "Ray Serve", "launcher"),
    ([PY, "/usr/local/bin/torchrun", "--nproc_per_node=8", "train.py"], "torchrun", "launcher"),
    ([PY, "-m", "torch.distributed.run", "--nnodes=2", "train.py"], "torchrun", "module"),
    ([PY, "/usr/local/bin/deepspeed", "--num_gpus", "8", "train.py", "--deepspeed", "ds.json"], "DeepSpeed",
     "launcher"),
    ([PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=x"], "DeepSpeed", "module"),
    ([PY, "/usr/local/bin/accelerate", "launch", "train.py"], "Accelerate", "launcher"),
    ([PY, "Megatron-LM/pretrain_gpt.py", "--tensor-model-parallel-size", "2"], "Megatron", "module"),
    ([PY, "examples/nlp/language_modeling/megatron_gpt_pretraining.py"], "NeMo", "module"),
    ([PY, "-m", "lightning.pytorch.cli", "fit"], "Lightning", "module"),
]
UNKNOWN_ARGV = [[PY, "train.py"], ["bash"], [PY, "-c", "import vllm"], ["jupyter-lab"], [], ["serve"],
                [PY, "-m", "vllmx"], ["/usr/bin/ollama", "list"]]


@pytest.mark.parametrize(("argv", "engine", "how"), KNOWN, ids=[e for _, e, _ in KNOWN])
def test_engines_and_trainers_are_named_from_command_lines(argv: list[str], engine: str, how: str) -> None:
    found = recognise(argv)
    assert found is not None and (found[0].name, found[1]) == (engine, how)


@pytest.mark.parametrize("argv", UNKNOWN_ARGV)
def test_anything_else_is_not_claimed(argv: list[str]) -> None:
    assert recognise(argv) is None


def test_the_table_names_every_engine_the_issue_lists_once() -> None:
    names = [e.name for e in ENGINES]
    assert len(names) == len(set(names))
    serving = {"vLLM", "SGLang", "TGI", "Triton", "TensorRT-LLM", "llama.cpp", "Ollama", "TorchServe",
               "Ray Serve"}
    trainers = {"torchrun", "DeepSpeed", "Accelerate", "Megatron", "Lightning", "NeMo"}
    assert {e.name for e in ENGINES if e.role == INFERENCE} == serving
    assert {e.name for e in ENGINES if e.role == TRAINING} == trainers
    assert {e.name for e in ENGINES if e.scrape} == {"vLLM", "TGI", "SGLang", "Triton"}  # we can scrape


def test_a_native_library_of_a_package_names_the_engine() -> None:
    found = recognise([PY, "my_app.py"], {"numpy", "vllm"})
    assert found is not None and (found[0].name, found[1]) == ("vLLM", "library")


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    with running_as_vllm(tmp_path) as running:
        yield running


def test_a_running_server_is_recognised_with_its_port(fake_vllm: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = fake_vllm
    ev = evidence_of(proc.pid)
    assert (ev.engine, ev.role, ev.how, ev.scrape) == ("vLLM", INFERENCE, "module", "vllm")
    assert port in ev.listening and ev.metrics_ports[0] == port
    proc.kill()
    proc.wait()
    gone = evidence_of(proc.pid)  # vanished: no claim, no error
    assert gone == Evidence(proc.pid)


def test_a_worker_is_known_by_its_launcher(tmp_path: Path) -> None:
    """A torchrun worker's own command line is `python -u train.py`: its parent names it."""
    launcher = tmp_path / "torchrun"
    launcher.write_text(f"#!{sys.executable}\nimport subprocess, sys\n"
                        "subprocess.run([sys.executable, '-u', '-c', 'import time; time.sleep(60)'])\n")
    launcher.chmod(0o755)
    proc = subprocess.Popen([str(launcher), "--nproc_per_node=1", "train.py"])
    try:
        deadline = time.monotonic() + 20
        children: list[psutil.Process] = []
        while not children and time.monotonic() < deadline:
            children = psutil.Process(proc.pid).children()
            time.sleep(0.05)
        assert children
        ev = evidence_of(children[0].pid)
        assert (ev.engine, ev.role, ev.how) == ("torchrun", TRAINING, "parent")
    finally:
        for c in psutil.Process(proc.pid).children(recursive=True):
            c.kill()
        proc.kill()
        proc.wait()


def test_the_packages_mapped_into_a_torch_process_are_read() -> None:
    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc")
    code = "import torch, sys; print(1, flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"1"
        assert "torch" in mapped_packages(proc.pid)
        assert recognise([sys.executable, "x.py"], mapped_packages(proc.pid)) is None  # torch serves both
    finally:
        proc.kill()
        proc.wait()
    assert mapped_packages(proc.pid) == set()


def test_the_cache_reads_a_process_once_until_its_ports_are_due(
    fake_vllm: tuple[subprocess.Popen[bytes], int]
) -> None:
    proc, _ = fake_vllm
    cache = EvidenceCache(ports_every_s=30.0)
    start = psutil.Process(proc.pid).create_time()
    first = cache.of(proc.pid, start, now=0.0)
    proc.kill()
    proc.wait()
    assert cache.of(proc.pid, start, now=10.0) is first  # not read again
    assert cache.of(proc.pid, start, now=40.0) == Evidence(proc.pid)  # due: read again, and it is gone
    cache.forget_except([])
    assert cache.of(proc.pid, start, now=41.0) == Evidence(proc.pid)


def test_roles_and_disagreement() -> None:
    vllm = Evidence(1, "vLLM", INFERENCE, "module")
    torchrun = Evidence(2, "torchrun", TRAINING, "launcher")
    plain = Evidence(3)
    assert device_role([vllm, plain]) == INFERENCE
    assert device_role([vllm, torchrun]) is None and device_role([plain]) is None and device_role([]) is None
    assert disagrees("training", INFERENCE) and disagrees("inference", TRAINING)
    for phase in ("idle", "other", "unknown", "inference"):
        assert not disagrees(phase, INFERENCE)  # a server may sit idle; other and unknown contradict nothing
    assert not disagrees("training", None)
