from __future__ import annotations

import pytest

from phasescope.errors import InputError
from phasescope.verify.claims import parse_claim


def test_phase_claims_forbid_the_right_phases() -> None:
    assert parse_claim("no-training").forbidden == {"training"}
    assert parse_claim("Inference").forbidden == {"training", "other"}
    assert parse_claim("idle").forbidden == {"training", "inference", "other"}
    assert parse_claim("training").forbidden == {"inference", "other"}
    assert parse_claim("inference").excludes_training and not parse_claim("training").excludes_training


def test_flop_budget() -> None:
    c = parse_claim("max-flop=1e21")
    assert c.kind == "max-flop" and c.max_flop == 1e21 and not c.forbidden


@pytest.mark.parametrize("text", ["", "serving", "max-flop=lots", "max-flop=-1", "max-flop=inf"])
def test_bad_claims_are_one_clear_line(text: str) -> None:
    with pytest.raises(InputError) as e:
        parse_claim(text)
    msg = str(e.value)
    assert msg.startswith("--declare: ") and "expected" in msg and "\n" not in msg
