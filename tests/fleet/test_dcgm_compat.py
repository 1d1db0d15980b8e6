"""deploy/prometheus/dcgm_compat.yml: dcgm-exporter's names, units and labels from the agent's own series.

Checked three ways: promtool (syntax, and unit tests whose input is what `phasescope serve` wrote while
replaying real dcgm-exporter scrapes, expected back as those scrapes' own values); against the fleet
reader's own dcgm table (`dcgm_prom.FIELDS`: every factor must be its inverse); and end to end, with real
`phasescope serve` agents scraped by Debian's prometheus with the rules loaded, and `phasescope fleet`
reading the same Prometheus without counting a GPU twice.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tests.fleet.harness import (
    PROMETHEUS,
    PROMTOOL,
    REPO,
    Procs,
    agent_command,
    free_port,
    need_tool,
    start_prometheus,
    wait_http,
)

from phasescope.cli.fleet import command as fleet_command
from phasescope.fleet import collect
from phasescope.prom import names as mn
from phasescope.prom.client import PromClient
from phasescope.schema import SIGNALS
from phasescope.sources.replay.dcgm_prom import FIELDS

PROM = REPO / "deploy/prometheus"
RULES = PROM / "dcgm_compat.yml"
UNIT_TESTS = PROM / "dcgm_compat_test.yml"
COMPAT_LABEL = ("exporter", "phasescope-compat")
LABELS_INFO = "phasescope:dcgm_compat_labels:info"
DCGM_PROM = "formats/dcgm-exporter-prom"
# Real telemetry the agents replay (shared data): a dcgm-exporter scrape of an L4 (every DCGM field the
# compat rules publish bar limits and NVLink), one of two A30s in MIG mode (six instances), and a
# sensorguard RTX 3090 training run (power changing every second).
L4 = f"{DCGM_PROM}/cncf__k8s-ai-conformance__kops_TestObservability_AcceleratorMetrics_ViaDCGM_output.prom"
A30_MIG = f"{DCGM_PROM}/NVIDIA__dcgm-exporter__issue-317_excerpt.prom"
TRAINING = "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv"
L4_UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
TRAINING_UUID = "GPU-42e33043-7008-2803-9ba8-9bb9ef7d0845"  # the trace's GPU under test (gpu 0)
# The queries of NVIDIA's Grafana dashboard 12239 (dcgm-exporter grafana/dcgm-exporter-dashboard.json), as
# written there; Grafana fills in $Hostname and $gpu from label_values(DCGM_FI_DEV_FB_FREE, Hostname / gpu).
DASHBOARD_12239 = tuple(
    q.replace("{sel}", '{Hostname=~"$Hostname", gpu=~"$gpu"}')
    for q in (
        "max(DCGM_FI_DEV_GPU_TEMP{sel}) by (Hostname, gpu, uuid)",
        "avg(DCGM_FI_DEV_GPU_TEMP{sel})",
        "max(DCGM_FI_DEV_POWER_USAGE{sel}) by (Hostname, gpu, uuid)",
        "sum(max(DCGM_FI_DEV_POWER_USAGE{sel}) by (gpu))",
        "max(DCGM_FI_DEV_SM_CLOCK{sel} * 1000000) by (Hostname, UUID, gpu)",
        "max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
        "max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{sel}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
        "max(DCGM_FI_DEV_FB_USED{sel}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    )
)
SETTLE_S = 12.0  # scrapes and 1 s rule evaluations after the last agent is up


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    exe = need_tool(PROMTOOL)
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _rules() -> list[dict[str, Any]]:
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    return list(group["rules"])


def _records() -> dict[str, dict[str, Any]]:
    """dcgm field -> its rule."""
    return {r["record"]: r for r in _rules() if r["record"].startswith("DCGM_FI_")}


def _signal_of(rule: dict[str, Any]) -> str:
    """The one schema signal a rule reads (FB_FREE reads two: used is the one FIELDS has no entry for)."""
    names = set(re.findall(r"\bphasescope_gpu_[a-z_]+", rule["expr"])) - {mn.GPU_INFO.name}
    signals = {s for s, m in mn.SIGNAL_METRICS.items() if m.name in names}
    assert len(signals) == len(names), (rule["record"], names)
    return signals.pop() if len(signals) == 1 else ""


# -- promtool -------------------------------------------------------------------------------------------


def test_compat_rules_pass_promtool_check_and_unit_tests() -> None:
    check = _promtool("check", "rules", RULES.name)
    assert check.returncode == 0, check.stdout + check.stderr
    # The unit tests: real agent scrapes in, the replayed dcgm-exporter scrapes' own values and labels out.
    unit = _promtool("test", "rules", UNIT_TESTS.name)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert RULES.name in prom["rule_files"]


def _health_rule(rule: dict[str, Any]) -> bool:
    return any(m.name in rule["expr"] for m in mn.HEALTH_METRICS)


def test_every_rule_reads_agent_metrics_and_is_marked() -> None:
    agent = {m.name for m in (*mn.SIGNAL_METRICS.values(), *mn.HEALTH_METRICS)} | {mn.GPU_INFO.name}
    rules = _rules()
    assert rules[0]["record"] == LABELS_INFO  # evaluated first: the others read it at the same time
    for r in rules:
        read = set(re.findall(r"\bphasescope[_:][A-Za-z0-9_:]*", r["expr"]))
        assert read <= agent | {LABELS_INFO}, (r["record"], read - agent)
        if r["record"] != LABELS_INFO:
            approx = r["record"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # from NVML's utilisation, and says so
            extra = {"approximation": "nvml-gpu-util"} if approx else {}
            assert r["labels"] == {**dict([COMPAT_LABEL]), **extra}, r["record"]  # `phasescope fleet` skips
            assert LABELS_INFO in r["expr"]
    skipped = f'{COMPAT_LABEL[0]}!="{COMPAT_LABEL[1]}"'
    assert skipped == collect.COMPAT_EXCLUDE


def test_every_signal_with_a_dcgm_field_is_published() -> None:
    """Each schema signal the fleet reader maps from a dcgm field is published under that field, or under
    another dcgm field of the same signal (PCIe: both the NVML and the profiling names are)."""
    published = {_signal_of(r) for r in _records().values() if not _health_rule(r)} - {""}
    mapped = {sig for sig, _ in FIELDS.values()}
    assert mapped <= published, mapped - published
    assert published <= set(SIGNALS)


def test_units_are_the_inverse_of_the_fleet_readers(tmp_path: Path) -> None:
    """A promtool unit test built from `dcgm_prom.FIELDS`: the agent's value v of a signal must come out as
    v / factor under every dcgm field the fleet reader maps to that signal with `factor`."""
    records = _records()
    inputs, checks = [], []
    labels = 'uuid="GPU-u",gpu="0",model="M",host="h",job="j",instance="i:1"'
    info = f'{mn.GPU_INFO.name}{{{labels},parent_uuid="",mig_profile=""}}'
    inputs.append({"series": info, "values": "1 1"})
    # A distinct value per signal, so a rule that read the wrong signal fails too.
    values = {s: 3.0 + i for i, s in enumerate(SIGNALS)}
    for s, v in values.items():
        inputs.append({"series": f"{mn.SIGNAL_METRICS[s].name}{{{labels}}}", "values": f"{v} {v}"})
    out = 'gpu="0",UUID="GPU-u",modelName="M",Hostname="h",uuid="GPU-u",job="j",instance="i:1"'
    for field, (signal, factor) in sorted(FIELDS.items()):
        if field not in records:
            continue  # an alias the compat rules do not publish: see test_every_signal_...
        assert _signal_of(records[field]) == signal, field
        checks.append({
            "expr": field, "eval_time": "1m",
            "exp_samples": [{"labels": f'{field}{{{out},exporter="phasescope-compat"}}',
                             "value": values[signal] / factor}],
        })
    assert len(checks) >= 20
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": checks}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    unit = _promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert unit.returncode == 0, unit.stdout[-3000:] + unit.stderr


# dcgm-exporter field -> (the agent's health metric, the label that picks the series, its value in the agent's
# scrape below); dcgm-exporter's units are the agent's (counts, 0/1, C).
HEALTH_FIELDS: dict[str, tuple[mn.MetricName, str]] = {
    "DCGM_FI_DEV_XID_ERRORS": (mn.GPU_LAST_XID, ""),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": (mn.GPU_ECC_ERRORS, 'type="corrected",scope="volatile"'),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (mn.GPU_ECC_ERRORS, 'type="corrected",scope="aggregate"'),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (mn.GPU_ECC_ERRORS, 'type="uncorrected",scope="volatile"'),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (mn.GPU_ECC_ERRORS, 'type="uncorrected",scope="aggregate"'),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (mn.GPU_REMAPPED_ROWS, 'cause="correctable"'),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (mn.GPU_REMAPPED_ROWS, 'cause="uncorrectable"'),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (mn.GPU_ROW_REMAP_FAILURE, ""),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": (mn.GPU_ROW_REMAP_PENDING, ""),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": (mn.GPU_PCIE_REPLAYS, ""),
    "DCGM_FI_DEV_MEMORY_TEMP": (mn.GPU_MEM_TEMPERATURE, ""),
}


def test_every_health_metric_is_published_and_no_longer_listed_unmapped() -> None:
    records = _records()
    health = {f: r for f, r in records.items() if _health_rule(r)}
    assert set(health) == set(HEALTH_FIELDS)
    # dcgm-exporter has no field for an XID count, nor for the critical ones apart.
    assert {m for m, _ in HEALTH_FIELDS.values()} == set(mn.HEALTH_METRICS) - {
        mn.GPU_XID_ERRORS, mn.GPU_CRITICAL_XID_ERRORS, mn.GPU_LAST_CRITICAL_XID}
    for field, (metric, selector) in HEALTH_FIELDS.items():
        assert metric.name in health[field]["expr"] and selector.replace(",", ", ") in health[field]["expr"]
    header = RULES.read_text().split("\ngroups:")[0]
    not_mapped = header.split("# Not mapped")[1]
    assert not [f for f in HEALTH_FIELDS if f in not_mapped]  # published, so no longer called unmapped


@pytest.fixture(scope="module")
def model() -> Any:
    from phasescope.classify.model import PhaseModel

    return PhaseModel.load()


def test_health_from_the_agents_own_scrape(
    shared_data: Path, fake_nvml: Any, model: Any, tmp_path: Path
) -> None:
    """The agent's real /metrics (NvmlSource over the fake NVML: one GPU with every health counter, one
    consumer GPU with PCIe replays only) through the compat rules: each dcgm field carries the agent's
    value under dcgm-exporter's labels, and the consumer GPU gets no ECC, remap or memory temperature."""
    from tests.serve.test_health_metrics import health_agent

    from phasescope.serve.collector import registry_for

    fake, source, agent = health_agent(shared_data, fake_nvml, model)
    fake.xid(1, 79)
    agent.on_tick(source.read())
    text = generate_latest(registry_for(agent, host="node1")).decode()
    source.close()
    keep = {m.name for m in mn.HEALTH_METRICS} | {mn.GPU_INFO.name}
    target = {"job": "phasescope-agent", "instance": "node1:9464"}
    inputs, scraped = [], {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in keep:
                labels = {**s.labels, **target}
                body = ",".join(f'{k}="{v}"' for k, v in labels.items())
                inputs.append({"series": f"{s.name}{{{body}}}", "values": f"{s.value} {s.value}"})
                scraped[(s.name, frozenset(s.labels.items()))] = s.value
    devices = [(d.uuid, str(d.index), d.name, d.host, d.extra["pci_bus_id"]) for d in source.devices()]
    checks = []
    for field, (metric, selector) in HEALTH_FIELDS.items():
        want = dict(re.findall(r'(\w+)="([^"]*)"', selector))
        samples = []
        for uuid, index, name, host, bus_id in devices:
            own = {"uuid": uuid, "gpu": index, "model": name, "host": host, **want}
            value = scraped.get((metric.name, frozenset(own.items())))
            if value is None:
                continue  # the agent has no series: neither does the compat rule
            out = {"gpu": index, "UUID": uuid, "modelName": name, "Hostname": host, "pci_bus_id": bus_id,
                   "uuid": uuid, **target, "exporter": "phasescope-compat"}
            samples.append({"labels": field + "{" + ",".join(f'{k}="{v}"' for k, v in out.items()) + "}",
                            "value": value})
        checks.append({"expr": field, "eval_time": "1m", "exp_samples": samples})
    by_field = {c["expr"]: len(c["exp_samples"]) for c in checks}
    assert by_field["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 1 and by_field["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 2
    xid = next(c for c in checks if c["expr"] == "DCGM_FI_DEV_XID_ERRORS")["exp_samples"]
    assert sorted(s["value"] for s in xid) == [0.0, 79.0]
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": checks}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    unit = _promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert unit.returncode == 0, unit.stdout[-3000:] + unit.stderr


def test_device_named_by_its_own_label_value() -> None:
    """The fleet queries a device by its naming label's value: dcgm-exporter's MIG instance by its parent
    UUID (key `GPU-a/gi3`), the agent's by its uuid as written, also where that is `GPU-a/gi3` (a replayed
    dcgm-exporter scrape); cutting that at `/gi` matched none of its series."""
    dcgm = collect._Device("GPU-a/gi3", "UUID", {"UUID": "GPU-a", "GPU_I_ID": "3"})
    agent = collect._Device("GPU-a/gi3", "uuid", {"uuid": "GPU-a/gi3"})
    assert (dcgm.ident, agent.ident) == ("GPU-a", "GPU-a/gi3")
    assert collect._Device("GPU-b", "uuid").ident == "GPU-b"  # no labels kept: the key


# -- end to end: real agents, real Prometheus -----------------------------------------------------------


def _unit_test_inputs(instance: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The input series of dcgm_compat_test.yml for one target, without the target labels."""
    out = {}
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for s in case["input_series"]:
            name, _, body = s["series"].partition("{")
            labels = dict(re.findall(r'(\w+)="([^"]*)"', body))
            if labels.pop("instance", None) == instance:
                labels.pop("job")
                out[(name, frozenset(labels.items()))] = float(s["values"].split()[0])
    return out


def _scraped(text: str, names: set[str]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in names:
                labels = frozenset((k, v) for k, v in s.labels.items() if v)  # Prometheus drops empty labels
                out[(s.name, labels)] = s.value
    return out


def _instant(url: str, query: str, at: float | None = None) -> list[dict[str, Any]]:
    data = {"query": query, **({"time": f"{at:.3f}"} if at is not None else {})}
    doc = httpx.post(f"{url}/api/v1/query", data=data, timeout=10).json()
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_prometheus_publishes_dcgm_names_and_fleet_counts_each_gpu_once(
    shared_data: Path, tmp_path: Path
) -> None:
    need_tool(PROMETHEUS)
    procs = Procs()
    try:
        agents = {}
        for name, path in (("l4", L4), ("a30-mig", A30_MIG), ("training", TRAINING)):
            port = free_port()
            procs.start(agent_command(shared_data / path, port), tmp_path / f"agent-{name}.log")
            agents[name] = f"127.0.0.1:{port}"
        for name, target in agents.items():
            wait_http(f"http://{target}/metrics", 60, tmp_path / f"agent-{name}.log")
        time.sleep(2)  # the replays' first ticks

        # The unit tests' input is what these agents write: same series, same labels, same values.
        for name, instance in (("l4", "kops-l4:9464"), ("a30-mig", "a30-mig:9464")):
            fixture = _unit_test_inputs(instance)
            live = _scraped(httpx.get(f"http://{agents[name]}/metrics").text, {n for n, _ in fixture})
            assert fixture and fixture == {k: live.get(k) for k in fixture}, name

        targets = ", ".join(f"'{t}'" for t in agents.values())
        config = (
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: ['{RULES}']\n"
            "scrape_configs:\n  - job_name: phasescope-agent\n"
            f"    static_configs:\n      - targets: [{targets}]\n"
        )
        started = time.time()
        url = start_prometheus(procs, tmp_path, config, free_port())
        time.sleep(SETTLE_S)

        # Dashboards' and alerts' query, by dcgm-exporter's label, against the agent's own power series:
        # at the rule's evaluation time the value is one of the agent's samples just before it.
        for uuid in (L4_UUID, TRAINING_UUID):
            (got,) = _instant(url, f'DCGM_FI_DEV_POWER_USAGE{{UUID="{uuid}"}}')
            at, value = float(got["value"][0]), float(got["value"][1])
            (stamp,) = _instant(url, f'timestamp(DCGM_FI_DEV_POWER_USAGE{{UUID="{uuid}"}})', at)
            evaluated = float(stamp["value"][1])
            (own,) = _instant(url, f'{mn.SIGNAL_METRICS["power"].name}{{uuid="{uuid}"}}[3s]', evaluated)
            samples = [(float(t), float(v)) for t, v in own["values"]]
            assert value in [v for _, v in samples], (uuid, value, samples)
            assert got["metric"]["exporter"] == "phasescope-compat" and got["metric"]["uuid"] == uuid
        (l4,) = _instant(url, f'DCGM_FI_DEV_POWER_USAGE{{UUID="{L4_UUID}"}}')
        assert {k: l4["metric"][k] for k in ("gpu", "modelName", "Hostname")} == {
            "gpu": "0", "modelName": "NVIDIA L4", "Hostname": "i-030791dc5a37cd257"}  # as dcgm-exporter's
        assert float(l4["value"][1]) == 16.365  # the replayed dcgm-exporter scrape's own value

        # Every panel of dashboard 12239 has data, with its variables filled in as Grafana does.
        variable = {"match[]": "DCGM_FI_DEV_FB_FREE"}
        hosts = httpx.get(f"{url}/api/v1/label/Hostname/values", params=variable).json()
        assert hosts["data"] == ["i-030791dc5a37cd257"]  # the agents that report memory total and host
        gpus = httpx.get(f"{url}/api/v1/label/gpu/values", params=variable).json()
        for expr in DASHBOARD_12239:
            query = expr.replace("$Hostname", "|".join(hosts["data"])).replace("$gpu", "|".join(gpus["data"]))
            assert _instant(url, query), expr

        # MIG: dcgm-exporter's shape, the parent's UUID with GPU_I_PROFILE and GPU_I_ID per instance.
        mig = _instant(url, 'DCGM_FI_DEV_SM_CLOCK{GPU_I_PROFILE="1g.6gb"}')
        assert sorted((m["metric"]["UUID"][:12], m["metric"]["GPU_I_ID"]) for m in mig) == [
            ("GPU-265c9814", "3"), ("GPU-265c9814", "4"), ("GPU-265c9814", "5"), ("GPU-265c9814", "6"),
            ("GPU-2d20791a", "3"), ("GPU-2d20791a", "4")]

        # The fleet reader sees the compat series in the same Prometheus but reads only the agent's own.
        assert _instant(url, 'count({exporter="phasescope-compat"})')[0]["value"][1] != "0"
        end = time.time()
        result = CliRunner().invoke(
            fleet_command, ["--prometheus", url, "--since", f"{int(end - started) + 1}s", "--json"]
        )
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        live_uuids = {
            s["metric"]["uuid"] for s in _instant(url, f'{mn.GPU_INFO.name}{{job="phasescope-agent"}}')
        }
        got_uuids = [d["uuid"] for d in doc["devices"]]
        assert sorted(got_uuids) == sorted(live_uuids), got_uuids  # 9 GPUs, each once
        # ... and never asks for a compat series (half its query volume on a fleet with the rules loaded).
        with PromClient(url) as client:
            devices = collect.discover(client, started, end)
        assert all(m.startswith(mn.PREFIX) for d in devices for m in d.metrics), [
            sorted(d.metrics) for d in devices]
    finally:
        procs.stop()
    assert all(p.poll() is not None for p in procs.procs)
