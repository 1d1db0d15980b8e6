"""Which container and Kubernetes pod a host PID belongs to, from `/proc/PID/cgroup` (cgroup v1 and v2).

NVML reports host PIDs. The cgroup path of a PID names its pod UID and container ID, for both kubelet
cgroup drivers and both cgroup versions:

    v2, systemd driver   0::/kubepods.slice/kubepods-burstable.slice/
                           kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
    v2, cgroupfs driver  0::/kubepods/burstable/pod<uid>/<id>
    v1 (one line per controller)  11:memory:/kubepods/besteffort/pod<uid>/<id>
    plain Docker         0::/system.slice/docker-<id>.scope   or   12:cpu:/docker/<id>

Names are not in the cgroup path. They come, in this order, from the container runtime's OCI bundle
(`<containerd task root>/<id>/config.json`, annotations `io.kubernetes.cri.container-name`,
`io.kubernetes.pod.name`, `io.kubernetes.pod.namespace`), then from the kubelet's log directory
(`/var/log/pods/<namespace>_<pod>_<uid>/<container>/`), which gives pod and namespace. A DaemonSet mounts
those host paths read-only (deploy/kubernetes/base/agent-daemonset.yaml). A PID that vanished, or is not in a
container, has no attribution; that is never an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from phasescope.schema import ProcessSample

_ID = r"[0-9a-f]{64}"
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_RE = re.compile(rf"(?:(?:cri-containerd|crio|docker|containerd)-)?({_ID})(?:\.scope)?$")
_MAX_CACHED = 4096  # containers remembered by id
_RUNTIME_RE = re.compile(r"(cri-containerd|crio|docker|containerd)-[0-9a-f]{64}")


@dataclass(frozen=True)
class CgroupRef:
    """What a cgroup file says about one process."""

    version: int  # 1 or 2
    path: str  # the unified (v2) path, or the v1 path that named a container
    pod_uid: str = ""
    container_id: str = ""
    runtime: str = ""  # cri-containerd, crio, docker, or "" when the path does not say


@dataclass(frozen=True)
class Attribution:
    container_id: str
    pod_uid: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""

    def labels(self) -> dict[str, str]:
        out = {"pod": self.pod, "namespace": self.namespace, "container": self.container}
        return {k: v for k, v in out.items() if v}


def merge_labels(attributions: Iterable[Attribution]) -> dict[str, str]:
    """The pod/namespace/container that all of one GPU's containers agree on. A label they disagree on
    (two pods share the GPU) is left out rather than picked: one GPU keeps one set of labels."""
    seen: dict[str, set[str]] = {}
    for att in attributions:
        for k, v in att.labels().items():
            seen.setdefault(k, set()).add(v)
    return {k: next(iter(vs)) for k, vs in seen.items() if len(vs) == 1}


def parse_cgroup(text: str) -> CgroupRef | None:
    """The container a `/proc/PID/cgroup` text places its process in; None for a host process."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    entries = []
    for ln in lines:
        parts = ln.split(":", 2)
        if len(parts) == 3:
            entries.append(parts)
    if not entries:
        return None
    unified = [p for h, c, p in entries if h == "0" and c == ""]
    version = 2 if unified and len(entries) == 1 else 1
    # v2: the one unified path. v1 (or hybrid): the first controller path that names a container.
    candidates = unified if version == 2 else [p for _, _, p in entries]
    for path in candidates:
        last = path.rstrip("/").rsplit("/", 1)[-1]
        m = _CONTAINER_RE.search(last)
        if m is None:
            continue
        pod = _POD_RE.search(path)
        runtime = _RUNTIME_RE.search(last)
        return CgroupRef(
            version=version,
            path=path,
            pod_uid=pod.group(1).replace("_", "-") if pod else "",
            container_id=m.group(1),
            runtime=runtime.group(1) if runtime else ("docker" if "/docker/" in path else ""),
        )
    return None


