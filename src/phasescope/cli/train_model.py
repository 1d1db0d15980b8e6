"""`phasescope train-model DATA... -o MODEL`: refit the phase model on labelled recordings."""

from __future__ import annotations

import json
import time
from pathlib import Path

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
@click.option(
    "-k", "folds", type=click.IntRange(min=2), default=5, show_default=True,  # 1 fold: nothing to train on
    help="Folds for the card's cross-validation.",
)
@click.option(
    "--coarse/--no-coarse",
    default=False,
    show_default=True,
    help="Also fit the coarse model (traces sampled every 15-60 s, as Prometheus keeps them) from snapshots "
    "of the same data. The shipped model has none: see docs/EVALUATION.md for why.",
)
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
def command(
    data: tuple[str, ...], output: str, evaluate: bool, folds: int, coarse: bool, quiet: bool
) -> None:
    """Fit the phase model on DATA (labels.csv files, or folders holding one) and write it to MODEL.

    \b
    Example:
      phasescope train-model ../shared/data -o my_model.json
    """
    from phasescope.classify.lab import train
    from phasescope.classify.lab.progress import steps

    t0 = time.perf_counter()
    if not Path(output).parent.is_dir():  # found out before the fit, not after it
        raise InputError(output, "output", "a file in an existing directory", "no such directory")
    examples = train.load_data(list(data))
    if not examples:
        raise InputError(data[0], "labels", "at least one labelled trace", "none")
    n_sources = len({e.source for e in examples})
    held_out = n_sources if n_sources > 1 else 0
    n_folds = (len(train.folds(examples, "run", folds)) + held_out) if evaluate else 0
    evaluation = None
    with steps(n_folds + 1, quiet=quiet) as step:
        step.phase(f"window features for {len(examples)} traces")
        table = train.build_table(examples)
        summary = (
            f"{len(examples)} labelled traces, {len({e.run for e in examples})} runs, "
            f"{int((table.copy == 1).sum())} windows"
        )
        if evaluate:
            m = train.evaluate(table, "run", k=folds, progress=step)["model"]
            evaluation = {
                "split": f"run-grouped {folds}-fold CV, stratified by family",
                **train.headline(m),
                "alibaba": m.get("alibaba"),
            }
            if n_sources > 1:  # the generalisation figure: each source held out in turn
                held = train.evaluate(table, "source", progress=step)["model"]
                evaluation["leave_one_source_out"] = {
                    **train.headline(held),
                    "windows_called": held["window"]["called_fraction"],
                    "confidently_wrong": held["window"]["confidently_wrong"],
                    "ece": held["window"]["ece"],
                }
        step.phase("fitting the shipped boosters")
        t1 = time.perf_counter()
        model = train.fit_shipped(table, train.build_coarse_table(examples) if coarse else None)
        fit_s = time.perf_counter() - t1
        step("fitted")
    if not model.submodels:  # a model that can only say "unknown" is not worth writing
        raise InputError(
            data[0], "labels", "judged windows (50 or more) of at least two phases to fit a booster on",
            f"{summary} of {', '.join(sorted({e.label for e in table.examples}))}",
        )
    if not quiet:
        click.echo(summary, err=True)
        if evaluation is not None:
            click.echo(
                f"cross-validation: window accuracy {evaluation['window_accuracy']:.4f}, "
                f"run accuracy {evaluation['run_accuracy']:.4f}",
                err=True,
            )
    model.card = train.model_card(table, evaluation, fit_s)
    try:
        model.save(output)
    except OSError as exc:
        raise InputError(output, "output", "a writable file", exc.strerror or str(exc)) from None
    click.echo(
        json.dumps(
            {
                "output": output,
                "version": model.version,
                "submodels": [s.name for s in model.submodels],
                "coarse_submodels": [s.name for s in model.coarse.submodels] if model.coarse else [],
                "fit_seconds": round(fit_s, 2),
                "total_seconds": round(time.perf_counter() - t0, 2),
            }
        )
    )
