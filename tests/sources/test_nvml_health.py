"""GPU health through NVML (ECC, remapped rows, PCIe replays, memory temperature, XID events), served by the
scripted fake replaying real recorded traces: read at a low rate, kept out of the signal matrix, absent (not
0) where a GPU does not offer it, and each XID said once as an event line."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import yaml

from phasescope.schema import MIB, SIGNAL_NAMES
from phasescope.sources.nvml import CRITICAL_XIDS, XID_MEANINGS, NvmlSource

CRITICAL_ALERT = "PhasescopeGPUCriticalXid"
RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus/rules.yml"
ECC = {("corrected", "volatile"): 3, ("corrected", "aggregate"): 41,
       ("uncorrected", "volatile"): 0, ("uncorrected", "aggregate"): 2}




def test_counters_of_a_datacenter_gpu_absent_on_a_consumer_one(fake_nvml, sg_traces, spar_trace):
    """GPU 0 (an RTX 3090 run: no ECC, no remapper, no memory sensor), GPU 1 (the A100 run, every counter)."""
    fake = fake_nvml([sg_traces[0], spar_trace], mem_total_bytes=24576 * MIB)
    fake.set_health(1, ecc=ECC, remapped_rows=(5, 1, 1, 0), pcie_replays=7, mem_temp_c=61)
    fake.set_health(0, pcie_replays=0)  # PCIe replays exist on consumer GPUs too
    src = NvmlSource(health_interval_s=0.0)
    batch = src.read()
    assert batch.values.shape == (2, len(SIGNAL_NAMES))  # not in the signal matrix
    consumer, a100 = (batch.health[d.uuid] for d in src.devices())
    assert a100.ecc == {"corrected": {"volatile": 3, "aggregate": 41},
                        "uncorrected": {"volatile": 0, "aggregate": 2}}
    assert a100.remapped_rows == {"correctable": 5, "uncorrectable": 1}
    assert (a100.remap_pending, a100.remap_failure) == (True, False)
    assert (a100.pcie_replays, a100.mem_temperature_c) == (7, 61.0)
    assert (a100.xid_errors, a100.last_xid, a100.last_xid_time) == (0, 0, None)  # watched, none yet
    # The consumer GPU: what it lacks is absent (None / empty), never a made-up 0.
    assert consumer.ecc == {} and consumer.remapped_rows == {}
    assert consumer.remap_pending is None and consumer.remap_failure is None
    assert consumer.mem_temperature_c is None and consumer.pcie_replays == 0
    # Unsupported: tried once, remembered, never retried nor counted again.
    for _ in range(5):
        fake.advance()
        src.read()
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 4 + 6 * 4  # GPU 0 once per kind, GPU 1 each read
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 1 + 6
    assert src.error_counts()["nvmlDeviceGetTotalEccErrors"] == 4
    assert src.error_counts()["nvmlDeviceGetRemappedRows"] == 1
    unsupported = src.unsupported_calls()[src.devices()[0].uuid]
    assert {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors:uncorrected:volatile",
            "nvmlDeviceGetFieldValues:memtemp"} <= set(unsupported)
    health_calls = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
                    "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetFieldValues:memtemp",
                    "nvmlDeviceRegisterEvents", "nvmlEventSet")
    a100_unsupported = src.unsupported_calls().get(src.devices()[1].uuid, [])
    assert not [c for c in a100_unsupported if c.startswith(health_calls)]
    src.close()


def test_counters_are_read_every_health_interval_not_every_tick(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=24576 * MIB)
    for i in range(2):
        fake.set_health(i, ecc=ECC, pcie_replays=1)
    src = NvmlSource()  # the default interval, 10 s: these ticks all fall inside the first one
    first = src.read()
    fake.set_health(0, pcie_replays=9)
    for _ in range(9):
        fake.advance()
        batch = src.read()
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 4
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == 2
    uuid = src.devices()[0].uuid
    assert batch.health[uuid] is first.health[uuid] and batch.health[uuid].pcie_replays == 1  # the last read
    src.close()


def test_xid_is_one_event_line_and_counted(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=24576 * MIB)
    src = NvmlSource(health_interval_s=0.0)
    src.read()
    gpu1 = src.devices()[1]
    fake.xid(1, 79)
    fake.xid(1, 150)  # not in the table
    fake.advance()
    batch = src.read()
    assert batch.events == [
        f"GPU 1 ({gpu1.uuid}): XID 79 (GPU has fallen off the bus)",
        f"GPU 1 ({gpu1.uuid}): XID 150 (see NVIDIA's XID catalog)",
    ]
    h = batch.health[gpu1.uuid]
    assert (h.xid_errors, h.last_xid) == (2, 150) and h.last_xid_time == batch.time
    assert batch.health[src.devices()[0].uuid].xid_errors == 0
    fake.advance()
    again = src.read()
    assert again.events == [] and again.health[gpu1.uuid].xid_errors == 2  # said once, kept
    assert src.error_counts().get("nvmlEventSetWait_v2", 0) == 0  # "nothing queued" is not a failure
    src.close()
    assert all(s.freed for s in fake.event_sets) and len(fake.event_sets) == 2


def test_xid_before_the_gpu_is_lost_is_said_first_and_kept(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=24576 * MIB)
    src = NvmlSource(health_interval_s=0.0)
    src.read()
    fake.xid(0, 79)
    fake.lose(0, from_tick=1)
    fake.advance()
    batch = src.read()
    uuid = src.devices()[0].uuid
    assert len(batch.events) == 2
    assert batch.events[0].endswith("XID 79 (GPU has fallen off the bus)")
    assert batch.events[1].startswith("GPU lost")
    fake.advance()
    later = src.read()
    assert later.health[uuid].last_xid == 79  # a lost GPU keeps telling why


def test_xid_events_not_supported_are_absent_and_tried_once(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces, mem_total_bytes=24576 * MIB)
    fake.fail("nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)
    src = NvmlSource(health_interval_s=0.0)
    for _ in range(3):
        batch = src.read()
        fake.advance()
    for dev in src.devices():
        assert batch.health[dev.uuid].xid_errors is None and batch.health[dev.uuid].last_xid is None
    assert src.error_counts()["nvmlDeviceRegisterEvents"] == 2  # once per GPU, at start
    assert fake.calls["nvmlEventSetWait_v2"] == 0
    assert all(s.freed for s in fake.event_sets)  # the sets nothing was registered on are not leaked
    src.close()


def test_event_wait_failing_for_good_stops_watching(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces[:1], mem_total_bytes=24576 * MIB)
    fake.fail("nvmlEventSetWait_v2", pynvml.NVML_ERROR_NOT_SUPPORTED, from_tick=1)
    src = NvmlSource(health_interval_s=0.0)
    assert src.read().health[src.devices()[0].uuid].xid_errors == 0
    for _ in range(3):
        fake.advance()
        batch = src.read()
    assert batch.health[src.devices()[0].uuid].xid_errors is None  # no longer known
    assert src.error_counts()["nvmlEventSetWait_v2"] == 1
    src.close()


def test_mig_instances_have_no_health_of_their_own(fake_nvml, spar_trace):
    fake = fake_nvml([spar_trace], mig={0: [spar_trace, spar_trace]}, mem_total_bytes=40e9)
    fake.set_health(0, ecc=ECC, remapped_rows=(0, 0, 0, 0), mem_temp_c=55)
    src = NvmlSource(health_interval_s=0.0)
    batch = src.read()
    parent, *kids = src.devices()
    assert list(batch.health) == [parent.uuid] and len(kids) == 2
    fake.xid(0, 48, gpu_instance_id=3)
    fake.advance()
    event = src.read().events
    assert event == [
        f"GPU 0 ({parent.uuid}, GPU instance 3): XID 48 (double-bit ECC error: uncorrectable memory error)"]
    src.close()


def test_memory_temperature_of_zero_is_no_sensor(fake_nvml, sg_traces):
    fake = fake_nvml(sg_traces[:1], mem_total_bytes=24576 * MIB)
    fake.set_health(0, mem_temp_c=0)
    src = NvmlSource(health_interval_s=0.0)
    assert src.read().health[src.devices()[0].uuid].mem_temperature_c is None
    src.close()


def test_xid_table_and_the_critical_alert_agree():
    """rules.yml's critical XID alert names exactly CRITICAL_XIDS; each has a meaning in the table."""
    rules = yaml.safe_load(RULES.read_text())
    (alert,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == CRITICAL_ALERT]
    assert "phasescope_gpu_critical_xid_errors_total" in alert["expr"]  # the agent's CRITICAL_XIDS count
    named = {int(x) for x in re.findall(r"(\d+): ", alert["annotations"]["description"])}
    assert named == CRITICAL_XIDS
    assert set(XID_MEANINGS) >= CRITICAL_XIDS
    assert {13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119} == set(XID_MEANINGS)


