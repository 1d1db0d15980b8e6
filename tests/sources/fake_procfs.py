"""A fake procfs and container runtime tree (the style of prometheus/client_python's procfs tests).

PIDs 101 (pod llm-train-0, named by containerd's OCI bundle), 202 and 303 (pod vllm-7d9f, named by the
kubelet's log directory; cgroup v2 and v1), 404 (a host process) and 505 (a plain Docker container).
"""

from __future__ import annotations

import json
from pathlib import Path

from phasescope.sources.containers import ContainerResolver

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


def build_tree(tmp_path: Path) -> dict[str, Path]:
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


def resolver(t: dict[str, Path]) -> ContainerResolver:
    return ContainerResolver(t["proc"], t["logs"], (t["containerd"],))
