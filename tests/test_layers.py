"""The import rules of docs/design/layers.md, as configured in pyproject.toml ([tool.importlinter]).

`lint-imports` (run by `make lint`) must pass on the tree as it is; and each contract must actually guard its
arrows: an import added to the real graph from any of its sources to any of its forbidden (or protected)
modules breaks it. The second test is what keeps a contract from passing because it checks nothing (a typo in
a module name, an empty list, a contract of the wrong type).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

importlinter_api = pytest.importorskip("importlinter.api", reason="import-linter is in the dev extra")
grimp = pytest.importorskip("grimp")

from importlinter.contracts.forbidden import ForbiddenContract  # noqa: E402
from importlinter.contracts.protected import ProtectedContract  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONTRACT_TYPES: dict[str, Any] = {"forbidden": ForbiddenContract, "protected": ProtectedContract}
# Every rule docs/design/layers.md states; a contract dropped from pyproject.toml fails here.
EXPECTED_IDS = {
    "core-no-views",
    "fleet-no-serve-cli",
    "no-training-at-run-time",
    "training-code-importers",
    "instrument-no-kpi",
    "store-below-live",
    "live-no-outputs",
    "serve-no-cli",
}


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return importlinter_api.read_configuration(str(PYPROJECT))


@pytest.fixture(scope="module")
def graph(config: dict[str, Any]) -> Any:
    return grimp.build_graph(*config["session_options"]["root_packages"], cache_dir=None)


def _check(contract_options: dict[str, Any], session_options: dict[str, Any], graph: Any) -> bool:
    cls = CONTRACT_TYPES[contract_options["type"]]
    contract = cls(name=contract_options["name"], session_options=session_options,
                   contract_options=contract_options)
    return bool(contract.check(copy.deepcopy(graph), verbose=False).kept)


def test_lint_imports_passes() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    if not lint_imports.exists():
        pytest.skip("lint-imports is not installed next to this Python")
    proc = subprocess.run([str(lint_imports), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Contracts: {len(EXPECTED_IDS)} kept, 0 broken." in proc.stdout, proc.stdout


def test_every_rule_is_configured(config: dict[str, Any]) -> None:
    contracts = config["contracts_options"]
    assert {c["id"] for c in contracts} == EXPECTED_IDS
    assert {c["type"] for c in contracts} <= set(CONTRACT_TYPES)
    by_id = {c["id"]: c for c in contracts}
    core = by_id["core-no-views"]
    for module in ("phasescope.schema", "phasescope.classify", "phasescope.kpi", "phasescope.sources",
                   "phasescope.verify", "phasescope.instrument", "phasescope.features"):
        assert module in core["source_modules"]
    for module in ("phasescope.cli", "phasescope.serve", "phasescope.views", "phasescope.report",
                   "phasescope.live"):
        assert module in core["forbidden_modules"]
    assert set(by_id["fleet-no-serve-cli"]["forbidden_modules"]) == {"phasescope.serve", "phasescope.cli"}
    assert by_id["training-code-importers"]["protected_modules"] == ["phasescope.classify.lab"]
    # live/state.py holds data; its screen text is views/table.py's (issue 17): live never imports a view.
    assert "phasescope.views" in by_id["live-no-outputs"]["forbidden_modules"]


def test_contracts_are_kept_on_the_real_graph(config: dict[str, Any], graph: Any) -> None:
    for options in config["contracts_options"]:
        assert _check(options, config["session_options"], graph), options["id"]


@pytest.mark.parametrize("contract_id", sorted(EXPECTED_IDS))
def test_a_forbidden_import_is_caught(config: dict[str, Any], graph: Any, contract_id: str) -> None:
    """Add one import the contract forbids to the real graph, for every (source, forbidden) pair it does not
    ignore: each must break the contract; so every module it names exists and is guarded."""
    options = next(c for c in config["contracts_options"] if c["id"] == contract_id)
    if options["type"] == "forbidden":
        pairs = [(s, f) for s in options["source_modules"] for f in options["forbidden_modules"]]
    else:  # protected: a run-time module that is no allowed importer
        pairs = [("phasescope.serve.agent", p) for p in options["protected_modules"]]
    ignored = set(options.get("ignore_imports", []))  # the allowed and the known: see pyproject.toml
    pairs = [(s, f) for s, f in pairs if f"{s} -> {f}" not in ignored]
    assert pairs
    for importer, imported in pairs:
        assert importer in graph.modules and imported in graph.modules, (importer, imported)
        bad = copy.deepcopy(graph)
        bad.add_import(importer=importer, imported=imported, line_number=1, line_contents="import x")
        assert not _check(options, config["session_options"], bad), f"{importer} -> {imported} not caught"


def test_the_fixed_arrow_and_an_indirect_chain_are_caught(config: dict[str, Any], graph: Any) -> None:
    """sources/host.py borrowing display's text helpers again (fixed by phasescope.text) breaks the core
    rule; and a chain counts, not only an edge: a run-time module reaching the training code through a
    module that is no source of the contract breaks the training rule."""
    options = next(c for c in config["contracts_options"] if c["id"] == "core-no-views")
    bad = copy.deepcopy(graph)
    bad.add_import(importer="phasescope.sources.host", imported="phasescope.views.display", line_number=1,
                   line_contents="from phasescope.views.display import printable")
    assert not _check(options, config["session_options"], bad)

    options = next(c for c in config["contracts_options"] if c["id"] == "no-training-at-run-time")
    assert "phasescope.text" not in options["source_modules"]
    bad = copy.deepcopy(graph)
    bad.add_import(importer="phasescope.sources.sampler", imported="phasescope.text", line_number=1,
                   line_contents="from phasescope.text import printable")
    bad.add_import(importer="phasescope.text", imported="phasescope.classify.lab.dataset", line_number=1,
                   line_contents="from phasescope.classify.lab.dataset import load_examples")
    assert not _check(options, config["session_options"], bad)
