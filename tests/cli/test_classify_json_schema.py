"""docs/FORMATS.md's `classify --json` field list is the output's: a field added or dropped fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from phasescope.cli.classify import command as classify
from tests.live_helpers import TRAINING_RUN

DOC = Path(__file__).resolve().parents[2] / "docs" / "FORMATS.md"


def _paragraph() -> str:
    text = DOC.read_text()
    para = text[text.index("**`phasescope classify PATH... --json`**") :]
    return para[: para.index("\n\n")]


def _braced(para: str, name: str) -> set[str]:
    m = re.search(rf"`{name}` \(`\[\{{([^}}]*)\}}\]`", para)
    assert m is not None, f"{name}'s fields are not listed"
    return {f.strip() for f in m.group(1).split(",")}


def test_the_documented_fields_are_the_output(shared_data: Path) -> None:
    result = CliRunner().invoke(classify, ["--json", str(shared_data / TRAINING_RUN)])
    assert result.exit_code == 0, result.output
    para = _paragraph()
    named = set(re.findall(r"`([a-z_]+)`", para))
    segment, window = _braced(para, "segments"), _braced(para, "windows")
    lines = result.output.splitlines()
    assert lines
    for line in lines:
        out = json.loads(line)
        assert set(out) <= named, f"undocumented: {set(out) - named}"
        for s in out["segments"]:
            assert set(s) - {"held", "held_by"} == segment
        for w in out["windows"]:
            assert set(w) - {"reason"} == window
        # every top-level field the paragraph names is there (thresholds only when set)
        top = {"path", "device", "device_name", "gpu_index", "format", "label", "confidence", "probabilities",
               "missing_signals", "model_version", "unknown_reasons", "held", "held_by", "segments",
               "windows", "kpis"}
        assert set(out) == top and top | {"thresholds"} <= named
