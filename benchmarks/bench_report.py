"""`phasescope report` cost on real logs: wall time (read, classify + energy, render) and file size.

    .venv/bin/python benchmarks/bench_report.py

Each input is read once with the readers, then built and rendered as `phasescope report` does. Times are
one run each, on whatever machine runs this. The model file loads up front; its LightGBM booster is parsed
on first use, so the first input's build time includes that one-off cost.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.conftest import shared_data_dir  # noqa: E402

from phasescope.classify.model import PhaseModel  # noqa: E402
from phasescope.kpi.cost import Prices  # noqa: E402
from phasescope.report import build, render  # noqa: E402
from phasescope.sources.replay import read  # noqa: E402

INPUTS = (
    ("SensorGuard RTX 3090, 2 GPUs, 1 Hz",
     "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"),
    ("nvidia-smi 8x H100, 10 Hz", "nvidia-smi-h100-training/ckpt100.csv"),
    ("Alibaba GenAI pods, 80 containers, 1/min", "alibaba-gentd26/pod_gpu_duty_cycle_anon.csv"),
)


def main() -> None:
    data_dir = shared_data_dir()
    t = time.perf_counter()
    model = PhaseModel.load()
    load_s = time.perf_counter() - t
    print(f"python {platform.python_version()} on {platform.machine()}; model load {load_s:.2f} s")
    head = ("devices", "samples", "read s", "build s", "render s", "MB")
    print(f"{'input':<42} " + " ".join(f"{h:>{w}}" for h, w in zip(head, (7, 9, 7, 8, 9, 6), strict=True)))
    for name, rel in INPUTS:
        path = str(data_dir / rel)
        t0 = time.perf_counter()
        traces = read(path)
        t1 = time.perf_counter()
        data = build([(path, traces)], model=model, prices=Prices(usd_per_gpu_hour=2.5, usd_per_kwh=0.12))
        t2 = time.perf_counter()
        page = render(data)
        t3 = time.perf_counter()
        samples = sum(len(tr) for tr in traces)
        print(f"{name:<42} {len(traces):>7} {samples:>9,} {t1 - t0:>7.2f} {t2 - t1:>8.2f} {t3 - t2:>9.2f} "
              f"{len(page.encode()) / 1e6:>6.1f}")


if __name__ == "__main__":
    main()
