"""Malformed `--model` files: one line and exit 2, never a traceback or a signal from LightGBM's parser.

A booster cut in half used to kill `classify` with SIGSEGV, an edited one (a NaN threshold, a changed
child index) with SIGABRT, `num_class` changed with a reshape traceback. Each file below is the shipped
model with one thing wrong, every other part kept consistent (tree_sizes recomputed), so each check is
reached on its own. They load with PHASESCOPE_TRUST_MODEL=1: the booster digest would refuse them all
first, and the structure checks must hold for a model the user chose to trust."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from phasescope.classify.model import TRUST_MODEL_ENV, PhaseModel, booster_digest

TRACE = "sensorguard-rtx3090/20260824_calib-bursty_verifier-gpu0_s0_r01/nvml.csv"
SHIPPED = Path(__file__).resolve().parents[2] / "src/phasescope/models/phase_model.json"


def _resized(booster: str) -> str:
    """The booster with `tree_sizes` recomputed from its Tree= blocks (as LightGBM would write it)."""
    start = booster.index("\nTree=") + 1
    end = booster.index("\nend of trees\n") + 1
    at = [m.start() for m in re.finditer(r"^Tree=", booster[start:end], re.M)] + [end - start]
    sizes = " ".join(str(b - a) for a, b in itertools.pairwise(at))
    return re.sub(r"^tree_sizes=.*$", f"tree_sizes={sizes}", booster, count=1, flags=re.M)


def _booster(edit: Callable[[str], str], resize: bool = True) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        sub = doc["submodels"][0]
        sub["booster"] = _resized(edit(sub["booster"])) if resize else edit(sub["booster"])

    return apply


def _field(section: str, key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        doc[section][key] = value

    return apply


def _drop_last_feature(b: str) -> str:
    b = b.replace("max_feature_idx=56", "max_feature_idx=55", 1)
    return re.sub(r"^(feature_names=.*) \S+$", r"\1", b, count=1, flags=re.M)


def _drop_last_tree(b: str) -> str:
    last = b.rindex("\nTree=") + 1
    return b[:last] + b[b.index("end of trees"):]


def _sub(pattern: str, repl: str) -> Callable[[str], str]:
    return lambda b: re.sub(pattern, repl, b, count=1, flags=re.M)


def _cut_mid_tree(b: str) -> str:
    end = b.index("end of trees")
    return b[: end - 501] + b[end - 1 :]


# name -> (how the file is broken, what the one line names)
CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "truncated booster": (_booster(lambda b: b[: len(b) // 2], resize=False), "'end of trees'"),
    "cut mid-tree, sizes kept": (_booster(_cut_mid_tree, resize=False), "tree_sizes"),
    "num_class changed": (_booster(_sub("^num_class=4", "num_class=3")), "num_class"),
    "feature count changed": (_booster(_drop_last_feature), "max_feature_idx"),
    "a tree dropped": (_booster(_drop_last_tree), "tree_sizes"),
    "a tree's sizes off": (
        _booster(_sub("^tree_sizes=957 956", "tree_sizes=956 957"), resize=False), "Tree= blocks"),
    "NaN threshold": (
        _booster(_sub(r"^threshold=\S+", "threshold=nan")), "tree 0 threshold: expected numbers (no NaN)"),
    "infinite leaf value": (
        _booster(_sub(r"^leaf_value=\S+", "leaf_value=inf")), "tree 0 leaf_value: expected finite numbers"),
    "child index out of range": (_booster(_sub("^left_child=1 ", "left_child=99 ")), "right_child"),
    "a child reached twice": (_booster(_sub("^left_child=1 5", "left_child=1 1")), "right_child"),
    "split on no feature": (_booster(_sub("^split_feature=30 ", "split_feature=57 ")), "split_feature"),
    "booster version": (_booster(_sub("^version=v4", "version=v9")), "version"),
    # Found by fuzzing byte edits of a booster: each crashed LightGBM (SIGSEGV, SIGABRT) before.
    "a parameters line broken": (
        _booster(_sub(r"^\[scale_pos_weight: ", "[\ncale_pos_weight: "), resize=False), "parameters"),
    "an underscore in tree_sizes": (_booster(_sub("^tree_sizes=957 ", "tree_sizes=95_7 "), resize=False),
                                    "tree_sizes: expected whole numbers"),
    "a line break inside a tree": (_booster(_sub(r"^(split_gain=\S+) ", "\\1\n")), "expected 'key=value'"),
    "a number cut in two": (_booster(_sub(r"^(internal_value=\S+) ", "\\1f")), "internal_value"),
    "window_s a string": (_field("window", "window_s", "30"), "window.window_s: expected a finite float > 0"),
    "stride_s NaN": (_field("window", "stride_s", float("nan")), "window.stride_s"),
    "min_samples fractional": (_field("window", "min_samples", 8.5), "window.min_samples: expected a finite"),
    "min_coverage above 1": (_field("window", "min_coverage", 1.5), "window.min_coverage"),
    "adapt_to_rate a string": (_field("window", "adapt_to_rate", "yes"), "expected true or false"),
    "unknown window field": (_field("window", "window_seconds", 30), "window.window_seconds"),
    "min_proba above 1": (_field("unknown_rules", "min_proba", 2.0), "unknown_rules.min_proba"),
    "min_signals zero": (_field("unknown_rules", "min_signals", 0), "unknown_rules.min_signals"),
    "interval range upside down": (_field("unknown_rules", "min_interval_s", 20.0),
                                   "unknown_rules.max_interval_s"),
    "version a number": (lambda d: d.update(version=3), "version: expected a version string"),
    "calibration temperature a string": (
        lambda d: d["submodels"][0]["calibration"].update(temperature="hot"), "calibration"),
    "calibration low not a list": (
        lambda d: d["submodels"][0]["calibration"].update(low="0"), "calibration"),
    "signals not schema names": (lambda d: d["submodels"][0].update(signals=["watts"]), "signals"),
}


@pytest.fixture(scope="module")
def shipped_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SHIPPED.read_text())
    return doc


def _classify(model: Path, trace: Path, trust: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != TRUST_MODEL_ENV}
    if trust:
        env[TRUST_MODEL_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "phasescope", "classify", "--model", str(model), str(trace)],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_model_is_one_line_and_exit_2(
    case: str, shipped_doc: dict[str, Any], tmp_path: Path, shared_data: Path
) -> None:
    breaks, names = CASES[case]
    doc = json.loads(json.dumps(shipped_doc))
    breaks(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))  # NaN written as the bare NaN token Python's json reads back
    proc = _classify(bad, shared_data / TRACE, trust=True)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-600:])
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert proc.stderr.startswith(f"phasescope: {bad}: ") and names in proc.stderr, proc.stderr


def test_a_changed_booster_is_refused_unless_trusted(
    shipped_doc: dict[str, Any], tmp_path: Path, shared_data: Path
) -> None:
    """A well-formed booster that is not the one saved (its digest differs): refused, naming the opt-in;
    loaded when the user opts in."""
    doc = json.loads(json.dumps(shipped_doc))
    sub = doc["submodels"][0]
    sub["booster"] = re.sub(r"^leaf_value=(\S+)", "leaf_value=-1.5", sub["booster"], count=1, flags=re.M)
    sub["booster"] = _resized(sub["booster"])
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(doc))
    proc = _classify(bad, shared_data / TRACE, trust=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-600:]
    assert f"submodel {sub['name']} booster_sha256: expected the sha256 of its booster" in proc.stderr
    assert f"set {TRUST_MODEL_ENV}=1" in proc.stderr
    assert _classify(bad, shared_data / TRACE, trust=True).returncode == 0


def test_saved_models_carry_digests_that_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUST_MODEL_ENV, raising=False)
    doc = json.loads(SHIPPED.read_text())
    assert all(s["booster_sha256"] == booster_digest(s["booster"]) for s in doc["submodels"])
    model = PhaseModel.load()
    path = tmp_path / "m.json"
    model.save(path)
    again = PhaseModel.load(str(path))  # no opt-in needed for a model phasescope saved
    assert [s.name for s in again.submodels] == [s.name for s in model.submodels]
    del doc["submodels"][0]["booster_sha256"]  # saved before digests: refused until trusted or re-saved
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match="booster_sha256"):
        PhaseModel.load(str(path))
    monkeypatch.setenv(TRUST_MODEL_ENV, "1")
    assert PhaseModel.load(str(path)).version == model.version


def test_the_packaged_model_skips_the_walk_a_copy_does_not(tmp_path, monkeypatch):
    """The files installed with phasescope are as trusted as its code: their boosters, whose digests match,
    skip the structure walk (most of a second at every command's start). The same file given as --model is
    walked."""
    import importlib.resources as resources

    from phasescope.classify import model as model_mod
    from phasescope.classify.model import SHIPPED_MODEL, PhaseModel

    walked: list[str] = []

    def walk(text, features, where, name):
        walked.append(where)

    monkeypatch.setattr(model_mod, "check_booster", walk)
    monkeypatch.setattr(model_mod, "_CHECKED_BOOSTERS", set())
    PhaseModel.load()
    assert walked == []
    copy = tmp_path / "copy.json"
    copy.write_text(resources.files("phasescope.models").joinpath(SHIPPED_MODEL).read_text())
    PhaseModel.load(str(copy))
    assert walked and all(w == str(copy) for w in walked)
