"""Fixtures shared by the audit tests: one signed bundle built from real runs, copied fresh per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verify._bundle import AUDIT_KEY, make_bundle


@pytest.fixture(scope="module")
def pristine(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return make_bundle(shared_data, tmp_path_factory.mktemp("b") / "bundle.jsonl", AUDIT_KEY).read_bytes()


@pytest.fixture
def bundle(pristine: bytes, tmp_path: Path) -> Path:
    p = tmp_path / "bundle.jsonl"
    p.write_bytes(pristine)
    return p
