"""Does the agent's live phase agree with `fleet`'s verdict on the same samples? (issue 20, "one verdict")

Replays a recording through the live path (the replay live source at full speed, on a stepped clock, through
`TickLoop` with the `LiveClassifier` annotating every tick) and through the offline verdict
(`classify.verdict.build`, what `fleet` and `classify` use), then compares the two phase calls second by
second per device: the live phase at second t is the reading after the last tick at or before t, the
offline one is the verdict segment holding t. Prints per device the seconds they disagree on and the share,
over the seconds the verdict calls and after warm-up (from two full windows and a run on), and the longest
run of settled seconds they disagree on (the live path's lag bound limits it: docs/design/live-classifier.md).

    .venv/bin/python benchmarks/bench_agreement.py [PATH ...]

With no path: the 8x H100 training trace, an inference run and an idle run of ../shared/data.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phasescope.classify import verdict
from phasescope.classify.model import PhaseModel
from phasescope.live.classify import LiveClassifier
from phasescope.live.loop import TickLoop
from phasescope.live.state import LiveState
from phasescope.schema import Trace
from phasescope.sources.replay import read
from phasescope.sources.replay_live import ReplaySource

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DEFAULT_PATHS = [
    "nvidia-smi-h100-training/power-trace_2025-07-27-00-22-27.csv",
    "sensorguard-rtx3090/20260825_infer_bert_verifier-gpu0_s0_r01/nvml.csv",
    "sensorguard-rtx3090/20260825_idle_verifier-gpu0_s2_r03/nvml.csv",
]


@dataclass(frozen=True)
class Agreement:
    """How one device's live phase and offline verdict compare, second by second."""

    device: str
    seconds: int  # whole seconds compared
    disagree: int
    settled_seconds: int  # seconds from `settled_from` on
    settled_disagree: int
    longest: int  # the longest run of settled seconds that disagree (what the lag bound limits)
    live_other: int  # seconds the live path called "other" (the symptom)
    offline_label: str

    @property
    def share(self) -> float:
        return self.disagree / self.seconds if self.seconds else math.nan

    @property
    def settled_share(self) -> float:
        return self.settled_disagree / self.settled_seconds if self.settled_seconds else math.nan


class _SteppedClock:
    """A monotonic clock the replay moves one recorded interval per tick: full speed, no sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_live(
    traces: list[Trace], classifier: LiveClassifier
) -> tuple[dict[str, tuple[np.ndarray, list[str]]], float]:
    """Play `traces` through the tick loop; per device uuid the tick times and the live phase after each,
    and the CPU seconds the classifier's updates took."""
    clock = _SteppedClock()
    source = ReplaySource(traces, speed=1.0, clock=clock, wall_clock=lambda: 0.0)
    t0 = source.t0
    dt = source.native_interval_s
    state = LiveState("replay", capacity=classifier.ring_ticks(dt))
    cpu = [0.0]

    def annotate(s: LiveState) -> None:
        t = time.process_time()
        classifier.update(s)
        cpu[0] += time.process_time() - t

    loop = TickLoop(source, dt, state, annotate=annotate)
    calls: dict[str, tuple[list[float], list[str]]] = {d.uuid: ([], []) for d in source.devices()}
    while not loop.exhausted:
        batch = source.read()
        batch.time += t0  # wall clock 0: the recorded offset; + t0 puts it on the file's clock
        loop.on_tick(batch)
        if loop.exhausted:
            break
        for uuid, (times, phases) in calls.items():
            r = classifier.reading(uuid)
            times.append(batch.time)
            phases.append(r.phase if r else "unknown")
        clock.now += dt
    return {u: (np.asarray(t), p) for u, (t, p) in calls.items()}, cpu[0]


def offline_phase_at(v_segments: list, seconds: np.ndarray) -> list[str]:
    """The verdict segment's label at each second ("unknown" outside every segment)."""
    out = []
    for t in seconds.tolist():
        lab = "unknown"
        for s in v_segments:
            if s.start <= t <= s.end:
                lab = s.label
                break
        out.append(lab)
    return out


def _longest_run(mask: np.ndarray) -> int:
    """The longest stretch of consecutive True values."""
    best = run = 0
    for m in mask.tolist():
        run = run + 1 if m else 0
        best = max(best, run)
    return best


def compare(
    traces: list[Trace], model: PhaseModel, classifier: LiveClassifier, settle_s: float
) -> tuple[list[Agreement], float]:
    """Per device how the two calls compare, and the live classifier's CPU seconds."""
    live, cpu = replay_live(traces, classifier)
    out = []
    for trace, uuid in zip(traces, live, strict=True):
        v = verdict.build(trace, model, evidence=False)
        times, phases = live[uuid]
        # The seconds the verdict calls: its segments' span (past the last full window it says nothing).
        start = float(trace.time[0])
        lo = v.segments[0].start if v.segments else start
        hi = v.segments[-1].end if v.segments else start
        seconds = np.arange(math.ceil(lo), math.floor(hi) + 1, dtype=np.float64)
        idx = np.searchsorted(times, seconds, side="right") - 1
        live_at = [phases[i] if i >= 0 else "unknown" for i in idx.tolist()]
        off_at = offline_phase_at(v.segments, seconds)
        differ = np.array([a != b for a, b in zip(live_at, off_at, strict=True)], dtype=bool)
        settled = seconds >= start + settle_s
        out.append(Agreement(
            device=trace.device.label(),
            seconds=int(seconds.size),
            disagree=int(differ.sum()),
            settled_seconds=int(settled.sum()),
            settled_disagree=int((differ & settled).sum()),
            longest=_longest_run(differ & settled),
            live_other=sum(p == "other" for p in live_at),
            offline_label=v.label,
        ))
    return out, cpu


def warm_up_s(model: PhaseModel, classifier: LiveClassifier) -> float:
    """Data seconds before the live path decodes full windows: two windows' worth (a window and a stride)
    from the first sample, found at the next run."""
    return model.config.window_s + model.config.stride_s + classifier.every_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="recordings (default: three of ../shared/data)")
    ap.add_argument("--settle", type=float, default=None,
                    help="seconds from a device's first sample before 'settled' counts "
                         "(default: the live classifier's warm-up bound)")
    args = ap.parse_args(argv)
    paths = args.paths or [str(DATA / p) for p in DEFAULT_PATHS]
    model = PhaseModel.load()
    model.warm_up()
    for path in paths:
        traces = read(path)
        classifier = LiveClassifier(model, alarm=False)
        settle = args.settle if args.settle is not None else warm_up_s(model, classifier)
        print(f"{Path(path).parent.name}/{Path(path).name}: {len(traces)} device(s), "
              f"settled from {settle:g} s after the first sample")
        print(f"  {'device':<40} {'s':>5} {'disagree':>8} {'share':>7} {'settled':>8} {'share':>7} "
              f"{'longest':>7} {'live other':>10} offline")
        rows, cpu = compare(traces, model, classifier, settle)
        for a in rows:
            print(f"  {a.device[:40]:<40} {a.seconds:>5} {a.disagree:>8} {a.share:>7.1%} "
                  f"{a.settled_disagree:>8} {a.settled_share:>7.1%} {a.longest:>7} {a.live_other:>10} "
                  f"{a.offline_label}")
        span = max(float(t.time[-1] - t.time[0]) for t in traces)
        per = 1000 * cpu / len(traces) / span
        print(f"  live classifier CPU: {cpu:.2f} s, {per:.2f} ms per GPU per data second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
