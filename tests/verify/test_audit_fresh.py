"""What an audit OK rests on, and `not_before` (issue 21, item 9): an older genuine bundle shows as old,
and fails when freshness is required."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from phasescope.verify.audit import audit_bundle, audit_chain, utc
from tests.verify._bundle import AUDIT_KEY, make_bundle
from tests.verify._data import model

DAY = 86400.0


@pytest.fixture(scope="module")
def month_old(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A genuine bundle whose telemetry (real runs, moved onto the wall clock) ended 30 days ago."""
    out = tmp_path_factory.mktemp("old") / "bundle.jsonl"
    return make_bundle(shared_data, out, AUDIT_KEY, dated_to=time.time() - 30 * DAY)


def test_an_ok_names_the_signer_the_claim_and_each_devices_span_and_verdict(month_old: Path) -> None:
    report = audit_bundle(month_old, AUDIT_KEY.public_key(), model())
    assert report.ok, [p.line(month_old) for p in report.problems]
    assert report.key_pinned and report.key_fingerprint and report.key_fingerprint.startswith("sha256:")
    assert report.claims == ["no-training, 120 s windows"]
    devices = {d["device"]: d for d in report.devices()}
    assert len(devices) == 2
    ends = sorted(d["end"] for d in devices.values())
    assert ends[-1] == pytest.approx(time.time() - 30 * DAY, abs=60)
    verdicts = sorted(v["verdict"] for d in devices.values() for v in d["verdicts"])
    assert verdicts == ["consistent", "inconsistent"]  # the disguised training run, the inference control
    assert all(sum(v["windows"].values()) == 2 for d in devices.values() for v in d["verdicts"])
    assert sum(d["samples"] for d in devices.values()) == 355


def test_not_before_refuses_an_older_genuine_bundle(month_old: Path) -> None:
    week_ago = time.time() - 7 * DAY
    report = audit_bundle(month_old, AUDIT_KEY.public_key(), model(), not_before=week_ago)
    assert [p.where for p in report.problems] == sorted(f"device {d['device']}" for d in report.devices())
    msg = report.problems[0].message
    assert msg.startswith("telemetry ends at 20") and f"before --not-before {utc(week_ago)}" in msg
    assert "older than required" in msg
    assert report.verdicts  # the bundle itself is genuine: only its age fails
    ok = audit_bundle(month_old, AUDIT_KEY.public_key(), model(), not_before=time.time() - 31 * DAY)
    assert ok.ok
    chain = audit_chain(month_old, AUDIT_KEY.public_key(), not_before=week_ago)
    assert "older than required" in chain.problems[0].message


def test_not_before_cannot_be_shown_on_a_logs_own_clock(bundle: Path) -> None:
    """The shared bundle's logs count seconds since boot: nothing dates them, so freshness fails closed."""
    report = audit_bundle(bundle, AUDIT_KEY.public_key(), model(), not_before=0.0)
    assert report.problems and all("the log's own clock, not dated" in p.message for p in report.problems)
    assert audit_bundle(bundle, AUDIT_KEY.public_key(), model()).ok
