"""What the training-started alarm adds to the live path: per device per alarm update, and to `warm_up`.

Real SensorGuard recordings (2 GPUs each, 1 Hz) from ../shared/data are replayed tick by tick through a
`LiveState` and a `LiveClassifier` twice in the same process, alternating, with the onset alarm off and on
(`every_s` 5 s, the alarm's own stride 5 s). The alarm's cost is the difference, divided by the alarm
updates it ran; the window classifier's own cost per run is printed beside it for scale. `warm_up` is timed
on freshly loaded model files (boosters not yet parsed), LightGBM already imported, with and without the
alarm model.

    .venv/bin/python benchmarks/bench_live_alarm.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.live_helpers

from tests.live_helpers import ticks  # noqa: E402

from phasescope.classify import onset  # noqa: E402
from phasescope.classify.model import PhaseModel  # noqa: E402
from phasescope.live.classify import LiveClassifier  # noqa: E402
from phasescope.live.state import LiveState  # noqa: E402
from phasescope.schema import TickBatch, Trace  # noqa: E402
from phasescope.sources.replay import read  # noqa: E402

RUNS = (
    "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv",
    "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r01/nvml.csv",
)


def replay(batches: list[TickBatch], lc: LiveClassifier) -> float:
    state = LiveState("bench")
    t0 = time.perf_counter()
    for b in batches:
        state.ingest(b)
        lc.update(state)
    return time.perf_counter() - t0


def warm_up_seconds(alarm: bool) -> float:
    lc = LiveClassifier(PhaseModel.load(), alarm=alarm, alarm_model=onset.load_alarm_model())
    t0 = time.perf_counter()
    lc.warm_up()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = os.environ.get("PHASESCOPE_SHARED_DATA", str(REPO.parent / "shared/data"))
    ap.add_argument("--data", default=default_data)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    traces: list[list[Trace]] = [read(Path(args.data) / r) for r in RUNS]
    batches = [list(ticks(t)) for t in traces]
    model, alarm_model = PhaseModel.load(), onset.load_alarm_model()
    LiveClassifier(model, alarm_model=alarm_model).warm_up()  # parse once, outside the timings

    off_s: list[float] = []
    on_s: list[float] = []
    total_runs = total_alarm = 0  # the same every repeat: counted on the last
    for _ in range(args.repeats):
        off = on = 0.0
        total_runs = total_alarm = 0
        for bs in batches:
            lc_off = LiveClassifier(model, alarm=False)
            off += replay(bs, lc_off)
            lc_on = LiveClassifier(model, alarm_model=alarm_model)
            on += replay(bs, lc_on)
            total_runs += lc_off.runs
            total_alarm += lc_on.alarm_runs
        off_s.append(off)
        on_s.append(on)
    off_med, on_med = statistics.median(off_s), statistics.median(on_s)
    ticks_n = sum(len(bs) for bs in batches)
    per_alarm_ms = (on_med - off_med) / total_alarm * 1e3
    per_run_ms = off_med / total_runs * 1e3
    print(f"replayed {len(RUNS)} recordings, {ticks_n} ticks x 2 GPUs, {args.repeats} repeats (median)")
    print(f"alarm off: {off_med:.3f} s for {total_runs} classifier runs ({per_run_ms:.2f} ms per device run)")
    print(f"alarm on:  {on_med:.3f} s (+{(on_med / off_med - 1) * 100:.0f} %), {total_alarm} alarm updates")
    print(f"added per device per alarm update (every 5 s of data): {per_alarm_ms:.2f} ms")
    per_s = per_alarm_ms / 5.0
    print(f"  -> {per_s:.3f} ms of CPU per second per GPU; 8 GPUs: {8 * per_s:.2f} ms/s")

    w_off, w_on = [], []
    for _ in range(args.repeats):
        w_off.append(warm_up_seconds(False))
        w_on.append(warm_up_seconds(True))
    print(f"warm_up (fresh model files, LightGBM imported): alarm off {statistics.median(w_off):.3f} s, "
          f"alarm on {statistics.median(w_on):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
