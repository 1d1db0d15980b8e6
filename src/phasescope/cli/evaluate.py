"""`phasescope eval DATA...`: grouped cross-validation of the phase model (and the paper's method)."""

from __future__ import annotations

import json
import math
from typing import Any

import click

from phasescope.errors import InputError
from phasescope.schema import PHASES


def _f(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def _rows(m: dict[str, Any]) -> list[tuple[str, Any]]:
    w, r = m["window"], m["run"]
    rows: list[tuple[str, Any]] = [
        ("windows (excl. Alibaba)", w["windows"]),
        ("window accuracy", w["accuracy"]),
        ("window balanced accuracy", w["balanced_accuracy"]),
        ("windows called (not unknown)", w["called_fraction"]),
        ("training recall (windows)", w["training_recall"]),
        ("training precision (windows)", w["training_precision"]),
        ("training false-positive rate", w["training_fpr"]),
    ]
    rows += [(f"recall {p} (windows)", w["per_class"][p]["recall"]) for p in PHASES]
    rows += [
        ("confidently wrong (p >= 0.8, windows)", w.get("confidently_wrong")),
        ("calibration error (ECE, windows)", w.get("ece")),
    ]
    rows += [
        ("run accuracy (device-runs)", r["accuracy"]),
        ("run accuracy, workloads only", m["run_workloads_only"]["accuracy"]),
    ]
    rows += [(f"run recall {p}", r["per_class"][p]["recall"]) for p in PHASES]
    ev = m["evasion_detection"]
    rows.append((f"evasion runs detected ({ev['examples']})", ev["detected"]))
    rows += [(f"  {f}", v) for f, v in ev["by_family"].items()]
    if "alibaba" in m:
        a = m["alibaba"]
        rows += [
            ("Alibaba windows called training", a["called_training"]),
            ("Alibaba windows unknown", a["unknown"]),
            ("Alibaba, argmax without unknown rules", a["raw_argmax_training"]),
        ]
    return rows


def _print_result(res: dict[str, Any]) -> None:
    base = res.get("baseline")
    click.echo(f"\nsplit: {res['split']} ({res['folds']} folds, seed {res['seed']}; no run on both sides)")
    head = f"{'':40} {'phasescope':>11}" + (f" {'paper RF':>11}" if base else "")
    click.echo(head)
    brows = dict(_rows(base)) if base else {}
    for name, v in _rows(res["model"]):
        line = f"{name:40} {_f(v):>11}"
        if base:
            line += f" {_f(brows.get(name)):>11}"
        click.echo(line)
    for label, m in (("phasescope", res["model"]), ("paper RF", base)):
        if not m:
            continue
        c = m["window"]["confusion"]
        click.echo(f"confusion ({label}), rows true, columns predicted: {' '.join(c['cols_pred'])}")
        for name, row in zip(c["rows_true"], c["counts"], strict=True):
            click.echo(f"  {name:10} " + " ".join(f"{x:7d}" for x in row))
    if res["split"] in HELD_OUT_SPLITS:
        _print_by_source(res)
    curve = res["model"]["window"].get("coverage_accuracy", [])
    if curve:
        click.echo("coverage against accuracy (phasescope windows whose best probability reaches the level):")
        click.echo("  " + " ".join(f"{'p>=' + format(c['level'], 'g'):>12}" for c in curve))
        click.echo("  " + " ".join(f"{_f(c['coverage']) + ' / ' + _pct(c['accuracy']):>12}" for c in curve))
    wrong = {f: d for f, d in res["model"]["families"].items() if d["accuracy"] < 1}
    if wrong:
        click.echo(
            "families with wrong runs (phasescope): "
            + ", ".join(f"{f} {d['correct']}/{d['examples']}" for f, d in wrong.items())
        )


# Splits that hold a whole group out: generalisation to a GPU model or a source never seen.
HELD_OUT_SPLITS = ("source", "gpu")
DEFAULT_SPLITS = ("source", "gpu", "run")


def _pct(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _print_by_source(res: dict[str, Any]) -> None:
    """One line per source, each scored while held out (so a weak source cannot hide in an average)."""
    base = (res.get("baseline") or {}).get("by_source", {})
    click.echo(
        f"per source, held out: {'source':34} {'runs':>5} {'run acc':>8} {'unknown':>8} {'coverage':>9} "
        f"{'acc called':>10} {'conf wrong':>10} {'train FPR':>9} {'inf rec':>8}"
        + (f" {'paper run acc':>13}" if base else "")
    )
    for src, d in res["model"]["by_source"].items():
        w, r = d["window"], d["run"]
        line = (
            f"{'':22}{src[:34]:34} {r['examples']:>5} {_f(r['accuracy']):>8} {r['unknown']:>8} "
            f"{_f(w['called_fraction']):>9} {_f(w['accuracy_on_called']):>10} "
            f"{_f(w['confidently_wrong']):>10} "
            f"{_f(w['training_fpr']):>9} {_f(w['per_class']['inference']['recall']):>8}"
        )
        if base:
            line += f" {_f(base.get(src, {}).get('run', {}).get('accuracy')):>13}"
        click.echo(line)


@click.command("eval")
@click.argument("data", nargs=-1, required=True)
@click.option(
    "--extra",
    "extra",
    multiple=True,
    type=click.Path(exists=True),
    help="More labelled data (a folder with labels.csv, or the table), e.g. your own recordings; "
    "repeatable. Joins every split; --split dataset holds each table out in turn.",
)
@click.option(
    "--split",
    "splits",
    multiple=True,
    type=click.Choice(["run", "run-random", "gpu", "source", "family", "dataset"]),
    help="Grouping for the folds (repeatable; default: source, gpu, then run). source/gpu/family/dataset: "
    "leave one out (the generalisation figures); run: k folds of whole runs, stratified by family.",
)
@click.option(
    "--baseline",
    type=click.Choice(["paper", "none"]),
    default="paper",
    show_default=True,
    help="Also run the paper's method on the same folds (random forests: most of the run time).",
)
@click.option(
    "--subsets", is_flag=True, help="Also report run-grouped accuracy for each realistic signal subset."
)
@click.option(
    "-k", "folds", type=click.IntRange(min=2), default=5, show_default=True,  # 1 fold: nothing to train on
    help="Folds for --split run.",
)
@click.option(
    "--resolution",
    type=click.Choice(["native", "15", "30", "60"]),
    default="native",
    show_default=True,
    help="Evaluate the coarse model instead: every trace as a scraper polling every 15, 30 or 60 s keeps "
    "it (snapshots), in 10-minute windows; traces already that coarse (Alibaba) as they are.",
)
@click.option("--seed", default=0, show_default=True, help="Seed that deals runs into folds (--split run).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
def command(
    data: tuple[str, ...],
    extra: tuple[str, ...],
    splits: tuple[str, ...],
    baseline: str,
    subsets: bool,
    folds: int,
    resolution: str,
    seed: int,
    as_json: bool,
    quiet: bool,
) -> None:
    """Evaluate the phase classifier on labelled DATA (labels.csv files, or folders holding one).

    Leave-one-source-out and leave-one-GPU-model-out come first: they are what a new user's GPUs and
    workloads look like to the model. Each prints a line per held-out source, then coverage against
    accuracy; the run-grouped split (new runs of known workloads) comes last.

    Example: phasescope eval ../shared/data --extra data/h200
    """
    from phasescope.classify.lab import train
    from phasescope.classify.lab.progress import steps

    sources = [*data, *extra]
    examples = train.load_data(sources)
    if not examples:
        raise InputError(sources[0], "labels", "at least one labelled trace", "none")
    chosen = splits or DEFAULT_SPLITS
    with_base = baseline == "paper"
    split_folds = {s: train.folds(examples, s, folds, seed) for s in chosen}
    if not splits:  # the defaults: a held-out split with one group (one source, one GPU) has nothing to show
        for s in HELD_OUT_SPLITS:
            if s in split_folds and any(len(fit_on) == 0 for _, fit_on, _ in split_folds[s]):
                del split_folds[s]
                if not quiet:
                    click.echo(f"--split {s} left out: the data holds one {s} only", err=True)
        chosen = tuple(split_folds)
    for s, fs in split_folds.items():
        empty = next((name for name, fit_on, _ in fs if len(fit_on) == 0), None)
        if empty is not None:  # e.g. --split dataset with one labels table: nothing is left to fit on
            raise InputError(
                sources[0], f"--split {s}", "at least two groups to hold out in turn",
                f"holding out {str(empty)!r} leaves no run to train on",
            )
    total = sum(len(fs) * (2 if with_base else 1) for fs in split_folds.values())
    total += len(train.SUBSET_REPORTED) if subsets else 0
    out: dict[str, Any] = {"data": sources, "results": []}
    with steps(total, quiet=quiet) as step:
        step.phase(f"window features for {len(examples)} traces")
        if resolution == "native":
            table = train.build_table(examples)
        else:
            table = train.build_coarse_table(examples, (float(resolution),))
            if not table.examples:
                raise InputError(
                    sources[0], "labels", f"traces long enough for {resolution} s snapshots", "none"
                )
        out.update(
            examples=len(table.examples),
            runs=len({e.run for e in table.examples}),
            windows=int((table.copy == 1).sum()),
            resolution=resolution,
        )
        for split in chosen:
            res = train.evaluate(table, split, baseline=with_base, k=folds, progress=step, seed=seed)
            out["results"].append(res)
        if subsets:
            out["subsets"] = train.subset_accuracy(table, k=folds, progress=step)
    if as_json:
        from phasescope.verify.check import strict_json  # NaN (a recall with no example) -> null

        click.echo(json.dumps(strict_json(out), default=_json_default, allow_nan=False))
        return
    at = "" if resolution == "native" else f" (snapshots every {resolution} s, the coarse model)"
    click.echo(f"{out['examples']} labelled device traces, {out['runs']} runs, {out['windows']} windows{at}")
    for res in out["results"]:
        _print_result(res)
    if subsets:
        click.echo("\nrun-grouped CV with only these signals:")
        click.echo(
            f"{'subset':20} {'win acc':>8} {'bal acc':>8} {'run acc':>8} {'trainRec':>8} "
            f"{'trainFPR':>8} {'evasion':>8}"
        )
        for name, d in out["subsets"].items():
            click.echo(
                f"{name:20} {_f(d['window_accuracy']):>8} {_f(d['window_balanced_accuracy']):>8} "
                f"{_f(d['run_accuracy']):>8} {_f(d['training_recall']):>8} {_f(d['training_fpr']):>8} "
                f"{_f(d['evasion_detected']):>8}"
            )


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(type(o).__name__)
