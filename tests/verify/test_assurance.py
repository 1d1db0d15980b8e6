from __future__ import annotations

import pytest

from phasescope.verify import assurance
from phasescope.verify.claims import parse_claim
from phasescope.verify.coverage import Coverage
from phasescope.verify.flops import FlopEstimate

COV = Coverage(0.0, 100.0, 100, 1.0, 0, 0.0, 0.0, 1.0, ["pcie_tx"], 6, 6)
FLOP = FlopEstimate(1.0, 0.0, 2.0, "gpu_util", 100.0, "gpu_util only")


def test_quotes_the_measured_figures_for_the_same_model_version(monkeypatch: pytest.MonkeyPatch) -> None:
    block = {"evasion": {"device_runs": 11, "flagged": 10}, "non_training": {"device_runs": 50, "flagged": 2}}
    monkeypatch.setattr(
        assurance, "measured", lambda: {"model_version": "1.2", "split_run": block, "split_family": block}
    )
    text = assurance.assurance_text(parse_claim("no-training"), COV, "1.2", FLOP)
    assert "not authenticated" in text and "10/11 (91%)" in text and "2/50 (4%)" in text
    assert "missing signals: pcie_tx" in text and "6/6 windows judged" in text
    other = assurance.assurance_text(parse_claim("no-training"), COV, "2.0", FLOP)
    assert "have not been measured" in other and "10/11" not in other


def test_flop_claims_say_how_the_band_was_made() -> None:
    text = assurance.assurance_text(parse_claim("max-flop=1e20"), COV, "1.2", FLOP)
    assert "bounded from telemetry, not counted: gpu_util only" in text


def test_shipped_figures_match_the_shipped_model() -> None:
    from phasescope.classify.model import PhaseModel

    m = assurance.measured()
    assert m, "measured.json missing: run python -m phasescope.verify.evaluate ../shared/data --write"
    assert m["model_version"] == PhaseModel.load().version
    assert m["split_run"]["evasion"]["device_runs"] == 11  # every evasion trace in labels.csv was judged
