"""What one `phasescope classify` costs: start-up, time per trace, and peak memory on a long trace.

Every figure comes with a baseline measured in the same run, so that it can be checked on another CPU:
- start-up: `phasescope classify` of one short real trace (a 13-minute 1 Hz SensorGuard run), against
  `python -c pass`, `python -c "import numpy"` and `python -c "import lightgbm"` (what every run paid
  before the numpy tree walk), each the best of `--repeat` fresh processes, taking turns;
- per trace: `classify.verdict.build` on each short real trace, with and without the feature
  contributions (the report's SHAP evidence, which `classify` no longer computes), and the boosters'
  probabilities from LightGBM and from `classify.model.Forest`, in one process, best of `--repeat`;
- peak memory: a real 1 Hz trace tiled to `--days` days, classified in a fresh process chunk by chunk
  (the default) and in one pass (the former way), as peak RSS over the process's RSS before classifying.

    .venv/bin/python benchmarks/bench_classify_startup.py [--data ../shared/data] [--repeat 5] [--days 16]
        [--before DIR]

`--before DIR`: also time `classify` from another source tree (e.g. the previous commit's, unpacked with
`git archive HEAD~1 src | tar -x -C DIR`, then DIR/src is used), in the same turns as the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHORT_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01"
SHORT_RUNS = "sensorguard-rtx3090"  # every run in it: the "70 short files" case
# Byte-code caches on, as in an installed package (the dev shell may turn them off).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def best_process_times(commands: dict[str, list[str]], repeat: int, before: str | None) -> dict[str, float]:
    """Best wall seconds of each command in a fresh process, the commands taking turns each round; a name
    ending in `_before` runs with `before`'s source tree first on the path."""
    best = dict.fromkeys(commands, float("inf"))
    envs = {name: {**ENV, "PYTHONPATH": str(before)} if name.endswith("_before") else ENV
            for name in commands}
    for name, cmd in commands.items():  # warm the byte-code and file caches
        subprocess.run(cmd, env=envs[name], cwd=REPO, capture_output=True, check=True)
    for _ in range(repeat):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, env=envs[name], cwd=REPO, capture_output=True, check=True)
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def best_of(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def per_trace(data: Path, repeat: int) -> dict[str, object]:
    import lightgbm as lgb

    from phasescope.classify import verdict
    from phasescope.classify.model import PhaseModel, _columns
    from phasescope.features import window_features
    from phasescope.sources.replay import read

    model = PhaseModel.load()
    traces = [t for run in sorted((data / SHORT_RUNS).iterdir()) if run.is_dir() for t in read(run)]
    sub = model.submodels[0]
    x = np.concatenate([window_features(t, model.config).values for t in traces])[:, _columns(sub.features)]
    booster = lgb.Booster(model_str=sub.booster_text)
    forest = sub.forest
    t = best_of({
        "verdict": lambda: [verdict.build(tr, model) for tr in traces],
        "verdict_with_evidence": lambda: [verdict.build(tr, model, evidence=True) for tr in traces],
        "lightgbm_predict": lambda: booster.predict(x, num_threads=1),
        "forest_predict": lambda: forest.predict(x),
    }, repeat)
    n = len(traces)
    return {
        "traces": n,
        "samples": sum(len(tr) for tr in traces),
        "windows": int(x.shape[0]),
        "ms_per_trace": round(1e3 * t["verdict"] / n, 2),
        "ms_per_trace_with_evidence": round(1e3 * t["verdict_with_evidence"] / n, 2),
        "evidence_share_of_time": round(1 - t["verdict"] / t["verdict_with_evidence"], 2),
        "booster_us_per_window": {
            "lightgbm": round(1e6 * t["lightgbm_predict"] / x.shape[0], 1),
            "numpy_forest": round(1e6 * t["forest_predict"] / x.shape[0], 1),
        },
    }


_PEAK = """
import json, resource, sys, time
import numpy as np
from phasescope import features
from phasescope.classify import verdict
from phasescope.classify.model import PhaseModel
from phasescope.schema import Trace
from phasescope.sources.replay import read
run, days, chunk = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
base = next(t for t in read(run) if t.device.index == 0)
span = base.time[-1] - base.time[0] + 1.0
reps = int(days * 86400 / span) + 1
tr = Trace(base.device, np.concatenate([base.time + span * k for k in range(reps)]),
           {s: np.tile(v, reps) for s, v in base.columns.items()}, base.meta)
model = PhaseModel.load()  # not warmed up, as `classify` runs it
if chunk:
    features.CHUNK_POINTS = chunk
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
v = verdict.build(tr, model)
print(json.dumps({"samples": len(tr), "windows": len(v.windows), "label": v.label,
                  "seconds": round(time.perf_counter() - t0, 1), "rss_before_mib": round(before),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def peak_memory(data: Path, days: float) -> dict[str, object]:
    out = {}
    for name, chunk in (("chunked", 0), ("one_pass", 1 << 40)):
        r = subprocess.run([sys.executable, "-c", _PEAK, str(data / SHORT_RUN), str(days), str(chunk)],
                           env=ENV, cwd=REPO, capture_output=True, text=True, check=True)
        out[name] = json.loads(r.stdout)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--days", type=float, default=16.0)
    ap.add_argument("--before", default=None, help="another source tree to time `classify` from (DIR/src)")
    args = ap.parse_args()
    data = Path(args.data)
    py = sys.executable
    commands = {
        "python_pass": [py, "-c", "pass"],
        "import_numpy": [py, "-c", "import numpy"],
        "import_lightgbm": [py, "-c", "import lightgbm"],
        "classify_help": [py, "-m", "phasescope", "classify", "--help"],
        "classify_short_trace": [py, "-m", "phasescope", "classify", str(data / SHORT_RUN)],
    }
    before = str(Path(args.before) / "src") if args.before else None
    if before:
        commands["classify_short_trace_before"] = commands["classify_short_trace"]
    start = best_process_times(commands, args.repeat, before)
    now = start["classify_short_trace"]
    out = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "startup_s": {k: round(v, 3) for k, v in start.items()},
        "classify_over_import_numpy": round(now / start["import_numpy"], 1),
        "classify_before_over_now": round(start["classify_short_trace_before"] / now, 1) if before else None,
        "per_trace": per_trace(data, args.repeat),
        "peak_memory": peak_memory(data, args.days),
        "self_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
