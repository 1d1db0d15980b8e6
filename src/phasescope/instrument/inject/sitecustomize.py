"""Injected by `phasescope run`: installs phasescope's PyTorch hooks as soon as the program imports torch.

Nothing is imported here unless PHASESCOPE_EVENTS_DIR is set, and torch is never imported on the program's
behalf: a watcher on sys.meta_path waits for the program's own `import torch`. Any sitecustomize this file
shadows is run afterwards, so the environment's own start-up code still runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


def _install() -> None:
    try:
        from phasescope.instrument import install

        install()
    except Exception as exc:  # never break the user's program
        sys.stderr.write(f"phasescope: hooks not installed: {type(exc).__name__}: {exc}\n")


class _TorchWatcher:
    """Finds nothing itself; on the first `import torch`, wraps the loader to install the hooks after it."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _install()

        loader.exec_module = exec_module
        return spec


def _chain_shadowed_sitecustomize() -> None:
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("PHASESCOPE_EVENTS_DIR"):
    _root = os.environ.get("PHASESCOPE_PKG_ROOT")  # inject.PKG_ROOT_ENV
    if _root and _root not in sys.path:
        sys.path.append(_root)  # last: the program's own modules always win over phasescope's install root
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _TorchWatcher())
try:
    _chain_shadowed_sitecustomize()
except Exception as exc:
    sys.stderr.write(f"phasescope: the environment's own sitecustomize failed: {exc}\n")