def test_combined_source_passes_health_on(fake_nvml, sg_traces):
    """`--source auto` is NVML + host (CombinedSource): the GPUs' health must reach the agent through it."""
    from phasescope.sources.host import CombinedSource, HostSource

    fake = fake_nvml(sg_traces, mem_total_bytes=24576 * MIB)
    fake.set_health(0, pcie_replays=3)
    src = CombinedSource(NvmlSource(health_interval_s=0.0), HostSource(), host_row=True)
    batch = src.read()
    uuid = sg_traces[0].device.uuid
    assert batch.health[uuid].pcie_replays == 3
    src.close()


def test_an_application_xid_after_a_critical_one_does_not_hide_it(fake_nvml, sg_traces):
    """XID 48 (double-bit ECC), then 45 as the application's channel is torn down: the last XID is 45, and
    the critical ones are counted apart (what the critical alert reads), so the 48 is not lost."""
    fake = fake_nvml(sg_traces[:1], mem_total_bytes=24576 * MIB)
    src = NvmlSource(health_interval_s=0.0)
    uuid = src.devices()[0].uuid
    h = src.read().health[uuid]
    assert (h.critical_xid_errors, h.last_critical_xid) == (0, 0)  # watched, none yet
    fake.xid(0, 48)
    fake.xid(0, 45)
    fake.advance()
    h = src.read().health[uuid]
    assert (h.xid_errors, h.last_xid) == (2, 45)
    assert (h.critical_xid_errors, h.last_critical_xid) == (1, 48)
    src.close()


