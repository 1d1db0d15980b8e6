"""Container/pod attribution from a fake procfs tree (the style of prometheus/client_python's tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasescope.schema import ProcessSample
from phasescope.sources.containers import Attribution, ContainerResolver, merge_labels, parse_cgroup
from tests.sources.fake_procfs import (
    CID_A,
    CID_B,
    CID_C,
    HOST_V1,
    HOST_V2,
    UID_A,
    UID_B,
    V1,
    V2_CGROUPFS,
    V2_DOCKER,
    V2_SYSTEMD,
    build_tree,
    resolver,
)


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
    return build_tree(tmp_path)


def _resolver(t: dict[str, Path]) -> ContainerResolver:
    return resolver(t)


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


def test_two_pods_of_one_namespace_keep_the_namespace() -> None:
    a = Attribution("a" * 64, pod="train-0", namespace="research", container="trainer")
    b = Attribution("b" * 64, pod="eval-0", namespace="research", container="trainer")
    assert merge_labels([a, b]) == {"namespace": "research", "container": "trainer"}
    assert merge_labels([a, Attribution("c" * 64)]) == a.labels()  # an unnamed container says nothing
    assert merge_labels([]) == {}


def test_names_the_runtime_writes_later_are_picked_up(tree: dict[str, Path]) -> None:
    r = _resolver(tree)
    first = r.attribute(505)  # the runtime has not written this container's bundle yet
    assert first is not None and first.labels() == {}
    bundle = tree["containerd"] / CID_C
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps(
            {
                "annotations": {
                    "io.kubernetes.pod.name": "notebook-1",
                    "io.kubernetes.pod.namespace": "lab",
                    "io.kubernetes.container.name": "jupyter",
                }
            }
        )
    )
    later = r.attribute(505)
    assert later is not None and later.labels() == {
        "pod": "notebook-1",
        "namespace": "lab",
        "container": "jupyter",
    }
