"""Fitting and evaluating models: imported by `eval`, `train-model` and benchmarks, never at run time."""
