"""How often `verify` catches a false claim, measured on held-out real runs (no run on both sides).

    python -m phasescope.verify.evaluate ../shared/data [--declare no-training] [--split run --split family]

For every fold of `classify.train.folds` (grouped by run: a run's devices never sit on both sides), a model
is fitted on the training side exactly as `phasescope train-model` fits the shipped one, and `verify`'s own
check (`check.check_trace`, whole labelled span, default rules) judges each held-out device trace. A trace
whose label the claim forbids should come out `inconsistent` (for `no-training`: every training run,
including the disguised-training families); any other trace should not. Counts are per device-run
(one labelled device trace) and per run (a run is flagged when any of its devices is).

`--write` stores the figures in `phasescope/verify/measured.json`, which the assurance statement quotes.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from phasescope.classify.lab.train import EVASION_FAMILIES, SUBSETS, build_table, fit_model, folds, load_data
from phasescope.verify.check import check_trace
from phasescope.verify.claims import Claim, parse_claim
from phasescope.verify.ledger import model_digest

OUTCOMES = ("inconsistent", "unverifiable", "consistent")


def _needed_subsets(present: Sequence[frozenset[str]]) -> list[str]:
    """The largest subset each held-out trace will be judged by (as in train.cross_validate)."""
    chosen = set()
    for p in present:
        for name, sig in SUBSETS.items():
            if sig <= p:
                chosen.add(name)
                break
    return [n for n in SUBSETS if n in chosen]


def run_split(table: Any, claim: Claim, split: str, k: int = 5, log: Any = None) -> list[dict[str, Any]]:
    """One row per held-out device trace: its family, label, run and the verdict on `claim`."""
    rows: list[dict[str, Any]] = []
    for name, train, test in folds(table.examples, split, k):
        if train.size == 0 or test.size == 0:
            continue
        model = fit_model(table, train, subsets=_needed_subsets([table.present[i] for i in test]))
        for i in test:
            ex = table.examples[i]
            vs = check_trace(ex.trace, claim, model)
            verdict = vs[0].verdict if vs else "unverifiable"
            rows.append(
                {
                    "fold": name,
                    "family": ex.family,
                    "label": ex.label,
                    "run": ex.run,
                    "source": ex.source,
                    "device": ex.device,
                    "verdict": verdict,
                    "reasons": vs[0].reasons if vs else ["no samples"],
                }
            )
        if log:
            log(f"{split} {name}: {len(train)} train / {len(test)} test")
    return rows


def summarise(rows: Sequence[dict[str, Any]], claim: Claim) -> dict[str, Any]:
    """Per-family counts, and the totals the assurance statement quotes."""
    fam: dict[str, dict[str, Any]] = {}
    for r in rows:
        d = fam.setdefault(
            r["family"],
            {
                "label": r["label"],
                "device_runs": 0,
                "runs": set(),
                "flagged_runs": set(),
                **{o: 0 for o in OUTCOMES},
            },
        )
        d["device_runs"] += 1
        d[r["verdict"]] += 1
        d["runs"].add(r["run"])
        if r["verdict"] == "inconsistent":
            d["flagged_runs"].add(r["run"])
    out_fam = {}
    for f, d in sorted(fam.items()):
        out_fam[f] = {
            "label": d["label"],
            "device_runs": d["device_runs"],
            "runs": len(d["runs"]),
            "flagged_runs": len(d["flagged_runs"]),
            **{o: d[o] for o in OUTCOMES},
        }

    def block(pred: Any) -> dict[str, int]:
        sel = [r for r in rows if pred(r)]
        runs = {r["run"] for r in sel}
        flagged = {r["run"] for r in sel if r["verdict"] == "inconsistent"}
        return {
            "device_runs": len(sel),
            "flagged": sum(r["verdict"] == "inconsistent" for r in sel),
            "unverifiable": sum(r["verdict"] == "unverifiable" for r in sel),
            "runs": len(runs),
            "flagged_runs": len(flagged),
        }

    forbidden = claim.forbidden
    return {
        "families": out_fam,
        "evasion": block(lambda r: r["family"] in EVASION_FAMILIES),
        "forbidden": block(lambda r: r["label"] in forbidden),
        "non_training": block(lambda r: r["label"] not in forbidden and r["family"] != "bystander_idle"),
        "bystanders": block(lambda r: r["family"] == "bystander_idle"),
    }


def lower_bound(k: int, n: int, alpha: float = 0.05) -> float:
    """One-sided Clopper-Pearson lower confidence bound on a rate seen k times in n."""
    if n == 0 or k == 0:
        return 0.0
    from scipy.stats import beta

    return float(beta.ppf(alpha, k, n - k + 1))


def upper_bound(k: int, n: int, alpha: float = 0.05) -> float:
    """One-sided Clopper-Pearson upper confidence bound on a rate seen k times in n."""
    if n == 0 or k == n:
        return 1.0
    from scipy.stats import beta

    return float(beta.ppf(1 - alpha, k + 1, n - k))


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({a / b:.0%})" if b else "-"


def print_summary(split: str, s: dict[str, Any], seconds: float) -> None:
    click.echo(f"\nsplit: {split} (no run on both sides), {seconds:.0f} s")
    click.echo(
        f"{'family':28} {'label':10} {'dev-runs':>8} {'incons.':>8} {'unverif.':>8} {'consist.':>8}"
        f" {'runs flagged':>13}"
    )
    for f, d in s["families"].items():
        click.echo(
            f"{f:28} {d['label']:10} {d['device_runs']:8d} {d['inconsistent']:8d} {d['unverifiable']:8d}"
            f" {d['consistent']:8d} {d['flagged_runs']:>6d}/{d['runs']:<6d}"
        )
    for key, what, wanted in (
        ("evasion", "disguised training found inconsistent", True),
        ("forbidden", "all traces the claim forbids, found inconsistent", True),
        ("non_training", "allowed workload traces wrongly found inconsistent", False),
        ("bystanders", "idle bystander GPUs wrongly found inconsistent", False),
    ):
        b = s[key]
        if not b["device_runs"]:
            continue
        k, n = b["flagged"], b["device_runs"]
        bound = (
            f"95% lower bound {lower_bound(k, n):.2f}"
            if wanted
            else f"95% upper bound {upper_bound(k, n):.3f}"
        )
        click.echo(
            f"{what}: device-runs {_pct(k, n)} ({bound}), runs {_pct(b['flagged_runs'], b['runs'])}, "
            f"unverifiable {b['unverifiable']}"
        )


@click.command()
@click.argument("data", nargs=-1, required=True)
@click.option("--declare", default="no-training", show_default=True)
@click.option(
    "--split",
    "splits",
    multiple=True,
    type=click.Choice(["run", "family"]),
    default=("run", "family"),
    show_default=True,
)
@click.option("--k", default=5, show_default=True, help="Folds for the run split.")
@click.option("--json", "as_json", is_flag=True, help="Every row and figure as JSON.")
@click.option("--write", is_flag=True, help="Store the figures in phasescope/verify/measured.json.")
def main(
    data: tuple[str, ...], declare: str, splits: tuple[str, ...], k: int, as_json: bool, write: bool
) -> None:
    from phasescope.classify.model import PhaseModel

    claim = parse_claim(declare)
    examples = load_data(list(data))
    table = build_table(examples)
    shipped = PhaseModel.load()
    result: dict[str, Any] = {
        "claim": claim.text,
        "model_version": shipped.version,
        # The figures are for models fitted like this one on the folds; the digest names the code's model.
        "shipped_model_digest": model_digest(shipped),
        "command": "python -m phasescope.verify.evaluate " + " ".join(sys.argv[1:]),
    }
    for split in splits:
        t0 = time.perf_counter()
        rows = run_split(table, claim, split, k)
        s = summarise(rows, claim)
        secs = time.perf_counter() - t0
        result[f"split_{split}"] = {**s, "seconds": round(secs, 1), **({"rows": rows} if as_json else {})}
        if not as_json:
            print_summary(split, s, secs)
    if as_json:
        click.echo(json.dumps(result))
    if write:
        if claim.kind != "no-training":
            raise click.UsageError("--write stores the no-training figures only")
        slim = dict(result)
        for sp in splits:
            slim[f"split_{sp}"] = {k3: v3 for k3, v3 in result[f"split_{sp}"].items() if k3 != "rows"}
        out = Path(__file__).with_name("measured.json")
        out.write_text(json.dumps(slim, indent=1) + "\n", encoding="utf-8")
        click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
