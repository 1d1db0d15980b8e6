"""`nvidia-smi -q` dumps repeated into one file (`nvidia-smi -q -l 1 > log`). Inputs follow the layout
nvidia-smi prints: 'GPU Power Readings' with 'Power Draw' (drivers 530+), 'Power Readings' before."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MHZ, MIB
from phasescope.sources.replay import detect, read
from phasescope.sources.replay import nvidia_smi_q as q
from tests.sources.replay.conftest import expect_input_error

BANNER = "\n==============NVSMI LOG==============\n\n"


def gpu_section(bus: str, uuid: str, util: str, used: str, power: str, *, mig: bool = False) -> str:
    mig_devices = (
        "    MIG Devices\n"
        "        MIG Device\n"
        "            Index                         : 0\n"
        "            GPU Instance ID               : 1\n"
        "            FB Memory Usage\n"
        "                Total                     : 19968 MiB\n"
        "                Used                      : 13 MiB\n"
        if mig
        else "    MIG Devices                           : None\n"
    )
    return f"""\
GPU {bus}
    Product Name                          : NVIDIA A100-SXM4-40GB
    Product Brand                         : NVIDIA
    Display Mode                          : Disabled
    Persistence Mode                      : Enabled
    MIG Mode
        Current                           : {"Enabled" if mig else "Disabled"}
        Pending                           : {"Enabled" if mig else "Disabled"}
{mig_devices}    GPU UUID                              : {uuid}
    Minor Number                          : 0
    PCI
        Bus                               : 0x07
        Bus Id                            : {bus}
        GPU Link Info
            PCIe Generation
                Max                       : 4
                Current                   : 4
        Tx Throughput                     : 1000 KB/s
        Rx Throughput                     : 2000 KB/s
    Fan Speed                             : N/A
    Performance State                     : P0
    FB Memory Usage
        Total                             : 40960 MiB
        Reserved                          : 634 MiB
        Used                              : {used}
        Free                              : 39092 MiB
    BAR1 Memory Usage
        Total                             : 65536 MiB
        Used                              : 1 MiB
        Free                              : 65535 MiB
    Compute Mode                          : Default
    Utilization
        Gpu                               : {util}
        Memory                            : 10 %
        Encoder                           : 0 %
        Decoder                           : 0 %
    Temperature
        GPU Current Temp                  : 45 C
        GPU Shutdown Temp                 : 92 C
    GPU Power Readings
        Power Draw                        : {power}
        Current Power Limit               : 400.00 W
        Default Power Limit               : 400.00 W
    Clocks
        Graphics                          : 1410 MHz
        SM                                : 1410 MHz
        Memory                            : 1215 MHz
    Max Clocks
        Graphics                          : 1980 MHz
        SM                                : 1980 MHz
        Memory                            : 1593 MHz
    Processes
        GPU instance ID                   : N/A
        Compute instance ID               : N/A
        Process ID                        : 41234
            Type                          : C
            Name                          : python
            Used GPU Memory               : 9000 MiB

