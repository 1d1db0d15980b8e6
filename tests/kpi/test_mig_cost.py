"""A GPU split into MIG instances is priced once: the parent row and its instances together pay one
GPU-hour per hour, and the board's energy once (kpi/cost.py `mig_shares`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from phasescope.cli import main
from phasescope.kpi.cost import Prices, mig_shares
from phasescope.report import build
from phasescope.schema import DeviceInfo
from phasescope.sources.nvml import NvmlSource
from phasescope.sources.replay import read
from phasescope.store.recording import RecordingWriter

SPAR_RUN = "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet"
SG_RUN = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
HOUR_TICKS = 361  # 0..3600 s every 10 s: exactly one hour held
PRICES = ["--price-gpu-hour", "2", "--price-kwh", "0.1"]


@pytest.fixture
def mig_recording(tmp_path: Path, shared_data: Path, fake_nvml) -> Path:
    """One hour recorded through the scripted fake NVML: one A100 split into 2 MIG instances."""
    (spar,) = read(shared_data / SPAR_RUN)
    fake = fake_nvml([spar], mig={0: read(shared_data / SG_RUN)}, mem_total_bytes=40e9)
    out = tmp_path / "mig.parquet"
    src = NvmlSource()
    with RecordingWriter(out, source_spec="nvml", interval_s=10.0, clock=lambda: 0.0) as w:
        for i in range(HOUR_TICKS):
            w.write(replace(src.read(), time=1.7e9 + 10.0 * i))
            fake.advance()
    src.close()
    return out


def _energy_rows(path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict]:
    assert main(["cost", "energy", str(path), "--no-phases", "--json", *PRICES]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_nvml_mig_recording_costs_one_gpu_hour(mig_recording: Path, capsys) -> None:
    rows = _energy_rows(mig_recording, capsys)
    assert len(rows) == 3
    parent, *kids = rows
    assert all(r["span_s"] == pytest.approx(3600.0) for r in rows)
    # One physical GPU held for one hour at $2/GPU-hour: $2 in all, not $2 per row.
    assert sum(r["cost"]["time_usd"] for r in rows) == pytest.approx(2.0)
    # The fake's instances have no profile in their names: an equal split, said in the note.
    assert [r["cost"]["time_usd"] for r in kids] == pytest.approx([1.0, 1.0])
    assert all("split equally" in r["mig_note"] for r in kids)
    # Energy: NVML gives power for the parent only; it is priced there, once.
    assert parent["method"] != "none" and all(r["method"] == "none" for r in kids)
    assert parent["cost"]["energy_usd"] == pytest.approx(parent["kwh"] * 0.1)
    assert all(r["cost"]["energy_usd"] is None for r in kids)


def test_crossover_and_report_price_the_mig_gpu_once(mig_recording: Path, capsys) -> None:
    rows = _energy_rows(mig_recording, capsys)
    board_energy_usd = rows[0]["kwh"] * 0.1
    assert main(["cost", "crossover", "--train-recording", str(mig_recording), "--queries-per-day", "1000",
                 "--cost-per-query", "0.001", "--json", *PRICES]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["train_cost_usd"] == pytest.approx(2.0 + board_energy_usd)
    data = build([(str(mig_recording), read(mig_recording))], prices=Prices(2.0, 0.1))
    assert sum(d.cost.time_usd or 0.0 for d in data.devices) == pytest.approx(2.0)
    assert sum(d.cost.energy_usd or 0.0 for d in data.devices) == pytest.approx(board_energy_usd)
    assert all(d.price_note.startswith("MIG") for d in data.devices)


def _dcgm_mig_scrape(path: Path) -> None:
    """dcgm-exporter in MIG mode: only per-instance series, each repeating the board's 200 W."""
    lines = []
    for n in range(121):  # every 30 s for one hour
        for gi, profile in (("1", "3g.20gb"), ("2", "4g.20gb")):
            labels = (f'gpu="0",UUID="GPU-0a1b2c3d-0000-1111-2222-333344445555",'
                      f'modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}"')
            lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 200.0 {1_700_000_000_000 + 30_000 * n}")
    path.write_text("\n".join(lines) + "\n")


def test_dcgm_mig_instances_share_the_board_by_slices(tmp_path: Path, capsys) -> None:
    path = tmp_path / "metrics.prom"
    _dcgm_mig_scrape(path)
    rows = _energy_rows(path, capsys)
    assert len(rows) == 2 and all(r["span_s"] == pytest.approx(3600.0) for r in rows)
    # 3g and 4g of the A100's 7 compute slices: 3/7 and 4/7 of the $2 hour.
    assert [r["cost"]["time_usd"] for r in rows] == pytest.approx([2.0 * 3 / 7, 2.0 * 4 / 7])
    # Each instance shows the board's 200 W for an hour (0.2 kWh); the board's $0.02 is counted once.
    assert all(r["kwh"] == pytest.approx(0.2) for r in rows)
    assert sum(r["cost"]["energy_usd"] for r in rows) == pytest.approx(0.02)
    assert "3 of its 7 compute slices" in rows[0]["mig_note"]


def test_shares_by_slices_leave_the_rest_to_the_parent() -> None:
    devs = [
        DeviceInfo("GPU-a", "NVIDIA H100 80GB HBM3"),
        DeviceInfo("MIG-1", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", parent_uuid="GPU-a"),
        DeviceInfo("MIG-2", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", parent_uuid="GPU-a"),
        DeviceInfo("GPU-b", "NVIDIA H100 80GB HBM3"),
    ]
    shares = mig_shares(devs)
    assert "GPU-b" not in shares  # not in MIG mode: priced whole, as before
    assert shares["MIG-1"].time == pytest.approx(3 / 7) and shares["MIG-2"].time == pytest.approx(1 / 7)
    assert shares["GPU-a"].time == pytest.approx(3 / 7)  # the 3 slices no instance holds
    assert sum(s.time for s in shares.values()) == pytest.approx(1.0)
    assert shares["GPU-a"].energy == 1.0 and shares["MIG-1"].energy == 0.0
    p = shares["MIG-1"].apply(Prices(7.0, 0.1))
    assert p.usd_per_gpu_hour == pytest.approx(3.0) and p.usd_per_kwh is None


def test_unknown_or_inconsistent_slices_split_equally() -> None:
    for kid_name, why in (("MIG instance", "slice count not known"),
                          ("NVIDIA A30 MIG 4g.24gb", "profiles claim 8 slices of 4")):
        devs = [DeviceInfo("GPU-a", "NVIDIA A30"),
                DeviceInfo("MIG-1", kid_name, parent_uuid="GPU-a"),
                DeviceInfo("MIG-2", kid_name, parent_uuid="GPU-a")]
        shares = mig_shares(devs)
        assert shares["MIG-1"].time == shares["MIG-2"].time == 0.5 and shares["GPU-a"].time == 0.0
        assert why in shares["MIG-1"].note