def test_an_xid_storm_is_counted_but_said_once_a_minute(fake_nvml, sg_traces, monkeypatch):
    """An application faulting in a loop: XID 13 at 1000/s. Every event is drained and counted; the log gets
    one line per code and tick at most, and the same code again only after XID_REPEAT_S, with the count it
    skipped (it said 64 lines a tick). A critical XID in the middle of the storm is still said at once."""
    from phasescope.sources import nvml as nvml_mod

    clock = [1000.0]
    monkeypatch.setattr(nvml_mod.time, "monotonic", lambda: clock[0])
    fake = fake_nvml(sg_traces[:1], mem_total_bytes=24576 * MIB)
    src = NvmlSource(health_interval_s=0.0)
    uuid = src.devices()[0].uuid
    src.read()

    def tick(critical: bool = False) -> list[str]:
        for _ in range(1000):  # a second of the storm
            fake.xid(0, 13)
        if critical:
            fake.xid(0, 79)
        fake.advance()
        clock[0] += 1.0
        return src.read().events

    lines = [e for t in range(5) for e in tick(critical=t == 2)]
    h = src.read().health[uuid]
    assert (h.xid_errors, h.critical_xid_errors, h.last_critical_xid) == (5001, 1, 79)  # every one counted
    assert len(lines) == 2
    assert "XID 13 " in lines[0] and lines[0].endswith(", 1000 time(s) this tick")
    assert "XID 79 " in lines[1]
    clock[0] += nvml_mod.XID_REPEAT_S
    (again,) = tick()
    assert "XID 13 (graphics engine exception" in again
    assert again.endswith("rarely the GPU), 1000 time(s) this tick, 4000 more since the last line about it")
    src.close()


def test_health_off_makes_no_event_set_and_no_health_call(fake_nvml, sg_traces):
    """`phasescope.measure` reads NVML inside the user's code: it asks for no health, so no XID event set is
    registered and no health call is made there."""
    fake = fake_nvml(sg_traces, mem_total_bytes=24576 * MIB)
    fake.set_health(0, pcie_replays=3)
    src = NvmlSource(processes=False, gpm=False, nvlink=False, health=False, health_interval_s=0.0)
    fake.xid(0, 79)
    batch = src.read()
    assert fake.event_sets == [] and not batch.health and batch.events == []
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == 0
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 0
    src.close()


def test_the_measure_monitor_asks_for_no_health(fake_nvml, sg_traces):
    """The source test above holds for `phasescope.measure` only if its Monitor passes health=False: without
    it every Monitor("nvml") registered an XID event set per GPU inside the user's program."""
    from phasescope.monitor import Monitor

    fake = fake_nvml(sg_traces, mem_total_bytes=24576 * MIB)
    with Monitor("nvml", interval_s=None) as mon:
        mon.begin_window("w")
        fake.advance(2)
        mon.end_window("w")
    assert fake.event_sets == []
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == 0
