"""PyTorch Lightning callback: installs phasescope's hooks when fitting starts and reports when it ends.

    from phasescope.instrument.adapters.lightning import PhasescopeCallback
    trainer = Trainer(callbacks=[PhasescopeCallback(json_path="phases.json")])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:
    try:
        import pytorch_lightning as pl  # the package's older name
    except ImportError:
        raise ImportError(
            "phasescope.instrument.adapters.lightning needs PyTorch Lightning: pip install lightning"
        ) from None


class PhasescopeCallback(pl.Callback):
    """The hooks are global: this starts them early and writes the summary (optionally JSON) at the end."""

    def __init__(self, json_path: str | Path | None = None) -> None:
        super().__init__()
        self.json_path = Path(json_path) if json_path else None
        self.summary: dict[str, Any] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from phasescope.instrument import install

        install()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from phasescope.instrument import summary

        self.summary = summary()
        if self.json_path is not None:
            self.json_path.write_text(json.dumps(self.summary, indent=1))
