"""The telemetry-only step period (kpi/rhythm.py) against runs whose true period is known.

    python benchmarks/bench_rhythm.py [--shared ../shared/data] [--h200 data/h200]

Two sets, each printed per run (true and estimated period, relative error, the shortest period the trace
could show) and summed up (share of runs where a period was found, median absolute relative error of those):
- h200: our H200 training runs, both rates. Truth: the labelled training span (from the hooks) over the steps
  the hooks counted (the manifest's `info.steps`).
- energy-inference (../shared/data): Hugging Face batched generation loops whose every iteration the run
  logged (start time and runtime, in the results CSVs SOURCES.md names). Not training, but a GPU loop of known
  period: one stretch per prompt (or output length), its warm-up iteration 0 left out, truth = the mean gap
  between iteration starts. The results CSVs carry Unix times and the nvidia-smi logs local ones; the offset
  is the whole number of hours between the first result and the log's start.
The method's constants were fixed in kpi/rhythm.py from their stated reasons before these runs were scored;
none was changed after seeing them.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from phasescope.kpi import rhythm
from phasescope.schema import Trace
from phasescope.sources.replay import read

REPO = Path(__file__).resolve().parents[1]

# nvidia-smi log directory (under stats/e2dc-raw-stats/) -> the results CSV of the same run
# (energy-inference/SOURCES.md, "Runs")
ENERGY_RUNS = {
    "falcon-7b/2024-03-29/11-16-49": "plots/input-test/raw_stats/falcon-7b-palmetto-v100-1.csv",
    "falcon-7b/2024-04-02/07-36-20": "plots/input-test/raw_stats/falcon-7b-argonne-swing-1.csv",
    "falcon-7b/2024-04-03/10-47-35": "plots/input-test/falcon-7b-palmetto-a100-1.csv",
    "falcon-7b/2024-04-03/13-06-04": "plots/output-test/falcon-7b-palmetto-a100-1.csv",
    "falcon-7b/2024-04-04/06-36-33": "stats/falcon-7b-argonne-swing-gpu-large-1.csv",
    "llama2-7b/2024-03-28/11-15-46": "plots/input-test/raw_stats/Llama-2-7b-chat-hf-argonne-swing-1.csv",
    "llama2-7b/2024-03-29/08-43-09": "plots/input-test/raw_stats/Llama-2-7b-chat-hf-palmetto-v100-1.csv",
    "llama2-7b/2024-04-03/10-52-50": "plots/input-test/Llama-2-7b-chat-hf-palmetto-a100-1.csv",
}
MIN_ITERATIONS = 5  # after the warm-up one: at least 4 periods, so MIN_PERIODS (3) fit in the stretch
BACK_TO_BACK = 0.25  # a loop's period is known only where each iteration starts within 25 % of its runtime
# after the last one ended (the output-length sweep runs its lengths in turn: not a loop of one length)


@dataclass
class Row:
    run: str
    true_s: float
    est_s: float | None
    min_period_s: float
    confidence: float | None

    @property
    def rel_error(self) -> float | None:
        return None if self.est_s is None else (self.est_s - self.true_s) / self.true_s

    def line(self) -> str:
        est = "-" if self.est_s is None else f"{self.est_s:.4g}"
        err = "-" if self.rel_error is None else f"{self.rel_error:+.1%}"
        conf = "-" if self.confidence is None else f"{self.confidence:.2f}"
        return (f"  {self.run:58s} true {self.true_s:8.4g} s  est {est:>8s} s  err {err:>7s}  "
                f"conf {conf:>4s}  shortest visible {self.min_period_s:.3g} s")


def _estimate(run: str, trace: Trace, span: tuple[float, float], true_s: float) -> Row:
    k = rhythm.trace_kpis(trace, "training", [span])
    fig = k.get("step_period_s") or {}
    shortest = (k.get("shortest_visible_period_s") or {}).get("value")
    return Row(run, true_s, fig.get("value"), math.nan if shortest is None else shortest,
               fig.get("confidence"))


def h200_rows(root: Path) -> list[Row]:
    rows = []
    with (root / "labels.csv").open() as f:
        for lab in csv.DictReader(f):
            if lab["label"] != "training":
                continue
            path = root / lab["path"]
            steps = json.loads(Path(f"{path}.manifest.json").read_text())["battery"]["info"].get("steps")
            a, b = float(lab["t_from"]), float(lab["t_to"])
            if not steps:
                continue
            trace = read(str(path), "auto")[0]
            rows.append(_estimate(lab["path"], trace, (a, b), (b - a) / steps))
    return rows


def _iterations(results: Path) -> dict[str, list[tuple[float, float]]]:
    """prompt (or output length) -> [(start, runtime)] of its iterations after the warm-up one, in order."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    with results.open() as f:
        for rec in csv.reader(f):
            if len(rec) < 3 or not rec[1].startswith("start-inference-"):
                continue  # the header, tokenizer and model-load rows
            key, it = rec[1][len("start-inference-"):].rsplit("-", 1)
            if int(it) > 0:
                out.setdefault(key, []).append((int(it), float(rec[0]), float(rec[2])))
    return {k: [(s, r) for _, s, r in sorted(v)] for k, v in out.items()}


