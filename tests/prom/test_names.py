"""Metric names follow the agreed scheme (common interface) and Prometheus naming practice."""

from __future__ import annotations

import re

from phasescope.prom import names as mn
from phasescope.schema import SIGNALS

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def test_agreed_names() -> None:
    m = mn.SIGNAL_METRICS
    assert m["power"].name == "phasescope_gpu_power_watts"
    assert m["mem_used"].name == "phasescope_gpu_mem_used_bytes"
    assert m["gpu_util"].name == "phasescope_gpu_util_ratio"  # the signal's own `gpu_` is not repeated
    assert m["sm_clock"].name == "phasescope_gpu_sm_clock_hertz"
    assert m["temperature"].name == "phasescope_gpu_temperature_celsius"
    assert m["pcie_rx"].name == "phasescope_gpu_pcie_rx_bytes_per_second"
    assert (m["energy"].name, m["energy"].kind) == ("phasescope_gpu_energy_joules_total", "counter")
    assert m["energy"].family == "phasescope_gpu_energy_joules"  # prometheus_client adds _total itself
    throttle = m["throttle_reasons"]
    assert (throttle.name, throttle.kind) == ("phasescope_gpu_throttle_reasons", "gauge")
    assert mn.PHASE_PROBABILITY.name == "phasescope_gpu_phase_probability"
    assert mn.PHASE_CONFIDENCE.name == "phasescope_gpu_phase_confidence"
    assert mn.SOURCE_UP.name == "phasescope_source_up"
    assert mn.SCRAPE_DURATION.name == "phasescope_scrape_duration_seconds"
    assert mn.DEVICE_LABELS == ("uuid", "gpu", "model", "host")
    assert mn.GPU_POD_INFO.name == "phasescope_gpu_pod_info"
    assert mn.GPU_PROCESS_INFO.name == "phasescope_gpu_process_info"
    assert mn.GPU_INFO.name == "phasescope_gpu_info"
    assert mn.GPU_INFO_LABELS == ("parent_uuid", "mig_profile", "pci_bus_id", "node")
    assert mn.POD_LABELS == ("pod", "namespace", "container")
    assert mn.TRAINING_ALARM.name == "phasescope_gpu_training_alarm"
    assert (mn.IDLE_HELD.name, mn.IDLE_HELD.kind) == ("phasescope_gpu_idle_held", "gauge")
    # A point in time is a *_time_seconds gauge (as process_start_time_seconds), so time() - x is its age.
    assert mn.TRAINING_ALARM_START.name == "phasescope_gpu_training_alarm_start_time_seconds"


def test_host_figures_are_not_named_as_gpu_figures() -> None:
    # The host source's pseudo-device keeps CPU utilisation and RAM in the GPU columns; its names must not.
    assert {m.name for m in mn.HOST_METRICS.values()} == {
        "phasescope_host_cpu_util_ratio",
        "phasescope_host_memory_used_bytes",
        "phasescope_host_memory_total_bytes",
    }
    assert set(mn.HOST_METRICS) <= set(SIGNALS) and "uuid" not in mn.HOST_LABELS


def test_every_signal_has_a_valid_name_counters_end_in_total() -> None:
    all_metrics = [*mn.SIGNAL_METRICS.values(), mn.PHASE_PROBABILITY, mn.PHASE_CONFIDENCE, mn.PHASE_CURRENT,
                   mn.PHASE_SECONDS, mn.PHASE_ENERGY, mn.SOURCE_UP, mn.SOURCE_ERRORS, mn.SAMPLER_TICKS,
                   mn.SAMPLER_SKIPPED, mn.SCRAPE_DURATION, mn.GPU_POD_INFO, mn.GPU_PROCESS_INFO,
                   mn.GPU_INFO, mn.TRAINING_ALARM, mn.TRAINING_ALARM_START, mn.IDLE_HELD,
                   *mn.HOST_METRICS.values()]
    assert set(mn.SIGNAL_METRICS) == set(SIGNALS)
    names = [m.name for m in all_metrics]
    assert len(set(names)) == len(names)
    for m in all_metrics:
        assert NAME.match(m.name) and m.name.startswith("phasescope_"), m.name
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert m.help


def test_telemetry_kpi_gauges_are_named_in_base_units_and_unique() -> None:
    kpi = {k: m.name for k, m in mn.TELEMETRY_KPI_METRICS.items()}
    assert kpi["step_period_s"] == "phasescope_gpu_step_period_seconds"
    assert kpi["stall_fraction"] == "phasescope_gpu_stall_ratio"
    assert kpi["busy_fraction"] == "phasescope_gpu_busy_ratio"
    assert kpi["burst_rate_per_s"] == "phasescope_gpu_burst_rate_per_second"
    assert mn.STEP_PERIOD_CONFIDENCE.name == "phasescope_gpu_step_period_confidence"
    every = [*mn.SIGNAL_METRICS.values(), *mn.HEALTH_METRICS, *mn.HOST_METRICS.values(),
             *mn.TELEMETRY_KPI_METRICS.values(), mn.STEP_PERIOD_CONFIDENCE, mn.PHASE_CONFIDENCE]
    names = [m.name for m in every]
    assert len(set(names)) == len(names)
    for m in (*mn.TELEMETRY_KPI_METRICS.values(), mn.STEP_PERIOD_CONFIDENCE):
        assert NAME.match(m.name) and m.kind == "gauge" and m.help


def test_no_two_metrics_share_a_name_and_legacy_names_stay_apart() -> None:
    """Dropping a signal's leading `gpu_` must not land on another metric's name; the names older agents
    wrote are readable (fleet/names.py) but never exported again."""
    every = [v for v in vars(mn).values() if isinstance(v, mn.MetricName)]
    every += [*mn.SIGNAL_METRICS.values(), *mn.HOST_METRICS.values(), *mn.TELEMETRY_KPI_METRICS.values()]
    names = {id(m): m.name for m in every}
    assert len(set(names.values())) == len(names)
    assert not set(mn.LEGACY_SIGNAL_NAMES) & set(names.values())
    assert all(mn.SIGNAL_METRICS[s].name != old for old, s in mn.LEGACY_SIGNAL_NAMES.items())
    assert not any(m.name.startswith("phasescope_gpu_gpu_") for m in every)