class ContainerResolver:
    """PID -> Attribution through a procfs tree and the runtime's files; caches by container id."""

    def __init__(
        self,
        proc_root: str | Path = "/proc",
        pod_logs_root: str | Path = "/var/log/pods",
        runtime_roots: tuple[str | Path, ...] = (
            "/run/containerd/io.containerd.runtime.v2.task/k8s.io",
            "/var/lib/docker/containers",
        ),
    ) -> None:
        self.proc_root = Path(proc_root)
        self.pod_logs_root = Path(pod_logs_root)
        self.runtime_roots = tuple(Path(r) for r in runtime_roots)
        self._proc = str(self.proc_root)
        self._cache: dict[str, Attribution] = {}
        self._parsed: dict[bytes, tuple[CgroupRef | None]] = {}
        self._pods: dict[str, tuple[str, str]] | None = None

    def cgroup(self, pid: int) -> CgroupRef | None:
        try:
            with open(f"{self._proc}/{pid}/cgroup", "rb") as fh:  # plain str path: pathlib costs more here
                raw = fh.read()
        except OSError:  # vanished, or not ours to read
            return None
        hit = self._parsed.get(raw)  # the processes of one container share one cgroup text
        if hit is None:
            if len(self._parsed) >= _MAX_CACHED:
                self._parsed.clear()
            hit = self._parsed[raw] = (parse_cgroup(raw.decode(errors="replace")),)
        return hit[0]

    def attribute(self, pid: int) -> Attribution | None:
        ref = self.cgroup(pid)
        if ref is None:
            return None
        hit = self._cache.get(ref.container_id)
        if hit is not None:
            return hit
        att = self._from_runtime(ref) or self._from_pod_logs(ref)
        if att is None:  # not cached: the runtime may not have written the container's files yet
            return Attribution(ref.container_id, ref.pod_uid)
        if len(self._cache) >= _MAX_CACHED:  # containers come and go for as long as the agent runs
            self._cache.clear()
        self._cache[ref.container_id] = att
        return att

    def device_labels(self, processes: list[ProcessSample]) -> dict[str, dict[str, str]]:
        """uuid -> pod/namespace/container of the processes on it; a label several pods share is dropped."""
        by_device: dict[str, list[Attribution]] = {}
        for p in processes:
            if p.device_uuid is None:
                continue
            att = self.attribute(p.pid)
            if att is not None:
                by_device.setdefault(p.device_uuid, []).append(att)
        out = {u: merge_labels(atts) for u, atts in by_device.items()}
        return {u: labels for u, labels in out.items() if labels}

    def _from_runtime(self, ref: CgroupRef) -> Attribution | None:
        for root in self.runtime_roots:
            for name in ("config.json", "config.v2.json"):
                f = root / ref.container_id / name
                try:
                    doc = json.loads(f.read_text(errors="replace"))
                except (OSError, json.JSONDecodeError):
                    continue
                ann = doc.get("annotations") or (doc.get("Config") or {}).get("Labels") or {}
                if not isinstance(ann, dict):
                    continue
                pod = ann.get("io.kubernetes.pod.name") or ann.get("io.kubernetes.cri.sandbox-name", "")
                ns = ann.get("io.kubernetes.pod.namespace") or ann.get(
                    "io.kubernetes.cri.sandbox-namespace", ""
                )
                cont = ann.get("io.kubernetes.container.name") or ann.get(
                    "io.kubernetes.cri.container-name", ""
                )
                if pod or cont:
                    return Attribution(ref.container_id, ref.pod_uid, pod, ns, cont)
        return None

    def _from_pod_logs(self, ref: CgroupRef) -> Attribution | None:
        if not ref.pod_uid:
            return None
        if self._pods is None or ref.pod_uid not in self._pods:
            self._pods = self._scan_pod_logs()
        hit = self._pods.get(ref.pod_uid)
        if hit is None:
            return None
        namespace, pod = hit
        container = self._container_from_logs(namespace, pod, ref)
        return Attribution(ref.container_id, ref.pod_uid, pod, namespace, container)

    def _scan_pod_logs(self) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        try:
            entries = list(self.pod_logs_root.iterdir())
        except OSError:
            return out
        for d in entries:
            parts = d.name.split("_")
            if len(parts) == 3:  # <namespace>_<pod>_<uid>; names cannot hold '_' in Kubernetes
                out[parts[2]] = (parts[0], parts[1])
        return out

    def _container_from_logs(self, namespace: str, pod: str, ref: CgroupRef) -> str:
        """The container name when the pod has exactly one container directory (else unknown: "")."""
        try:
            subdirs = [
                d.name
                for d in (self.pod_logs_root / f"{namespace}_{pod}_{ref.pod_uid}").iterdir()
                if d.is_dir()
            ]
        except OSError:
            return ""
        return subdirs[0] if len(subdirs) == 1 else ""
