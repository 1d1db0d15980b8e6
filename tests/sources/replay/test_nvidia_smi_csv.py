from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MIB
from phasescope.sources.replay import nvidia_smi_csv as smi
from phasescope.sources.replay import read
from tests.sources.replay.conftest import expect_input_error

H100 = "nvidia-smi-h100-training/ckpt1.csv"
NOHEADER = "formats/nvidia-smi-csv-noheader"
CANDY_QUERY = (
    "index,uuid,name,pci.bus_id,driver_version,utilization.gpu,utilization.memory,memory.total,memory.used,"
    "memory.free,temperature.gpu,temperature.memory,power.draw,power.limit,clocks.gr,clocks.mem,clocks.max.gr,"
    "clocks.max.mem,fan.speed,pstate,pcie.link.gen.current,pcie.link.width.current,encoder.stats.sessionCount"
)


def _unix(text: str) -> float:
    return datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def test_h100_interleaved_eight_gpus(shared_data: Path) -> None:
    traces = smi.read(shared_data / H100)
    assert len(traces) == 8
    assert {len(t) for t in traces} == {6807}  # 54456 rows / 8
    g0, g1 = traces[0], traces[1]
    # rows 1, 2 and 9 of the file: gpu0 then gpu1, then gpu0's second sample
    assert g0.time[0] == pytest.approx(_unix("2025/07/27 00:22:27.858"))
    assert g0["power"][0] == pytest.approx(71.25) and g0["mem_used"][0] == 130 * MIB
    assert g1["power"][0] == pytest.approx(72.48) and g1["mem_used"][0] == 17 * MIB
    assert g0["power"][1] == pytest.approx(75.97) and g0["mem_used"][1] == 108 * MIB
    assert g0.rate_hz() == pytest.approx(10, rel=0.2)
    assert [t.meta["gpu_index"] for t in traces] == list(range(8))
    assert g0.device.uuid == "file:ckpt1#0" and g0.meta["run"] == "ckpt1"
    # real training on all 8: each GPU reaches high utilisation, > 200 W and ~40 GiB; a wrong split
    # would mix GPU rows and break the per-GPU continuity of memory checked below.
    assert all(t["gpu_util"].max() >= 0.9 and np.nanmax(t["power"]) > 200 for t in traces)
    assert all(35 * 2**30 < np.nanmax(t["mem_used"]) < 45 * 2**30 for t in traces)
    assert all(np.mean(np.abs(np.diff(t["mem_used"])) > 1 * 2**30) < 0.01 for t in traces)


@pytest.mark.parametrize(
    "name",
    [
        "ckpt1.csv",
        "ckpt100.csv",
        "power-trace_2025-07-26-23-32-09.csv",
        "power-trace_2025-07-27-00-22-27.csv",
    ],
)
def test_gpu_count_inferred_for_every_h100_file(shared_data: Path, name: str) -> None:
    traces = smi.read(shared_data / "nvidia-smi-h100-training" / name)
    assert len(traces) == 8
    t = traces[0].time
    assert np.all(np.diff(t) > 0.05)  # one GPU's samples are a sweep apart, not ms apart


def test_gpus_option_forces_the_count(shared_data: Path) -> None:
    traces = read(shared_data / H100, "nvidia-smi-csv:gpus=4")
    assert len(traces) == 4 and len(traces[0]) == 54456 // 4


def test_noheader_nounits_common_recipe(shared_data: Path) -> None:
    traces = smi.read(shared_data / NOHEADER / "dst915__llama.cpp__gpu_stats.csv")
    assert len(traces) == 4 and all(len(t) == 97 for t in traces)
    assert traces[0]["mem_used"][0] == 11409 * MIB and traces[3]["mem_used"][0] == 13325 * MIB
    assert traces[0]["gpu_util"][0] == 0
    assert traces[0].time[0] == pytest.approx(_unix("2025/09/08 14:14:37.120"))


def test_noheader_ambiguous_asks_for_columns(shared_data: Path) -> None:
    p = shared_data / NOHEADER / "sugarcraft__candy-top__skynet2_query-gpu-noheader-nounits.csv"
    expect_input_error(smi.read, p, match=(str(p), "columns="))