"""


def dump(second: int, gpus: list[str]) -> str:
    return (
        BANNER
        + f"Timestamp                                 : Mon Dec  7 10:00:{second:02d} 2026\n"
        + "Driver Version                            : 550.54.15\n"
        + "CUDA Version                              : 12.4\n\n"
        + f"Attached GPUs                             : {len(gpus)}\n"
        + "".join(gpus)
    )


def two_gpu_log(n: int) -> str:
    return "".join(
        dump(k, [gpu_section("00000000:07:00.0", "GPU-2b7b5f1c-0000-4c2a-9f0e-1a2b3c4d5e6f", f"{35 + k} %",
                             f"{1234 + k} MiB", f"{62 + k}.50 W"),
                 gpu_section("00000000:0F:00.0", "GPU-9a8b7c6d-1111-4c2a-9f0e-1a2b3c4d5e6f", "0 %", "4 MiB",
                             "N/A", mig=True)])
        for k in range(n)
    )


def utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def test_repeated_dumps_two_gpus(write) -> None:  # type: ignore[no-untyped-def]
    p = write("q.log", two_gpu_log(3))
    assert detect(p) == "nvidia-smi-q"
    g0, g1 = read(p)
    assert g0.device.uuid == "GPU-2b7b5f1c-0000-4c2a-9f0e-1a2b3c4d5e6f" and g0.device.index == 0
    assert g1.device.index == 1 and g1.device.extra["pci_bus_id"] == "00000000:0F:00.0"
    assert g0.time.tolist() == [utc("2026-12-07 10:00:00") + k for k in range(3)]
    assert g0["gpu_util"].tolist() == pytest.approx([0.35, 0.36, 0.37])
    assert g0["mem_used"].tolist() == [(1234 + k) * MIB for k in range(3)]  # not BAR1's, not a MIG's
    assert g0["mem_total"][0] == 40960 * MIB and g0["mem_util"][0] == pytest.approx(0.10)
    assert g0["power"].tolist() == [62.5, 63.5, 64.5] and g0["power_limit"][0] == 400
    assert g0["temperature"][0] == 45
    assert g0["sm_clock"][0] == 1410 * MHZ and g0["mem_clock"][0] == 1215 * MHZ  # 'Clocks', not 'Max Clocks'
    assert g0["pcie_tx"][0] == 1000 * 1000 and g0["pcie_rx"][0] == 2000 * 1000
    assert np.isnan(g1["power"]).all() and g1["mem_used"][0] == 4 * MIB  # the MIG instance's 13 MiB is not it


def test_older_power_readings_and_missing_values(write) -> None:  # type: ignore[no-untyped-def]
    old = gpu_section("00000000:01:00.0", "GPU-11111111-2222-3333-4444-555555555555", "[N/A]", "N/A", "N/A")
    old = old.replace("    GPU Power Readings\n        Power Draw                        : N/A\n"
                      "        Current Power Limit               : 400.00 W\n",
                      "    Power Readings\n        Power Management                  : Supported\n"
                      "        Power Draw                        : 250.10 W\n"
                      "        Enforced Power Limit              : 300.00 W\n")
    (g,) = read(write("old.txt", dump(0, [old]) + dump(5, [old])))
    assert g["power"].tolist() == [250.1, 250.1] and g["power_limit"][0] == 300
    assert np.isnan(g["gpu_util"]).all() and np.isnan(g["mem_used"]).all()


def test_only_some_sections(write) -> None:  # type: ignore[no-untyped-def]
    # `nvidia-smi -q -d POWER`: the dump holds only the power section
    section = ("GPU 00000000:07:00.0\n    GPU Power Readings\n"
               "        Power Draw                        : 61.00 W\n"
               "        Current Power Limit               : 400.00 W\n\n")
    (g,) = read(write("power.txt", dump(0, [section]) + dump(1, [section])))
    assert g.present_signals() == ["power", "power_limit"] and g.device.uuid.startswith("file:")


def test_cut_last_dump_is_dropped_with_one_line(write, caplog) -> None:  # type: ignore[no-untyped-def]
    full = two_gpu_log(3)
    third = two_gpu_log(2)
    cases = {
        "inside the last GPU section": full[: full.rindex("    Temperature")],
        "before the second GPU section": full[: full.rindex("GPU 00000000:0F:00.0")],
        "mid-line, no line break": full[: full.rindex("Rx Throughput") + 20],
    }
    for why, text in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="phasescope.sources.replay"):
            traces = read(write("cut.log", text))
        assert [len(t) for t in traces] == [2, 2], why
        said = [r.getMessage() for r in caplog.records if "cut off" in r.getMessage()]
        assert len(said) == 1 and f"from line {third.count(chr(10)) + 2}" in said[0], (why, said)


def test_bad_input_is_one_line_with_its_line(write) -> None:  # type: ignore[no-untyped-def]
    good = two_gpu_log(2)
    gpu_35 = "Gpu                               : 35 %"
    no_unit = good.replace(gpu_35, gpu_35[:-2], 1)
    line = good[: good.index(gpu_35)].count("\n") + 1
    expect_input_error(
        read, write("unit.log", no_unit), match=(f"line {line}", "'Utilization / Gpu'", "unit of ratio")
    )
    bad_time = good.replace("Mon Dec  7 10:00:01 2026", "yesterday", 1)
    expect_input_error(read, write("time.log", bad_time), match=("date like",))
    attached = "Attached GPUs                             : "
    short = good.replace(attached + "2", attached + "3", 1)
    expect_input_error(read, write("short.log", short), match=("line 2", "3 GPU section"))
    expect_input_error(q.read, write("none.txt", "GPU 0\n"), match=("at least one nvidia-smi -q dump",))
    only = good[: good.index("    Temperature")]  # the one dump, cut off
    expect_input_error(read, write("only.log", only), match=("line 2", "one complete nvidia-smi -q dump"))


def test_sniff_leaves_other_logs_alone(shared_data: Path) -> None:
    for f in sorted((shared_data / "formats").rglob("*")):
        if f.is_file():
            assert not q.sniff(f), f


def test_newer_power_keys_and_a_gpu_that_drops_out(write) -> None:  # type: ignore[no-untyped-def]
    # Drivers 550+: no plain 'Power Draw'; the instantaneous reading is taken over the 1 s average.
    def newer(bus: str, uuid: str) -> str:
        return gpu_section(bus, uuid, "50 %", "100 MiB", "N/A").replace(
            "        Power Draw                        : N/A\n",
            "        Average Power Draw                : 300.00 W\n"
            "        Instantaneous Power Draw          : 310.00 W\n",
        )

    a = newer("00000000:07:00.0", "GPU-aaaaaaaa-0000-0000-0000-000000000000")
    b = newer("00000000:0F:00.0", "GPU-bbbbbbbb-0000-0000-0000-000000000000")
    # GPU 0 falls off the bus in the second dump: GPU 1 must not take its place.
    g0, g1 = read(write("drop.log", dump(0, [a, b]) + dump(1, [b]) + dump(2, [a, b])))
    assert g0.device.uuid.startswith("GPU-aaaa") and len(g0) == 2 and g0.device.index == 0
    assert g1.device.uuid.startswith("GPU-bbbb") and len(g1) == 3 and g1.device.index == 1
    assert g1["power"].tolist() == [310.0] * 3
