"""deploy/: every file parsed, schema-checked, and where a real checker exists, checked by it (promtool)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any

import click
import httpx
import numpy as np
import pytest
import yaml
from tests.fleet.harness import (
    PROMTOOL,
    REPO,
    Procs,
    backfill,
    free_port,
    labelled_trace,
    need_tool,
    start_prometheus,
    wait_http,
)

from phasescope.fleet.shard import parse_shard
from phasescope.identity import ENV_VARS
from phasescope.prom import names as mn
from phasescope.sources.containers import ContainerResolver

DEPLOY = REPO / "deploy"
PROM = DEPLOY / "prometheus"
# Series a rule reads before phasescope exports them (issue 19's process evidence). Each must still be
# missing: once it exists, remove it here.
PENDING_METRICS: set[str] = set()


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


def _substitute(arg: str, env: dict[str, str]) -> str:
    """`arg` with each `$(VAR)` replaced as Kubernetes does from the container's environment."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


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
    # The fleet-wide alerts (dcgm-exporter and the fleet service, no agent needed) too.
    fleet = {"PhasescopeTargetDown", "PhasescopeGPUThermalThrottling", "PhasescopeGPUPowerThrottling",
             "PhasescopeFleetGPUHeldIdle", "PhasescopeGPUPhaseDisagreement"}
    assert fleet <= alerts
    rules = yaml.safe_load((PROM / "rules.yml").read_text())
    for r in (r for g in rules["groups"] for r in g["rules"] if r.get("alert") in health):
        assert _referenced(r["expr"]) <= {m.name for m in mn.HEALTH_METRICS}, r["alert"]


def test_rules_read_only_metrics_that_exist() -> None:
    known = _known_metrics()
    assert not PENDING_METRICS & known, "exported now: remove from PENDING_METRICS"
    known |= PENDING_METRICS
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
    # The fleet-wide alerts never aggregate away where a GPU is: no `by (...)` without node and namespace
    # (`without`, or no aggregation at all, keeps them).
    (fleet,) = [g for g in rules["groups"] if g["name"] == "phasescope-fleet-alerts"]
    for r in fleet["rules"]:
        for by in re.findall(r"\bby\s*\(([^)]*)\)", r["expr"]):
            assert {"node", "namespace"} <= {x.strip() for x in by.split(",")}, (r["alert"], by)


def test_complete_prometheus_config_passes_promtool() -> None:
    out = _promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    for f in (PROM / "targets").glob("*.json"):
        groups = json.loads(f.read_text())
        assert all(isinstance(g["targets"], list) and g["targets"] for g in groups)


