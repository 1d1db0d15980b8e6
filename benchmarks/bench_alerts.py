"""Time-to-detect and false alerts per GPU-hour of the "training started" alarm, on the labelled real data.

    .venv/bin/python benchmarks/bench_alerts.py [--data ../shared/data] [--k 4] [--stride 5] [--json FILE]

Window probabilities are out-of-fold (models fitted on run-grouped folds without the run they predict).
The alarm's threshold and drift are chosen by nested CV (inside each outer fold, on the other folds'
out-of-fold predictions); the a-priori default parameters are scored on the same predictions beside them.
See `phasescope.classify.lab.alert_eval` for the definitions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from phasescope.classify import decide, onset
from phasescope.classify.lab import alert_eval, onset_fit, train
from phasescope.classify.lab.dataset import Example, load_examples
from phasescope.cli.classify import with_windows
from phasescope.schema import Trace

REPO = Path(__file__).resolve().parents[1]


def report(title: str, s: alert_eval.AlarmScore) -> dict[str, Any]:
    out: dict[str, Any] = {"title": title}
    det, n = s.detected(True)
    out["median_delay_s"] = s.median_delay(True)
    out["detected"] = [det, n]
    d = s.delays(True)
    out["delays_s"] = sorted(float(x) for x in d)
    det_u, n_u = s.detected(False)
    out["median_first_alert_unknown_start_s"] = s.median_delay(False)
    out["detected_unknown_start"] = [det_u, n_u]
    by_source: dict[str, list[float]] = {}
    for o in s.outcomes:
        if o.case.onset is not None and o.case.onset_known:
            by_source.setdefault(o.case.family, []).append(o.delay_s)
    out["delay_by_family_s"] = {k: sorted(v) for k, v in sorted(by_source.items())}
    first = s.first_called_delay()
    out["model_first_training_window_median_s"] = float(np.median(first)) if first.size else float("nan")
    false: dict[str, Any] = {}
    labels = sorted({o.case.label if o.case.onset is None else "pre-start" for o in s.outcomes})
    for lab in labels:
        k, h, j = s.false_alerts(label=lab)
        false[lab] = {"false_alerts": k, "gpu_hours": round(h, 3), "judged_gpu_hours": round(j, 3)}
    n_all, h_all, j_all = s.false_alerts()
    false["all"] = {"false_alerts": n_all, "gpu_hours": round(h_all, 3), "judged_gpu_hours": round(j_all, 3),
                    "per_judged_gpu_hour": n_all / j_all if j_all else float("nan")}
    out["false"] = false
    out["false_cases"] = sorted({f"{o.case.family}:{o.case.run}" for o in s.outcomes if o.false_alerts})

    print(f"\n== {title}")
    print(f"training runs with a recorded start: detected {det}/{n}, median time to alert "
          f"{out['median_delay_s']:.1f} s (misses count as never)")
    print(f"  delays (s): {_delays(out['delays_s'])}")
    for fam, ds in out["delay_by_family_s"].items():
        print(f"  {fam:24s} {_delays(ds)}")
    print(f"training traces without a recorded start (delay from their first sample): "
          f"detected {det_u}/{n_u}, median {out['median_first_alert_unknown_start_s']:.1f} s")
    print(f"model latency: the first window called training (p >= 0.5) ends a median "
          f"{out['model_first_training_window_median_s']:.1f} s after the start")
    print("false alerts on non-training telemetry (judged = inside windows the model did not call unknown):")
    for lab, v in false.items():
        rate = f", {v['per_judged_gpu_hour']:.3f} per judged GPU-hour" if "per_judged_gpu_hour" in v else ""
        print(f"  {lab:12s} {v['false_alerts']:4d} in {v['gpu_hours']:9.2f} GPU-hours watched, "
              f"{v['judged_gpu_hours']:7.2f} judged{rate}")
    if out["false_cases"]:
        print(f"  where: {', '.join(out['false_cases'][:12])}")
    return out


def _delays(ds: Sequence[float]) -> str:
    return ", ".join("never" if not np.isfinite(x) else f"{x:.0f}" for x in ds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--k", type=int, default=4, help="outer folds (the inner CV uses the other k-1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stride", type=float, default=5.0, help="seconds between alarm windows (a priori: 5)")
    ap.add_argument("--window", type=float, default=None,
                    help="window seconds of the alarm's model (default: the shipped 30 s); "
                         "the model is refitted with this window and a stride of half of it")
    ap.add_argument("--onset", action="store_true",
                    help="use the onset model (classify/onset.py: 15 s windows, fitted on what the alarm "
                         "watches, windows straddling a run's start labelled by their share of training)")
    ap.add_argument("--preroll-all", action="store_true",
                    help="watch non-training spans with their pre-roll too (marker bursts, settling), "
                         "as training runs are: false alerts on a workload's start-up count")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    examples: list[Example] = load_examples(args.data)
    cases = alert_eval.build_cases(args.data, preroll_all=args.preroll_all)
    n_known = sum(c.onset is not None and c.onset_known for c in cases)
    print(f"{len(examples)} labelled examples, {len(cases)} alarm cases "
          f"({n_known} training runs with a recorded start)", flush=True)
    config = train.WindowConfig()
    if args.window is not None:
        config = train.WindowConfig(window_s=args.window, stride_s=args.window / 2)
    subsets = onset_fit.needed_subsets([c.trace for c in cases])
    onset_table: onset_fit.OnsetTable | None = None
    table: train.WindowTable
    if args.onset:
        config = onset.onset_config()
        table = onset_table = onset_fit.build_onset_table(cases)  # one stand-in example per alarm case
        print(f"onset table: {table.y.size} windows in {table.seconds:.1f} s", flush=True)
    else:
        table = train.build_table(examples, config)
    index = {id(e): i for i, e in enumerate(table.examples)}

    def fit(exs: Sequence[Example]) -> Any:
        if args.onset:  # the fold's runs, through their alarm cases
            return onset_fit.fit_onset(table, {e.run for e in exs}, subsets)
        return train.fit_model(table, np.array([index[id(e)] for e in exs], dtype=np.int64), subsets=subsets,
                               config=config)

    def predict_whole(model: Any, trace: Trace) -> Any:  # the watched trace alone (no case context)
        return with_windows(model, None, args.stride).predict_trace(trace, evidence=False)

    predict: alert_eval.Predictor = predict_whole
    if onset_table is not None:
        if args.stride != onset.ONSET_STRIDE_S:
            ap.error(f"--onset replays the live alarm, which runs every {onset.ONSET_STRIDE_S:g} s")
        # Each window as the live alarm judges it: on the trailing history at its tick, the case's context
        # included (onset_fit.case_windows; the table the folds fit on holds the same windows).
        predict = onset_fit.case_predictor(cases, onset_table)

    base = decide.AlarmParams(window_s=config.window_s)
    nested = alert_eval.nested_alarm_cv(examples, cases, fit, predict, base, k=args.k, seed=args.seed,
                                        progress=lambda m: print(m, flush=True))
    results = {
        "command": "benchmarks/bench_alerts.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "stride_s": args.stride,
        "window_s": config.window_s,
        "onset_model": bool(args.onset),
        "preroll_all": bool(args.preroll_all),
        "k": args.k,
        "chosen": [{"fold": f, **p.to_dict()} for f, p in nested.chosen],
        "nested": report("alarm parameters chosen by nested CV", nested.outer),
        "a_priori": report(f"a-priori default parameters {base.to_dict()}",
                           alert_eval.score(nested.predicted, base)),
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    print(f"\nchosen per outer fold: {[(f, p.threshold, p.drift) for f, p in nested.chosen]}")
    print(f"took {results['seconds']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
