"""How the phase model does on our own H200 recordings (data/h200), before and after they join training.

    python benchmarks/eval_h200.py [--shared ../shared/data] [--h200 data/h200]

before: the shipped model (trained on ../shared/data only) on every H200 window.
after:  leave-one-H200-run-out: for each H200 run (a workload, both rates together), a model with the
        shipped recipe is trained on all shared data plus the other H200 runs, then tested on that run.
Unknown answers count as wrong. Windows are the model's own (30 s, stride 15 s).
"""

from __future__ import annotations

import argparse
import os
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from phasescope.classify.lab.train import build_table, fit_model, load_data, predict_rows
from phasescope.classify.model import PhaseModel
from phasescope.schema import PHASES

REPO = Path(__file__).resolve().parents[1]


def _report(title: str, table: object, rows: np.ndarray, labels: np.ndarray) -> None:
    t = table  # WindowTable
    y = t.y[rows]  # type: ignore[attr-defined]
    ok = labels == y
    print(f"\n{title}: {ok.mean():.3f} window accuracy over {rows.size} windows "
          f"({(labels < 0).mean():.3f} unknown)")
    by_rate: dict[str, list[bool]] = defaultdict(list)
    by_family: dict[str, Counter[str]] = defaultdict(Counter)
    for r, lab, good in zip(rows, labels, ok, strict=True):
        ex = t.examples[t.ex[r]]  # type: ignore[attr-defined]
        rate = "10 Hz" if "10hz" in Path(ex.path).parts else "1 Hz"
        by_rate[rate].append(bool(good))
        by_family[f"{ex.family} ({ex.label})"][PHASES[lab] if lab >= 0 else "unknown"] += 1
    for rate, v in sorted(by_rate.items()):
        print(f"  {rate}: {np.mean(v):.3f} over {len(v)} windows")
    for fam, c in sorted(by_family.items()):
        print(f"  {fam:40s} " + ", ".join(f"{k} {n}" for k, n in c.most_common()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_shared = os.environ.get("PHASESCOPE_SHARED_DATA") or str(REPO.parent / "shared" / "data")
    ap.add_argument("--shared", default=default_shared)
    ap.add_argument("--h200", default=str(REPO / "data" / "h200"))
    args = ap.parse_args()
    shared = load_data([args.shared])
    h200 = load_data([args.h200])
    table = build_table(shared + h200)
    n_shared = len(shared)
    h_ids = np.arange(n_shared, n_shared + len(h200))
    h_rows = table.rows(h_ids, [1])
    print(f"H200: {len(h200)} labelled spans, {h_rows.size} windows; shared: {n_shared} spans")

    _, labels, _ = predict_rows(PhaseModel.load(), table, h_rows)
    _report("before (shipped model, never saw H200)", table, h_rows, labels)

    runs = np.array([table.examples[i].run for i in h_ids])
    after = np.full(h_rows.size, -1)
    for run in sorted(set(runs)):
        test_ids = h_ids[runs == run]
        train_ids = np.concatenate([np.arange(n_shared), h_ids[runs != run]])
        model = fit_model(table, train_ids)
        sel = np.isin(table.ex[h_rows], test_ids)
        _, lab, _ = predict_rows(model, table, h_rows[sel])
        after[sel] = lab
    _report("after (other H200 runs in training, leave-one-run-out)", table, h_rows, after)


if __name__ == "__main__":
    main()
