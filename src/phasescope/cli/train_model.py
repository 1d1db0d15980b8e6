"""`phasescope train-model DATA... -o MODEL`: refit the phase model on labelled recordings."""

from __future__ import annotations

import json
import time

import click

from phasescope.errors import InputError


@click.command("train-model")
@click.argument("data", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Model file to write (JSON).",
)
@click.option(
    "--evaluate/--no-evaluate",
    default=True,
    show_default=True,
    help="Run run-grouped cross-validation first and put its figures in the model card.",
)
@click.option("-k", "folds", default=5, show_default=True, help="Folds for the card's cross-validation.")
def command(data: tuple[str, ...], output: str, evaluate: bool, folds: int) -> None:
    """Fit the phase model on DATA (labels.csv files, or folders holding one) and write it to MODEL."""
    from phasescope.classify import train

    t0 = time.perf_counter()
    examples = train.load_data(list(data))
    if not examples:
        raise InputError(data[0], "labels", "at least one labelled trace", "none")
    table = train.build_table(examples)
    click.echo(
        f"{len(examples)} labelled traces, {len({e.run for e in examples})} runs, "
        f"{int((table.copy == 1).sum())} windows",
        err=True,
    )
    evaluation = None
    if evaluate:
        res = train.evaluate(table, "run", k=folds)
        m = res["model"]
        evaluation = {
            "split": f"run-grouped {folds}-fold CV",
            "window_accuracy": m["window"]["accuracy"],
            "window_balanced_accuracy": m["window"]["balanced_accuracy"],
            "run_accuracy": m["run"]["accuracy"],
            "training_recall": m["window"]["training_recall"],
            "training_fpr": m["window"]["training_fpr"],
            "evasion_detected": m["evasion_detection"]["detected"],
            "alibaba": m.get("alibaba"),
        }
        click.echo(
            f"cross-validation: window accuracy {m['window']['accuracy']:.4f}, "
            f"run accuracy {m['run']['accuracy']:.4f}",
            err=True,
        )
    t1 = time.perf_counter()
    model = train.fit_model(table)
    fit_s = time.perf_counter() - t1
    model.card = train.model_card(table, evaluation, fit_s)
    model.save(output)
    click.echo(
        json.dumps(
            {
                "output": output,
                "version": model.version,
                "submodels": [s.name for s in model.submodels],
                "fit_seconds": round(fit_s, 2),
                "total_seconds": round(time.perf_counter() - t0, 2),
            }
        )
    )