def test_kubernetes_scrape_jobs(tmp_path: Path) -> None:
    doc = yaml.safe_load((PROM / "scrape.yml").read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    ds = _docs(DEPLOY / "kubernetes/base/agent-daemonset.yaml")[0]
    ss = _docs(DEPLOY / "kubernetes/base/fleet-statefulset.yaml")[0]
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
    (ds,) = _docs(DEPLOY / "kubernetes/base/agent-daemonset.yaml")
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
    (ss,) = _docs(DEPLOY / "kubernetes/base/fleet-statefulset.yaml")
    c = _check_workload(ss, "StatefulSet")
    env = {e["name"]: e for e in c["env"]}
    shards = int(env["SHARDS"]["value"])
    assert shards == ss["spec"]["replicas"]
    assert "pod-index" in env["SHARD"]["valueFrom"]["fieldRef"]["fieldPath"]
    for i in range(shards):  # what Kubernetes substitutes for $(VAR) in each replica
        values = {k: e["value"] for k, e in env.items() if "value" in e} | {"SHARD": str(i)}
        args = [_substitute(a, values) for a in c["args"]]
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
    (ds,) = _docs(DEPLOY / "kubernetes/base/agent-daemonset.yaml")
    (ss,) = _docs(DEPLOY / "kubernetes/base/fleet-statefulset.yaml")
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
    for w in (ds, ss):
        pod_ctx = w["spec"]["template"]["spec"]["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] == int(user)


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


_VARIABLE = re.compile(r"\$\{?([A-Za-z_]\w*)\}?")  # `$host`, `${host}`; not a regex group like `$1`
DASHBOARD = DEPLOY / "grafana/phasescope-fleet.json"


def _dashboard_targets(dash: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in dash["panels"] for t in p["targets"]]


def test_grafana_dashboard(tmp_path: Path) -> None:
    dash = json.loads(DASHBOARD.read_text())
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
    # Importable: the one data source input Grafana's import asks for is the `datasource` variable's default,
    # and every panel and query uses that variable (a provisioned copy, which skips __inputs, then falls back
    # to the default Prometheus data source instead of failing on an unresolved input).
    assert [(i["name"], i["type"], i["pluginId"]) for i in dash["__inputs"]] == [
        ("DS_PROMETHEUS", "datasource", "prometheus")]
    (ds_var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["current"]["value"] == "${DS_PROMETHEUS}"
    assert DASHBOARD.read_text().count("${DS_PROMETHEUS}") == 1
    source = {"type": "prometheus", "uid": "${" + ds_var["name"] + "}"}
    assert all(p["datasource"] == source for p in panels)
    assert all(t["datasource"] == source for _, t in _dashboard_targets(dash))
    # Per-GPU fleet verdicts: a state timeline and a table of the fleet service's phase series.
    verdicts = {p["type"] for p in panels
                if any("phasescope_fleet_gpu_phase{" in t["expr"] for t in p["targets"])}
    assert {"state-timeline", "table"} <= verdicts
    variables = {v["name"] for v in dash["templating"]["list"]}
    known = _known_metrics()
    exprs = []
    for title, t in _dashboard_targets(dash):
        used = set(_VARIABLE.findall(t["expr"]))
        assert used <= variables | {"__rate_interval", "__interval"}, used
        assert _referenced(t["expr"]) <= known, (title, _referenced(t["expr"]) - known)
        exprs.append(_VARIABLE.sub(".*", t["expr"]))
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


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_every_dashboard_query_returns_data(shared_data: Path, tmp_path: Path) -> None:
    """The dashboard on the stack it is written for: a Prometheus holding only dcgm-exporter's series (as
    kube-prometheus-stack's ServiceMonitor stores them, collected and scraped every second) and scraping a
    real `phasescope fleet --serve` that classifies them. Every query of every panel, and the host
    variable, must return data; no agent runs."""
    from tests.fleet.test_servicemonitor import ROWS, TARGET, scraped

    from phasescope.schema import DeviceInfo

    end = float(np.floor(time.time()) - 30)  # recent: the fleet's live series and these overlap in a query
    traces = []
    for uuid, (path, gpu, pod, ns, _label) in ROWS.items():
        trace, _row = labelled_trace(shared_data, path, gpu)
        extra = {"pod": pod, "namespace": ns, "container": "main"} if pod else {}
        dev = DeviceInfo(uuid, "NVIDIA GeForce RTX 3090", gpu, "node-a", extra=extra)
        traces.append(scraped(trace, dev, end, 1.0, 1.0))
    backfill(traces, tmp_path, "dcgm", targets={"node-a": TARGET})
    fleet_port = free_port()
    config = (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: phasescope-fleet\n"
        "    honor_labels: true\n"  # as the overlay's PodMonitor: the GPU's pod and namespace, not fleet's
        f"    static_configs:\n      - targets: ['127.0.0.1:{fleet_port}']\n"
    )
    procs = Procs()
    try:
        url = start_prometheus(procs, tmp_path, config, free_port())
        procs.start([sys.executable, "-m", "phasescope", "fleet", "--prometheus", url, "--serve",
                     "--since", "600s", "--every", "10s", "--port", str(fleet_port), "--workers", "1",
                     "--price-gpu-hour", "2.5"], tmp_path / "fleet.log")
        wait_http(f"http://127.0.0.1:{fleet_port}/metrics", 120, tmp_path / "fleet.log")

        def query(expr: str, start: float) -> list[dict[str, Any]]:
            r = httpx.get(f"{url}/api/v1/query_range", timeout=30,
                          params={"query": expr, "start": start, "end": time.time(), "step": "5s"})
            assert r.status_code == 200, (expr, r.text)
            return [s for s in r.json()["data"]["result"] if any(v != "NaN" for _, v in s["values"])]

        # The first pass (model load, queries, classification) is slow on a busy machine: wait for its
        # series on the fleet's own /metrics, then for Prometheus to have scraped them.
        log = tmp_path / "fleet.log"
        deadline = time.monotonic() + 300
        while "phasescope_fleet_gpu_phase{" not in httpx.get(f"http://127.0.0.1:{fleet_port}/metrics").text:
            assert time.monotonic() < deadline, f"no fleet pass after 300 s:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        while not query("phasescope_fleet_gpu_phase", end - 60):
            assert time.monotonic() < deadline, "Prometheus did not scrape the fleet service"
            time.sleep(1)
        time.sleep(3)  # a few scrapes of the pass
        dash = json.loads(DASHBOARD.read_text())
        (host_var,) = [v for v in dash["templating"]["list"] if v["name"] == "host"]
        found = re.fullmatch(r"label_values\((\w+), (\w+)\)", host_var["query"])
        assert found is not None, host_var["query"]
        metric, label = found.groups()
        hosts = httpx.get(f"{url}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=30)
        assert hosts.json()["data"] == ["node-a"], hosts.text
        empty = []
        for title, t in _dashboard_targets(dash):
            expr = _VARIABLE.sub(lambda m: {"host": "node-a"}.get(m.group(1), "1m"), t["expr"])
            if not query(expr, end - 600):
                empty.append((title, t["refId"], expr))
        assert empty == [], empty
        # The verdicts are the workload's: the namespace panel lists the pods' namespaces, not the exporter's.
        namespaces = {s["metric"].get("namespace", "") for s in query(
            "sum by (namespace) (phasescope_fleet_gpu_phase)", end - 60)}
        assert namespaces == {r[3] for r in ROWS.values()}
    finally:
        procs.stop()


@pytest.mark.parametrize("path", sorted(p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*.y*ml")))
def test_every_yaml_file_parses(path: str) -> None:
    assert _docs(DEPLOY / path)


def test_shlex_roundtrip_of_agent_args() -> None:
    # The README/FLEET.md show the agent's command line; it must be what the DaemonSet runs.
    (ds,) = _docs(DEPLOY / "kubernetes/base/agent-daemonset.yaml")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "phasescope " + shlex.join(args) in (REPO / "docs/FLEET.md").read_text()