def _first_result(results: Path) -> float:
    with results.open() as f:
        for rec in csv.reader(f):
            try:
                return float(rec[0])
            except (ValueError, IndexError):
                continue
    return math.nan


def energy_rows(root: Path) -> list[Row]:
    rows = []
    for run, res in ENERGY_RUNS.items():
        results = root / res
        trace = read(str(root / "stats" / "e2dc-raw-stats" / run / "nvidia-smi.csv"), "auto")[0]
        offset = round((_first_result(results) - float(trace.time[0])) / 3600.0) * 3600.0
        for key, its in sorted(_iterations(results).items()):
            gaps_ok = all(b[0] - a[0] - a[1] <= BACK_TO_BACK * a[1] for a, b in itertools.pairwise(its))
            if len(its) < MIN_ITERATIONS or not gaps_ok:
                continue
            starts = [s - offset for s, _ in its]
            true_s = (starts[-1] - starts[0]) / (len(starts) - 1)
            span = (starts[0], starts[-1] + its[-1][1])
            rows.append(_estimate(f"{run} {key}", trace, span, true_s))
    return rows


def summary(name: str, rows: list[Row]) -> None:
    found = [r for r in rows if r.est_s is not None]
    visible = [r for r in rows if r.true_s >= r.min_period_s]
    errs = [abs(r.rel_error) for r in found if r.rel_error is not None]
    med = f"{statistics.median(errs):.1%}" if errs else "-"
    within = sum(e <= 0.1 for e in errs)
    unseeable = sum(r.true_s < r.min_period_s for r in found)
    print(f"{name}: {len(rows)} runs, period found in {len(found)} ({len(found) / max(len(rows), 1):.0%}); "
          f"median |relative error| of those {med}, {within} within 10 %; "
          f"{len(visible)} runs have a true period the trace could show; "
          f"{unseeable} periods reported where the true one was too short to be seen")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_shared = os.environ.get("PHASESCOPE_SHARED_DATA") or str(REPO.parent / "shared" / "data")
    ap.add_argument("--shared", default=default_shared)
    ap.add_argument("--h200", default=str(REPO / "data" / "h200"))
    args = ap.parse_args()
    sets = [("h200 training (true = span / hook-counted steps)", h200_rows(Path(args.h200))),
            ("energy-inference generation loops (true = mean gap between iteration starts)",
             energy_rows(Path(args.shared) / "energy-inference"))]
    for name, rows in sets:
        print(name)
        for r in rows:
            print(r.line())
    print()
    for name, rows in sets:
        summary(name, rows)


if __name__ == "__main__":
    main()
