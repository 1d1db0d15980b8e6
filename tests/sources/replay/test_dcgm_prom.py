from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phasescope.schema import MIB
from phasescope.sources.replay import dcgm_prom, read
from tests.sources.replay.conftest import expect_input_error

D = "formats/dcgm-exporter-prom"
T4 = D + "/cncf__k8s-ai-conformance__ericsson-ccd_accelerator_metrics.prom"


def test_full_scrape_in_base_units(shared_data: Path) -> None:
    (t,) = dcgm_prom.read(shared_data / T4)
    assert t.device.uuid == "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"
    assert t.device.name == "Tesla T4" and t.device.index == 0 and t.device.host == "cp-bm14r7"
    assert len(t) == 1
    assert t["gpu_util"][0] == pytest.approx(0.91) and t["mem_util"][0] == pytest.approx(0.73)
    assert t["mem_used"][0] == 5120 * MIB
    assert t["mem_total"][0] == (5120 + 9791 + 447) * MIB and "mem_total_derived" in t.meta
    assert t["power"][0] == pytest.approx(68.244) and t["temperature"][0] == 74
    assert t["sm_clock"][0] == 660e6 and t["mem_clock"][0] == 5000e6
    assert t["energy"][0] == pytest.approx(15152422938 / 1000)  # mJ -> J
    assert t["pcie_tx"][0] == 4791810 and t["pcie_rx"][0] == 6935930
    assert t["tensor_active"][0] == pytest.approx(0.005822) and t["dram_active"][0] == pytest.approx(0.092781)
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in t.meta["unmapped_fields"]
    assert t.meta["driver_version"] == "590.48.01"


def test_mig_instances_are_separate_devices(shared_data: Path) -> None:
    traces = dcgm_prom.read(shared_data / D / "NVIDIA__dcgm-exporter__issue-317_excerpt.prom")
    assert len(traces) == 6
    parents = {t.device.parent_uuid for t in traces}
    assert parents == {"GPU-265c9814-6156-355b-e589-ff2064894f16", "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49"}
    assert len({t.device.uuid for t in traces}) == 6
    assert traces[0].device.extra["GPU_I_PROFILE"] == "1g.6gb"
    assert all(t["sm_clock"][0] == 1440e6 for t in traces)


def test_varying_label_sets_and_hosts(shared_data: Path) -> None:
    traces = dcgm_prom.read(shared_data / D / "DataDog__integrations-core__metrics.txt")
    by_uuid = {t.device.uuid: t for t in traces}
    assert set(by_uuid) == {
        "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",
        "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5",
        "GPU-abc",
    }
    first = by_uuid["GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"]
    assert first["power"][0] == pytest.approx(8.969) and first["energy"][0] == pytest.approx(128996.013)
    assert first.meta["unlabelled_samples_ignored"] > 0  # the fixture's dummy lines without labels
    assert np.isfinite(by_uuid["GPU-abc"]["dram_active"][0])


def test_pod_labels_and_only_unmapped_fields(shared_data: Path) -> None:
    traces = dcgm_prom.read(shared_data / D / "NVIDIA__dcgm-exporter__pr-736_excerpt.prom")
    assert [t.device.name for t in traces] == ["NVIDIA RTX 2000 Ada Generation", "NVIDIA A30"]
    assert traces[1].device.extra["pod"] == "triton-server-f7cb5d77-95xcf"
    assert traces[0].present_signals() == [] and "DCGM_FI_DEV_ENC_UTIL" in traces[0].meta["unmapped_fields"]


PROM = (
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} {u0}\n'
    'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2"} 10\n'
    'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1"} 100.5\n'
)


def test_concatenated_scrapes_and_curl_noise(write) -> None:  # type: ignore[no-untyped-def]
    noise = "  % Total    % Received % Xferd  Average Speed\n100  1234  100  1234    0     0   99k      0\n"
    text = noise + PROM.replace("{u0}", "50") + "$ curl localhost:9400/metrics\n" + PROM.replace("{u0}", "70")
    p = write("s.prom", text)
    assert read(p)[0].meta["format"] == "dcgm-prom"
    g1, _ = dcgm_prom.read(p)
    assert g1["gpu_util"].tolist() == pytest.approx([0.5, 0.7]) and g1.time.tolist() == [0.0, 30.0]
    assert g1.meta["skipped_lines"] == 3 and g1.meta["clock"] == "scrape"
    (h, _) = read(p, "dcgm-prom:interval=5")
    assert h.time.tolist() == [0.0, 5.0]


def test_sample_timestamps(write) -> None:  # type: ignore[no-untyped-def]
    p = write(
        "s.prom",
        'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-1"} 100 1700000000000\n'
        'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-1"} 110 1700000001500\n',
    )
    (t,) = dcgm_prom.read(p)
    assert t.time.tolist() == [1700000000.0, 1700000001.5] and t.meta["clock"] == "unix"


def test_older_pcie_throughput_fields_are_kb_per_second(write) -> None:  # type: ignore[no-untyped-def]
    # DCGM_FI_DEV_PCIE_*_THROUGHPUT (older exporters) is KB/s, 1 KB = 1000 bytes (PROF_PCIE_* is bytes/s).
    p = write(
        "s.prom",
        'DCGM_FI_DEV_PCIE_TX_THROUGHPUT{UUID="GPU-1"} 341\nDCGM_FI_DEV_PCIE_RX_THROUGHPUT{UUID="GPU-1"} 12\n',
    )
    (t,) = dcgm_prom.read(p)
    assert t["pcie_tx"][0] == 341_000 and t["pcie_rx"][0] == 12_000


def test_garbage_value_names_line(write) -> None:  # type: ignore[no-untyped-def]
    p = write("s.prom", PROM.replace("{u0}", "5O"))
    expect_input_error(dcgm_prom.read, p, match=(str(p), "line 3", "DCGM_FI_DEV_GPU_UTIL", "a number", "5O"))


def test_truncated_line(write) -> None:  # type: ignore[no-untyped-def]
    p = write("s.prom", PROM.replace("{u0}", "5") + 'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GP')
    expect_input_error(dcgm_prom.read, p, match=(str(p), "line 6", "a Prometheus sample"))