def test_noheader_with_columns_option(shared_data: Path) -> None:
    p = shared_data / NOHEADER / "sugarcraft__candy-top__skynet2_query-gpu-noheader-nounits.csv"
    traces = read(p, f"nvidia-smi-csv:columns={CANDY_QUERY}")
    assert len(traces) == 4
    g2 = traces[2]
    assert g2.device.uuid == "GPU-d9a18a51-6b47-71b3-44aa-dfd4448a0e88"
    assert g2.device.name == "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    assert g2.device.index == 2 and g2.device.extra["pci_bus_id"] == "00000000:81:00.0"
    assert g2["power"][0] == pytest.approx(299.95) and g2["power_limit"][0] == 300
    assert g2["mem_used"][0] == 48243 * MIB and g2["mem_total"][0] == 97887 * MIB
    assert g2["sm_clock"][0] == 1147e6 and g2["mem_clock"][0] == 13365e6
    assert g2["gpu_util"][0] == 1.0 and g2["temperature"][0] == 79


def test_power_throttle_noheader_with_columns(shared_data: Path) -> None:
    p = (
        shared_data
        / NOHEADER
        / "sugarcraft__candy-top__skynet2_query-gpu-power-throttle-noheader-nounits.csv"
    )
    cols = (
        "index,power.draw.average,power.draw.instant,clocks_throttle_reasons.active,memory.reserved,"
        "ecc.mode.current,mig.mode.current"
    )
    traces = read(p, f"nvidia-smi-csv:columns={cols}")
    assert [t.device.index for t in traces] == [0, 1, 2, 3]
    assert traces[0]["power"][0] == pytest.approx(297.37)  # .average preferred over .instant
    assert traces[0]["throttle_reasons"][0] == 4  # 0x0000000000000004


def test_header_with_units_and_text_fields(shared_data: Path) -> None:
    p = (
        shared_data
        / "formats/nvidia-smi-csv/XueSongTap__XueSongTap.github.io__2024-01-04-nvidia-smi-more_gpu-log.csv"
    )
    traces = smi.read(p)
    assert len(traces) == 4  # one sweep of 4 A10s, then the next sweep's first row
    assert [len(t) for t in traces] == [2, 1, 1, 1]
    g0 = traces[0]
    assert g0["temperature"][0] == 25 and g0["mem_total"][0] == 23028 * MIB
    assert g0["mem_used"].tolist() == [21 * MIB, 21 * MIB]


def test_units_in_header_only_index_column_and_missing_markers(write) -> None:  # type: ignore[no-untyped-def]
    p = write(
        "q.csv",
        (
            "index, uuid, utilization.gpu [%], memory.used [MiB], power.draw [W], clocks.sm [MHz]\n"
            "0, GPU-aaaa-1, 55, 1024, [N/A], 1410\n"
            "1, GPU-bbbb-2, [Not Supported], 2048, 250.5, 1395\n"
            "0, GPU-aaaa-1, 60, 1024, 100.25, 1410\n"
        ),
    )
    traces = smi.read(p)
    assert [t.device.uuid for t in traces] == ["GPU-aaaa-1", "GPU-bbbb-2"]
    a, b = traces
    assert a.meta["clock"] == "sweep" and a.time.tolist() == [0.0, 1.0]
    assert np.isnan(a["power"][0]) and a["power"][1] == 100.25
    assert np.isnan(b["gpu_util"][0]) and b["mem_used"][0] == 2048 * MIB and b["sm_clock"][0] == 1395e6


def test_binary_memory_units_in_header(write) -> None:  # type: ignore[no-untyped-def]
    p = write(
        "m.csv",
        "index, uuid, memory.used [GiB], memory.total [KiB]\n"
        "0, GPU-aaaa-1, 2, 4096\n0, GPU-aaaa-1, 3, 4096\n",
    )
    (t,) = smi.read(p)
    assert t["mem_used"].tolist() == [2 * 1024**3, 3 * 1024**3]
    assert t["mem_total"][0] == 4096 * 1024


