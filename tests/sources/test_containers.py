"""Container/pod attribution from a fake procfs tree (the style of prometheus/client_python's tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasescope.schema import ProcessSample
from phasescope.sources.containers import ContainerResolver, parse_cgroup

CID_A = "a" * 8 + "0123456789abcdef" * 3 + "1234abcd"
CID_B = "b" * 64
CID_C = "c" * 64
UID_A = "0d3c2f1e-9b8a-4c7d-8e6f-5a4b3c2d1e0f"
UID_B = "11111111-2222-3333-4444-555555555555"

V2_SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID_A.replace('-', '_')}.slice/cri-containerd-{CID_A}.scope\n"
)
V2_CGROUPFS = f"0::/kubepods/besteffort/pod{UID_B}/{CID_B}\n"
V1 = (
    f"12:memory:/kubepods/burstable/pod{UID_B}/{CID_C}\n"
    f"11:cpu,cpuacct:/kubepods/burstable/pod{UID_B}/{CID_C}\n"
    f"1:name=systemd:/kubepods/burstable/pod{UID_B}/{CID_C}\n"
)
V2_DOCKER = f"0::/system.slice/docker-{CID_C}.scope\n"
HOST_V2 = "0::/user.slice/user-1000.slice/session-3.scope\n"
HOST_V1 = "12:memory:/user.slice\n1:name=systemd:/user.slice/user-1000.slice/session-3.scope\n"


def test_parse_cgroup_v2_systemd_driver() -> None:
    ref = parse_cgroup(V2_SYSTEMD)
    assert ref is not None
    assert (ref.version, ref.pod_uid, ref.container_id, ref.runtime) == (2, UID_A, CID_A, "cri-containerd")


def test_parse_cgroup_v2_cgroupfs_driver_and_v1() -> None:
    v2 = parse_cgroup(V2_CGROUPFS)
    v1 = parse_cgroup(V1)
    assert v2 is not None and (v2.version, v2.pod_uid, v2.container_id) == (2, UID_B, CID_B)
    assert v1 is not None and (v1.version, v1.pod_uid, v1.container_id) == (1, UID_B, CID_C)


def test_parse_cgroup_docker_and_host_processes() -> None:
    ref = parse_cgroup(V2_DOCKER)
    assert ref is not None and (ref.container_id, ref.pod_uid, ref.runtime) == (CID_C, "", "docker")
    assert parse_cgroup(HOST_V2) is None
    assert parse_cgroup(HOST_V1) is None
    assert parse_cgroup("") is None
    assert parse_cgroup("garbage without colons") is None


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    proc = tmp_path / "proc"
    for pid, text in {101: V2_SYSTEMD, 202: V2_CGROUPFS, 303: V1, 404: HOST_V2, 505: V2_DOCKER}.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    # containerd's OCI bundle for container A names everything.
    task = tmp_path / "containerd" / CID_A
    task.mkdir(parents=True)
    (task / "config.json").write_text(
        json.dumps(
            {
                "annotations": {
                    "io.kubernetes.cri.container-name": "trainer",
                    "io.kubernetes.pod.name": "llm-train-0",
                    "io.kubernetes.pod.namespace": "research",
                }
            }
        )
    )
    # Pod B is known only from the kubelet's log directory (one container there).
    logs = tmp_path / "pods"
    (logs / f"serving_vllm-7d9f_{UID_B}" / "vllm").mkdir(parents=True)
    return {"proc": proc, "containerd": tmp_path / "containerd", "logs": logs}


def _resolver(t: dict[str, Path]) -> ContainerResolver:
    return ContainerResolver(t["proc"], t["logs"], (t["containerd"],))


def test_attribute_from_runtime_bundle_and_pod_logs(tree: dict[str, Path]) -> None:
    r = _resolver(tree)
    a = r.attribute(101)
    assert a is not None and a.labels() == {
        "pod": "llm-train-0",
        "namespace": "research",
        "container": "trainer",
    }
    b = r.attribute(202)
    assert b is not None and b.labels() == {"pod": "vllm-7d9f", "namespace": "serving", "container": "vllm"}
    c = r.attribute(303)  # v1, same pod as B; the pod has one container directory
    assert c is not None and c.labels()["pod"] == "vllm-7d9f"


def test_host_vanished_and_unnamed_processes(tree: dict[str, Path]) -> None:
    r = _resolver(tree)
    assert r.attribute(404) is None  # a host process
    assert r.attribute(999) is None  # vanished between NVML's list and our read
    d = r.attribute(505)  # a plain Docker container: id known, no pod
    assert d is not None and d.container_id == CID_C and d.labels() == {}


def test_device_labels_from_nvml_processes(tree: dict[str, Path]) -> None:
    r = _resolver(tree)
    procs = [
        ProcessSample(0.0, 101, "GPU-a"),
        ProcessSample(0.0, 202, "GPU-b"),
        ProcessSample(0.0, 303, "GPU-b"),  # same pod, other container id: pod/namespace agree
        ProcessSample(0.0, 404, "GPU-c"),
        ProcessSample(0.0, 999, "GPU-c"),
        ProcessSample(0.0, 101, None),
    ]
    labels = r.device_labels(procs)
    assert labels["GPU-a"] == {"pod": "llm-train-0", "namespace": "research", "container": "trainer"}
    assert labels["GPU-b"] == {"pod": "vllm-7d9f", "namespace": "serving", "container": "vllm"}
    assert "GPU-c" not in labels


def test_two_pods_on_one_gpu_drop_the_ambiguous_labels(tree: dict[str, Path]) -> None:
    r = _resolver(tree)
    labels = r.device_labels([ProcessSample(0.0, 101, "GPU-x"), ProcessSample(0.0, 202, "GPU-x")])
    assert labels.get("GPU-x", {}) == {}
