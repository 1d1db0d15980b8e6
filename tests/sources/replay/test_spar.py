from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phasescope.schema import MIB
from phasescope.sources.replay import spar
from tests.sources.replay.conftest import expect_input_error

BERT = "spar-a100/bert_sst2_amp_NVIDIA_A100_SXM4_40GB_90abf7ca_20260309_182528.parquet"


def test_reads_known_row_in_base_units(shared_data: Path) -> None:
    (t,) = spar.read(shared_data / BERT)
    assert len(t) == 27
    assert t.device.uuid == "GPU-57429741-6ef2-d916-a2b1-594d7510373b"
    assert t.device.name == "NVIDIA A100-SXM4-40GB"
    assert t.time[0] == pytest.approx(1773080728.630477)
    assert t["power"][0] == pytest.approx(56.84)
    assert t["mem_used"][0] == 518 * MIB
    assert t["mem_total"][0] == 40960 * MIB
    assert t["sm_clock"][0] == 210e6 and t["mem_clock"][0] == 1215e6
    # pcie_tx_mbps 0.3330078125 = 341 KB/s / 1024 -> 341,000 bytes/s
    assert t["pcie_tx"][0] == pytest.approx(341_000)
    assert t["pcie_rx"][0] == pytest.approx(0.28515625 * 1024 * 1000)  # same scale on the receive side
    assert t.missing_signals() == []
    assert t.meta["workload"] == "bert_sst2_amp" and t.meta["run"] == Path(BERT).stem
    assert t.meta["format"] == "spar"


def test_every_spar_file(shared_data: Path) -> None:
    files = sorted((shared_data / "spar-a100").glob("*.parquet"))
    assert files
    for f in files:
        (t,) = spar.read(f)
        assert len(t) >= 26
        label = t.meta["workload_label"]
        assert f.name.startswith(label)
        assert 0 <= t["gpu_util"].max() <= 1 and t["gpu_util"].max() > 0  # each run did real work


def test_dcgm_columns_fill_nvml_gaps(shared_data: Path, tmp_path: Path) -> None:
    table = pq.read_table(shared_data / BERT)
    power = table["power_draw_w"].to_pylist()
    power[3] = None
    dcgm = table["dcgm_power_usage"].to_pylist()
    table = table.set_column(table.schema.get_field_index("power_draw_w"), "power_draw_w", pa.array(power))
    pq.write_table(table, tmp_path / "x.parquet")
    (t,) = spar.read(tmp_path / "x.parquet")
    assert t["power"][3] == pytest.approx(dcgm[3])


def test_missing_column_is_named(shared_data: Path, tmp_path: Path) -> None:
    table = pq.read_table(shared_data / BERT).drop_columns(["timestamp_epoch"])
    pq.write_table(table, tmp_path / "x.parquet")
    assert not spar.sniff(tmp_path / "x.parquet")
    expect_input_error(spar.read, tmp_path / "x.parquet", match=("x.parquet", "'timestamp_epoch'"))


def test_text_in_a_number_column(shared_data: Path, tmp_path: Path) -> None:
    table = pq.read_table(shared_data / BERT)
    i = table.schema.get_field_index("power_draw_w")
    table = table.set_column(i, "power_draw_w", pa.array(["x"] * table.num_rows))
    pq.write_table(table, tmp_path / "x.parquet")
    expect_input_error(spar.read, tmp_path / "x.parquet", match=("'power_draw_w'", "numbers"))


def test_truncated_parquet(shared_data: Path, tmp_path: Path) -> None:
    data = (shared_data / BERT).read_bytes()
    (tmp_path / "x.parquet").write_bytes(data[: len(data) // 2])
    expect_input_error(spar.read, tmp_path / "x.parquet", match=("x.parquet", "spar"))
