"""The live classifier's span follows the data's current spacing when the rate changes mid-session."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify.model import PhaseModel, WindowPredictions
from phasescope.features import Floors
from phasescope.live.classify import LiveClassifier
from phasescope.live.state import LiveState
from phasescope.schema import Trace
from tests.live_helpers import ticks, training_traces


def test_a_stream_that_turns_coarse_mid_session_is_read_at_its_new_spacing(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real 1 Hz training run for 300 s, then every 10th row (a recording or sampler going to 0.1 Hz).
    # The span came from the median spacing of the whole 300-tick ring, still 1 s for 1,500 s after the
    # change: each run read 60 s = 6 samples, under the 8 a window needs, and the badge sat held.
    cut = 300
    traces = [t.take(np.concatenate([np.arange(cut), np.arange(cut, len(t), 10)]))
              for t in training_traces(shared_data)]
    lc = LiveClassifier(PhaseModel.load(), alarm=False)
    judged: list[tuple[float, int]] = []
    predict = lc._predict_batched

    def spy(asked: Sequence[tuple[Trace, Floors, bool]]) -> list[WindowPredictions]:
        judged.extend((float(trace.time[-1]), len(trace)) for trace, _, _ in asked)
        return predict(asked)

    monkeypatch.setattr(lc, "_predict_batched", spy)
    state = LiveState("replay", 300)  # `top`'s default ring
    for batch in ticks(traces):
        state.ingest(batch)
        lc.update(state)
    settled = float(traces[0].time[cut]) + 8 * 10.0  # 9 coarse samples in: the newest spacing is 10 s
    after = [n for t, n in judged if t >= settled]
    assert after and min(after) >= 8, after
