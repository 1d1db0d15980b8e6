"""Hugging Face `TrainerCallback`: installs phasescope's hooks at train start, summarises at train end.

    from phasescope.instrument.adapters.hf import PhasescopeTrainerCallback
    trainer = Trainer(..., callbacks=[PhasescopeTrainerCallback(json_path="phases.json")])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "phasescope.instrument.adapters.hf needs Hugging Face transformers: pip install transformers"
    ) from None


class PhasescopeTrainerCallback(TrainerCallback):
    def __init__(self, json_path: str | Path | None = None) -> None:
        self.json_path = Path(json_path) if json_path else None
        self.summary: dict[str, Any] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from phasescope.instrument import install

        install()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from phasescope.instrument import summary

        self.summary = summary()
        if self.json_path is not None and getattr(state, "is_world_process_zero", True):
            self.json_path.write_text(json.dumps(self.summary, indent=1))
