"""A real process under a serving engine's module path, for the process-evidence tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened on {port}")


@contextlib.contextmanager
def running_as_vllm(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A real server under vLLM's module path: `python -m vllm.entrypoints.openai.api_server --port P` runs
    http.server (the real vLLM needs a GPU); the command line and the listening socket are real."""
    pkg = tmp_path / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(textwrap.dedent("""
        import http.server, sys
        port = int(sys.argv[sys.argv.index("--port") + 1])
        http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler).serve_forever()
    """))
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
                             "--port", str(port)], env=env, cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        _wait_listening(port, proc)
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def running_as_launcher(tmp_path: Path, name: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A real server started as an engine's launcher script (`text-generation-launcher --port P`): an
    executable named `name` that serves `tmp_path` over HTTP; its command line and socket are real."""
    script = tmp_path / "bin" / name
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""
        import http.server, sys
        port = int(sys.argv[sys.argv.index("--port") + 1])
        http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler).serve_forever()
    """))
    script.chmod(0o755)
    port = _free_port()
    proc = subprocess.Popen([str(script), "--model-id", "m", "--port", str(port)], cwd=tmp_path,
                            stderr=subprocess.PIPE)
    try:
        _wait_listening(port, proc)
        yield proc, port
    finally:
        proc.kill()
        proc.wait()