def test_units_in_values_without_header_are_mapped_by_unit(write) -> None:  # type: ignore[no-untyped-def]
    p = write(
        "v.csv",
        "2024/01/01 00:00:00.000, 300.5 W, 87 %, 4000 MiB\n"
        "2024/01/01 00:00:01.000, 310.0 W, 90 %, 4100 MiB\n",
    )
    (t,) = smi.read(p)
    assert t["power"].tolist() == [300.5, 310.0] and t["gpu_util"][1] == pytest.approx(0.9)
    assert t.time[1] - t.time[0] == pytest.approx(1.0)


def test_garbage_number_names_row_and_field(write) -> None:  # type: ignore[no-untyped-def]
    p = write(
        "g.csv", "timestamp, power.draw [W]\n2024/01/01 00:00:00.000, 1.0 W\n2024/01/01 00:00:01.000, 1.x W\n"
    )
    expect_input_error(smi.read, p, match=(str(p), "row 2", "'power.draw'", "a number", "1.x W"))


def test_bad_timestamp(write) -> None:  # type: ignore[no-untyped-def]
    p = write("t.csv", "timestamp, power.draw [W]\nyesterday, 1.0 W\n")
    expect_input_error(smi.read, p, match=(str(p), "row 1", "'timestamp'", "yesterday"))


def test_truncated_last_row(shared_data: Path, write, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """A log whose logger was killed mid-line: the cut row goes, every complete row is read. The same cut row
    with rows after it (the logger started again) goes too, and one line names it."""
    text = (shared_data / H100).read_text()[:5000]
    whole = text[: text.rindex("\n") + 1]
    cut = smi.read(write("cut.csv", text[: text.rindex(",")]))
    kept = smi.read(write("whole.csv", whole))
    assert [len(t) for t in cut] == [len(t) for t in kept]
    assert sum(len(t) for t in cut) == whole.count("\n") - 1  # every complete row but the header
    assert all(np.array_equal(a["power"], b["power"]) for a, b in zip(cut, kept, strict=True))
    p = write("mid.csv", text[: text.rindex(",")] + "\n" + whole.splitlines()[-1] + "\n")
    line = whole.count("\n") + 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="phasescope.sources.replay"):
        mid = smi.read(p)
    assert sum(len(t) for t in mid) == sum(len(t) for t in kept) + 1
    (said,) = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert f"{p}: 1 row(s) cut off or malformed, not read" in said and f"line {line} (" in said


@pytest.mark.parametrize("unit", ["furlong", "MiB"])
def test_unknown_or_misplaced_unit_in_header(write, unit: str) -> None:  # type: ignore[no-untyped-def]
    p = write("u.csv", f"timestamp, power.draw [{unit}]\n2024/01/01 00:00:00.000, 1.0\n")
    expect_input_error(smi.read, p, match=(str(p), "'power.draw'", "a unit among w, watts, mw, kw"))


def test_kilowatts_in_header(write) -> None:  # type: ignore[no-untyped-def]
    (t,) = smi.read(write("k.csv", "timestamp, power.draw [kW]\n2024/01/01 00:00:00.000, 1.25\n"))
    assert t["power"][0] == 1250.0


def test_unknown_option(write) -> None:  # type: ignore[no-untyped-def]
    p = write("o.csv", "timestamp, power.draw [W]\n2024/01/01 00:00:00.000, 1.0 W\n")
    expect_input_error(read, p, "nvidia-smi-csv:speed=2", match=("option 'speed'", "columns, gpus, interval"))


def test_infer_gpu_count_cases() -> None:
    rng = np.random.default_rng(0)
    # one GPU at 1 Hz with jitter: no sweeps
    assert smi.infer_gpu_count(np.cumsum(1 + rng.normal(0, 0.01, 300))) == 1
    # 3 GPUs, rows 1-3 ms apart, sweeps every 100 ms, plus one long pause
    t = []
    for k in range(200):
        base = k * 0.1 + (5.0 if k > 100 else 0.0)
        t += [base, base + rng.uniform(0, 0.003), base + 0.004]
    assert smi.infer_gpu_count(np.array(t)) == 3
    assert smi.infer_gpu_count(np.array([3.0, 2.0, 1.0])) is None
