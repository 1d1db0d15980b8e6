"""Shared fixtures. Real data is read from ../shared/data (beside the checkout), never copied in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.fakes.fake_nvml"]

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    env = os.environ.get("PHASESCOPE_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "labels.csv").exists():
        pytest.fail(f"real data not found at {path} (set PHASESCOPE_SHARED_DATA)")
    return path
