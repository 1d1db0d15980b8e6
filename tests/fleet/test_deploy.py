"""deploy/: every file parsed, schema-checked, and where a real checker exists, checked by it (promtool)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from tests.fleet.harness import PROMTOOL, REPO, need_tool

from phasescope.fleet.shard import parse_shard
from phasescope.identity import ENV_VARS
from phasescope.prom import names as mn
from phasescope.sources.containers import ContainerResolver

DEPLOY = REPO / "deploy"
PROM = DEPLOY / "prometheus"


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    exe = need_tool(PROMTOOL)
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _known_metrics() -> set[str]:
    names = {m.name for m in vars(mn).values() if isinstance(m, mn.MetricName)}
    names |= {m.name for m in mn.SIGNAL_METRICS.values()}
    service = (REPO / "src/phasescope/fleet/service.py").read_text()
    names |= set(re.findall(r'"(phasescope_fleet_[a-z_]+)"', service))
    rules = yaml.safe_load((PROM / "rules.yml").read_text())
    names |= {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    return names


def _referenced(expr: str) -> set[str]:
    return set(re.findall(r"\bphasescope[_:][A-Za-z0-9_:]*", expr))


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _command(name: str) -> click.Command:
    from phasescope.cli import cli

    cmd = cli.get_command(click.Context(cli), name)
    assert cmd is not None, name
    return cmd


def _parse_args(args: list[str]) -> click.Context:
    """The args as the real command line parses them (an unknown or malformed option fails here)."""
    cmd = _command(args[0])
    return cmd.make_context(args[0], list(args[1:]), resilient_parsing=False)


# -- Prometheus -----------------------------------------------------------------------------------------


def test_rules_pass_promtool_check_and_unit_tests() -> None:
    check = _promtool("check", "rules", "rules.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    # The unit tests include: an inference-only GPU training for 4 minutes does not alert, for 5 it does.
    unit = _promtool("test", "rules", "rules_test.yml")
    assert unit.returncode == 0, unit.stdout + unit.stderr
    tests = yaml.safe_load((PROM / "rules_test.yml").read_text())["tests"]
    alerts = {t["alertname"] for case in tests for t in case.get("alert_rule_test", [])}
    assert "PhasescopeInferenceOnlyGPUTraining" in alerts
    assert "PhasescopeInferenceOnlyGPUTrainingStarted" in alerts  # the onset alarm's early warning
    # GPU health: each alert has a unit test (fires on its counter, not on a GPU without it).
    health = {"PhasescopeGPUCriticalXid", "PhasescopeGPUXidErrors", "PhasescopeGPUUncorrectableEccErrors",
              "PhasescopeGPURowRemapFailure", "PhasescopeGPURowRemapPending"}
    assert health <= alerts
    rules = yaml.safe_load((PROM / "rules.yml").read_text())
    for r in (r for g in rules["groups"] for r in g["rules"] if r.get("alert") in health):
        assert _referenced(r["expr"]) <= {m.name for m in mn.HEALTH_METRICS}, r["alert"]


def test_rules_read_only_metrics_that_exist() -> None:
    known = _known_metrics()
    rules = yaml.safe_load((PROM / "rules.yml").read_text())
    inference_alert = started_alert = None
    for g in rules["groups"]:
        for r in g["rules"]:
            assert _referenced(r["expr"]) <= known, (
                r.get("record") or r.get("alert"),
                _referenced(r["expr"]),
            )
            if r.get("alert") == "PhasescopeInferenceOnlyGPUTraining":
                inference_alert = r
            if r.get("alert") == "PhasescopeInferenceOnlyGPUTrainingStarted":
                started_alert = r
    assert inference_alert is not None and inference_alert["for"] == "5m"
    assert 'declared_use="inference"' in inference_alert["expr"]
    # The early alert reads the agent's latched onset alarm directly: no `for` delay on top of it.
    assert started_alert is not None and "for" not in started_alert
    assert _referenced(started_alert["expr"]) == {mn.TRAINING_ALARM.name}
    assert 'declared_use="inference"' in started_alert["expr"]


def test_complete_prometheus_config_passes_promtool() -> None:
    out = _promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    for f in (PROM / "targets").glob("*.json"):
        groups = json.loads(f.read_text())
        assert all(isinstance(g["targets"], list) and g["targets"] for g in groups)


def test_kubernetes_scrape_jobs(tmp_path: Path) -> None:
    doc = yaml.safe_load((PROM / "scrape.yml").read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    ds = _docs(DEPLOY / "kubernetes/agent-daemonset.yaml")[0]
    ss = _docs(DEPLOY / "kubernetes/fleet-statefulset.yaml")[0]
    for job, workload in (("phasescope-agent", ds), ("phasescope-fleet", ss)):
        keep = next(r for r in jobs[job]["relabel_configs"] if r.get("action") == "keep")
        assert keep["regex"] == workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    # The pod label that declares a use becomes the `declared_use` label the alert reads.
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    declared = next(
        r for r in jobs["phasescope-agent"]["relabel_configs"] if r.get("target_label") == "declared_use"
    )
    sanitized = {"__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", k) for k in pod_labels}
    assert declared["source_labels"][0] in sanitized
    assert jobs["phasescope-agent"]["scrape_interval"] == "1s"
    # Debian's prometheus is built without Kubernetes discovery: check everything else with static targets.
    for j in doc["scrape_configs"]:
        j.pop("kubernetes_sd_configs")
        j["static_configs"] = [{"targets": ["127.0.0.1:9464"]}]
    (tmp_path / "p.yml").write_text(yaml.safe_dump(doc))
    out = _promtool("check", "config", "p.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


# -- Kubernetes -----------------------------------------------------------------------------------------


def _check_workload(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    assert doc["apiVersion"] == "apps/v1" and doc["kind"] == kind
    spec = doc["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] and container["name"]
    mounts = {m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"] for v in spec["template"]["spec"].get("volumes", [])}
    assert mounts <= volumes
    return container


def test_agent_daemonset() -> None:
    (ds,) = _docs(DEPLOY / "kubernetes/agent-daemonset.yaml")
    c = _check_workload(ds, "DaemonSet")
    pod = ds["spec"]["template"]
    assert pod["spec"]["hostPID"] is True  # NVML's PIDs are host PIDs; /proc/PID/cgroup needs them
    ctx = _parse_args(c["args"])
    port = ctx.params["port"]
    assert ctx.params["host"] == "0.0.0.0"
    assert c["ports"][0]["containerPort"] == port == int(pod["metadata"]["annotations"]["prometheus.io/port"])
    # The host paths the attribution reads are mounted read-only where ContainerResolver looks.
    defaults = ContainerResolver()
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in (defaults.pod_logs_root, defaults.runtime_roots[0]):
        assert mounts[str(path)]["readOnly"] is True
    # The agent names its GPUs' host by the node (phasescope.identity), which survives a rollout.
    env = {e["name"]: e for e in c["env"]}
    assert "NODE_NAME" in ENV_VARS
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_fleet_statefulset_shards_by_pod_index() -> None:
    (ss,) = _docs(DEPLOY / "kubernetes/fleet-statefulset.yaml")
    c = _check_workload(ss, "StatefulSet")
    env = {e["name"]: e for e in c["env"]}
    shards = int(env["SHARDS"]["value"])
    assert shards == ss["spec"]["replicas"]
    assert "pod-index" in env["SHARD"]["valueFrom"]["fieldRef"]["fieldPath"]
    for i in range(shards):  # what Kubernetes substitutes for $(VAR) in each replica
        args = [a.replace("$(SHARD)", str(i)).replace("$(SHARDS)", str(shards)) for a in c["args"]]
        ctx = _parse_args(args)
        assert ctx.params["serve"] is True
        shard = parse_shard(ctx.params["shard_text"])
        assert shard is not None and (shard.index, shard.count) == (i, shards)
        assert c["ports"][0]["containerPort"] == ctx.params["port"]


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        word, _, rest = text.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def _exec_form(instructions: list[tuple[str, str]], name: str) -> list[str]:
    (args,) = [a for i, a in instructions if i == name]  # exactly one, or the last would silently win
    value = json.loads(args)  # exec form: a JSON array, so no shell sits between Kubernetes and the CLI
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def test_dockerfile_matches_the_manifests() -> None:
    ins = _dockerfile()
    assert ins[0] == ("FROM", "python:3.11-slim")
    assert _exec_form(ins, "ENTRYPOINT") == ["phasescope"]
    (ds,) = _docs(DEPLOY / "kubernetes/agent-daemonset.yaml")
    (ss,) = _docs(DEPLOY / "kubernetes/fleet-statefulset.yaml")
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    fleet = ss["spec"]["template"]["spec"]["containers"][0]
    # The image's default command is the agent's, exactly as the DaemonSet spells it, and the CLI parses it.
    cmd = _exec_form(ins, "CMD")
    assert cmd == agent["args"]
    assert _parse_args(cmd).params["host"] == "0.0.0.0"
    exposed = {int(p) for i, a in ins if i == "EXPOSE" for p in a.split()}
    assert exposed == {agent["ports"][0]["containerPort"], fleet["ports"][0]["containerPort"]}
    # Both manifests run the tag the build comment produces: phasescope:<the package's version>.
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version is not None
    tag = f"phasescope:{version.group(1)}"
    assert agent["image"] == fleet["image"] == tag
    assert f"-t {tag} " in (DEPLOY / "Dockerfile").read_text()
    # Non-root, by numeric uid so that Kubernetes' runAsNonRoot can verify it.
    (user,) = [a for i, a in ins if i == "USER"]
    assert user.isdigit() and int(user) != 0
    for c in (agent, fleet):
        assert c["securityContext"]["runAsNonRoot"] is True


def test_dockerfile_installs_what_the_agent_needs() -> None:
    ins = _dockerfile()
    pyproject = (REPO / "pyproject.toml").read_text()
    installs = [a for i, a in ins if i == "RUN" and "pip install" in a]
    extras = re.search(r'pip install [^\n]*"\.\[([a-z,]+)\]"', " ".join(installs))
    assert extras is not None
    assert "web" in extras.group(1).split(",")  # serve's app and /metrics
    for extra in extras.group(1).split(","):
        assert re.search(rf"^{extra} = \[", pyproject, re.M), extra
    assert re.search(r'^\s*"nvidia-ml-py', pyproject, re.M)  # NVML bindings come with the package
    for i, a in ins:
        if i == "COPY":
            for src in a.split()[:-1]:
                assert (REPO / src).exists(), src  # the build context is the repo root
    # LightGBM's shared library needs the OpenMP runtime, which python:3.11-slim lacks.
    import lightgbm

    lib = Path(lightgbm.__file__).parent / "lib" / "lib_lightgbm.so"
    if lib.exists() and b"libgomp.so.1" in lib.read_bytes():
        assert any(i == "RUN" and "apt-get install" in a and "libgomp1" in a for i, a in ins)


# -- Grafana --------------------------------------------------------------------------------------------


def test_grafana_dashboard(tmp_path: Path) -> None:
    dash = json.loads((DEPLOY / "grafana/phasescope-fleet.json").read_text())
    assert dash["uid"] and isinstance(dash["schemaVersion"], int)
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
        boxes.append((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for a, b in combinations(boxes, 2):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], ("panels overlap", a, b)
    variables = {v["name"] for v in dash["templating"]["list"]}
    known = _known_metrics()
    exprs = []
    for p in panels:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", t["expr"]))
            assert used <= variables | {"__rate_interval", "__interval"}, used
            assert _referenced(t["expr"]) <= known, (p["title"], _referenced(t["expr"]) - known)
            exprs.append(re.sub(r"\$\{?\w+\}?", ".*", t["expr"]))
    # Every query must be valid PromQL: promtool parses each as a recording rule.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    (tmp_path / "dash_rules.yml").write_text(yaml.safe_dump(rules))
    out = _promtool("check", "rules", "dash_rules.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", sorted(p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*.y*ml")))
def test_every_yaml_file_parses(path: str) -> None:
    assert _docs(DEPLOY / path)


def test_shlex_roundtrip_of_agent_args() -> None:
    # The README/FLEET.md show the agent's command line; it must be what the DaemonSet runs.
    (ds,) = _docs(DEPLOY / "kubernetes/agent-daemonset.yaml")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "phasescope " + shlex.join(args) in (REPO / "docs/FLEET.md").read_text()
