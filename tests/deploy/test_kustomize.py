"""deploy/kubernetes: every kustomization rendered by the real `kubectl kustomize` and every object checked.

Core objects are validated against the Kubernetes OpenAPI schemas (`kubernetes-validate`, strict: an unknown
field fails), for the oldest Kubernetes the manifests support (1.28: the StatefulSet pod-index label) and the
newest the package knows. The prometheus-operator objects have no schema there: their selectors and ports
are checked against the objects they must find, and the PrometheusRule's rules by promtool.

`PHASESCOPE_KUBECTL` picks another kubectl: CI runs Debian 12's (1.20, kustomize v2.0), the oldest syntax
the kustomizations must keep rendering with.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from tests.fleet.harness import PROMTOOL, REPO, need_tool

KUBE = REPO / "deploy/kubernetes"
KUSTOMIZATIONS = sorted(p.parent.relative_to(KUBE).as_posix() for p in KUBE.rglob("kustomization.yaml"))
OVERLAY = "overlays/kube-prometheus-stack"
SCHEMA_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
KUBECTL = os.environ.get("PHASESCOPE_KUBECTL", "/usr/bin/kubectl")
MONITORING = "monitoring.coreos.com/v1"

Obj = dict[str, Any]


@cache
def render(kustomization: str) -> tuple[Obj, ...]:
    exe = need_tool(KUBECTL)
    out = subprocess.run([exe, "kustomize", str(KUBE / kustomization)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, f"{exe} kustomize {kustomization}:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def find(objs: tuple[Obj, ...], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: tuple[Obj, ...], kind: str, name: str | None = None) -> Obj:
    (found,) = find(objs, kind, name)
    return found


def pod_templates(objs: tuple[Obj, ...]) -> Iterator[Obj]:
    for o in objs:
        if o["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
            yield o


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


# -- the Pod Security Standards' restricted profile, as far as these manifests can touch it ---------------

_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}


def restricted_violations(pod: Obj) -> list[str]:
    """What in `pod` (a pod spec) the `restricted` Pod Security Standard forbids, plus a writable root
    filesystem, which this project requires of the fleet as well."""
    bad = [f"{k}: true" for k in ("hostPID", "hostIPC", "hostNetwork") if pod.get(k)]
    bad += [f"volume {v['name']}: {k}" for v in pod.get("volumes", []) for k in v
            if k != "name" and k not in _RESTRICTED_VOLUMES]
    pod_ctx = pod.get("securityContext", {})
    for c in pod.get("initContainers", []) + pod["containers"]:
        ctx = c.get("securityContext", {})
        where = f"container {c['name']}"
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            bad.append(f"{where}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            bad.append(f"{where}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{where}: seccompProfile {seccomp}")
        if ctx.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{where}: allowPrivilegeEscalation is not false")
        if ctx.get("privileged"):
            bad.append(f"{where}: privileged")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{where}: capabilities not dropped (drop: [ALL])")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{where}: capabilities added {caps['add']}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"{where}: hostPort")
        if ctx.get("readOnlyRootFilesystem") is not True:
            bad.append(f"{where}: root filesystem writable")
    return bad


# -- every kustomization --------------------------------------------------------------------------------


def test_kustomizations_found() -> None:
    assert {"base", OVERLAY} <= set(KUSTOMIZATIONS)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_renders_and_core_objects_pass_the_kubernetes_schemas(kustomization: str) -> None:
    objs = render(kustomization)
    assert objs
    core = [o for o in objs if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    for version in SCHEMA_VERSIONS:
        for o in core:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{kustomization}: {o['kind']}/{o['metadata']['name']} (Kubernetes {version}): "
                            f"{exc.message} at {'/'.join(map(str, exc.path))}")
    # Namespaced objects land only in namespaces the kustomization creates, or the stack's own.
    made = {o["metadata"]["name"] for o in find(objs, "Namespace")}
    for o in objs:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") in made | {"monitoring"}, (o["kind"], o["metadata"])


def test_the_schema_check_can_fail() -> None:
    sts = json.loads(json.dumps(one(render("base"), "StatefulSet")))
    sts["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, SCHEMA_VERSIONS[0], strict=True)


# -- base: security and resources -----------------------------------------------------------------------


def test_fleet_pod_passes_restricted_and_its_namespace_enforces_it() -> None:
    objs = render("base")
    sts = one(objs, "StatefulSet", "phasescope-fleet")
    assert restricted_violations(sts["spec"]["template"]["spec"]) == []
    ns = one(objs, "Namespace", sts["metadata"]["namespace"])
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_agent_needs_exactly_what_it_documents() -> None:
    objs = render("base")
    ds = one(objs, "DaemonSet", "phasescope-agent")
    pod = ds["spec"]["template"]["spec"]
    # hostPID (NVML's host PIDs) and the two read-only hostPath mounts (pod names) are all it breaks ...
    assert sorted(restricted_violations(pod)) == [
        "hostPID: true", "volume containerd-tasks: hostPath", "volume pod-logs: hostPath"]
    (c,) = pod["containers"]
    assert all(m["readOnly"] for m in c["volumeMounts"] if m["name"] in ("containerd-tasks", "pod-logs"))
    # ... so its own namespace admits `privileged`, and nothing else of ours runs there.
    ns = ds["metadata"]["namespace"]
    labels = one(objs, "Namespace", ns)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert [w["metadata"]["name"] for w in pod_templates(objs) if w["metadata"]["namespace"] == ns] == [
        "phasescope-agent"]
    # It sees every GPU through the NVIDIA runtime, and takes none from the device plugin.
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert not any(k.startswith("nvidia.com/") for part in c["resources"].values() for k in part)


def test_every_container_has_requests_and_a_memory_limit() -> None:
    for w in pod_templates(render("base")):
        for c in w["spec"]["template"]["spec"]["containers"]:
            res = c["resources"]
            assert {"cpu", "memory"} <= res["requests"].keys(), (w["metadata"]["name"], res)
            assert "memory" in res["limits"], (w["metadata"]["name"], res)


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_agent_requests_cover_its_measured_use() -> None:
    # docs/BENCHMARKS.md quotes benchmarks/bench_agent_resources.py's peak RSS; the request must not be
    # below it (the scheduler would pack nodes on a figure the agent exceeds) nor its limit below the request.
    text = (REPO / "docs/BENCHMARKS.md").read_text()
    peak = re.search(r"agent RSS, peak over (\d+) min[^|]*\| (\d+) MiB", text)
    assert peak is not None, "docs/BENCHMARKS.md lost the agent's measured RSS"
    ds = one(render("base"), "DaemonSet", "phasescope-agent")
    res = ds["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert _mib(res["requests"]["memory"]) >= int(peak.group(2))
    assert _mib(res["limits"]["memory"]) >= 1.5 * _mib(res["requests"]["memory"])


def test_no_api_access_no_rbac() -> None:
    objs = render("base")
    assert not [o for o in objs if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in find(objs, "ServiceAccount")}
    for w in pod_templates(objs):
        pod = w["spec"]["template"]["spec"]
        sa = accounts[(w["metadata"]["namespace"], pod["serviceAccountName"])]
        assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False


def test_services_reach_the_pods() -> None:
    objs = render("base")
    for svc in find(objs, "Service"):
        (w,) = [w for w in pod_templates(objs) if w["metadata"]["namespace"] == svc["metadata"]["namespace"]
                and matches(svc["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        ports = {p["name"] for c in w["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
        if w["kind"] == "StatefulSet":
            assert w["spec"]["serviceName"] == svc["metadata"]["name"]


# -- the kube-prometheus-stack overlay ------------------------------------------------------------------


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("phasescope_deploy_generate", KUBE / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_current() -> None:
    for path, text in _generator().rendered().items():
        assert path.read_text() == text, f"{path.name} is stale: run python deploy/kubernetes/generate.py"


def test_prometheusrule_is_rules_yml_and_passes_promtool(tmp_path: Path) -> None:
    objs = render(OVERLAY)
    rule = one(objs, "PrometheusRule")
    source = yaml.safe_load((REPO / "deploy/prometheus/rules.yml").read_text())
    assert rule["spec"]["groups"] == source["groups"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run([need_tool(PROMTOOL), "check", "rules", str(tmp_path / "rules.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_monitors_find_their_targets_and_the_stack_finds_them() -> None:
    objs = render(OVERLAY)
    release = one(objs, "PrometheusRule")["metadata"]["labels"]["release"]
    sm = one(objs, "ServiceMonitor", "phasescope-agent")
    pm = one(objs, "PodMonitor", "phasescope-fleet")
    for m in (sm, pm):
        assert m["apiVersion"] == MONITORING and m["metadata"]["labels"]["release"] == release
    # The ServiceMonitor selects the agent's Service in its own namespace, by a port the Service names.
    (svc,) = [s for s in find(objs, "Service") if s["metadata"]["namespace"] == sm["metadata"]["namespace"]
              and matches(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # The PodMonitor selects the fleet's pods, by a container port they name.
    (sts,) = [w for w in pod_templates(objs) if w["metadata"]["namespace"] == pm["metadata"]["namespace"]
              and matches(pm["spec"]["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])]
    ports = {p["name"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= ports
    # Both keep the GPU's workload labels (honorLabels) and drop their own pod's, and the agent's series get
    # the node and the declared use the alerts read.
    for e in [*sm["spec"]["endpoints"], *pm["spec"]["podMetricsEndpoints"]]:
        assert e["honorLabels"] is True
        assert {"action": "labeldrop", "regex": "pod|namespace|container"} in e["relabelings"]
    targets = {r.get("targetLabel") for r in sm["spec"]["endpoints"][0]["relabelings"]}
    assert {"node", "declared_use"} <= targets
    assert sm["spec"]["endpoints"][0]["interval"] == "1s"  # the phase model needs 1 s samples


def test_dashboard_configmap_for_the_grafana_sidecar() -> None:
    objs = render(OVERLAY)
    (cm,) = [o for o in find(objs, "ConfigMap") if o["metadata"].get("labels", {}).get("grafana_dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"  # the sidecar reads its own namespace by default
    (text,) = cm["data"].values()
    assert json.loads(text) == json.loads((REPO / "deploy/grafana/phasescope-fleet.json").read_text())


def test_fleet_queries_the_stacks_prometheus() -> None:
    sts = one(render(OVERLAY), "StatefulSet", "phasescope-fleet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PROMETHEUS_URL"] == "http://prometheus-operated.monitoring.svc:9090"
    assert "$(PROMETHEUS_URL)" in c["args"]
    # The overlay changes only that: the pod still passes restricted.
    assert restricted_violations(sts["spec"]["template"]["spec"]) == []
