from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import psutil
import pytest

from phasescope.live.loop import TickLoop
from phasescope.live.processes import host_ram_bytes
from phasescope.live.state import DEFAULT_HISTORY, LiveState
from phasescope.schema import SIGNAL_NAMES, DeviceInfo, ProcessSample, TickBatch, Trace
from phasescope.sources.replay_live import ReplaySource
from phasescope.views import table
from phasescope.views.display import MISSING, fmt_bytes, fmt_elapsed, fmt_ratio, sparkline
from phasescope.views.table import CMD_CELL_CHARS, MAX_PROCESS_ROWS, SPARK_WIDTH, process_detail
from tests.live_helpers import ticks, training_traces


@pytest.fixture(scope="module")
def traces(shared_data: Path) -> list[Trace]:
    return training_traces(shared_data)


def _mid_workload(traces: list[Trace]) -> int:
    """A tick a minute into the training span, where GPU 0 works and GPU 1 idles."""
    t0 = traces[0]
    return int(np.searchsorted(t0.time, t0.meta["t_from"] + 60))


def _state_at(traces: list[Trace], upto: int) -> LiveState:
    state = LiveState("replay")
    for batch in ticks(traces, 0, upto + 1):
        state.ingest(batch)
    return state


def test_rows_show_the_latest_real_values(traces: list[Trace]) -> None:
    i = _mid_workload(traces)
    state = _state_at(traces, i)
    rows = table.rows(state)
    assert [r.key for r in rows] == [t.device.uuid for t in traces]
    for row, trace in zip(rows, traces, strict=True):
        assert row.cells["util"] == fmt_ratio(trace["gpu_util"][i])
        # The SensorGuard log has no memory total or power limit: shown as missing, never as 0.
        assert row.cells["mem"] == f"{fmt_bytes(trace['mem_used'][i])} / {MISSING}"
        assert row.cells["power"].endswith(f"W / {MISSING}")
        assert row.cells["spark_util"] == sparkline(trace["gpu_util"][: i + 1], SPARK_WIDTH, 0.0, 1.0)
    assert state.ticks == i + 1


def test_history_is_a_ring_of_the_last_ticks(traces: list[Trace]) -> None:
    n = DEFAULT_HISTORY + 57
    state = _state_at(traces, n - 1)
    uuid = traces[0].device.uuid
    np.testing.assert_array_equal(state.history(uuid, "power"), traces[0]["power"][n - DEFAULT_HISTORY : n])
    np.testing.assert_array_equal(state.history_times(uuid), traces[0].time[n - DEFAULT_HISTORY : n])
    assert np.isnan(state.history(uuid, "mem_total")).all()


def test_sort_by_util_puts_the_training_gpu_first(traces: list[Trace]) -> None:
    state = _state_at(traces, _mid_workload(traces))
    busy, idle = traces[0].device.uuid, traces[1].device.uuid
    assert [r.key for r in table.rows(state, "util")] == [busy, idle]
    assert [r.key for r in table.rows(state, "power")] == [busy, idle]
    with pytest.raises(ValueError, match="sort must be one of"):
        table.rows(state, "colour")


def test_filter_matches_uuid_and_hides_the_rest(traces: list[Trace]) -> None:
    state = _state_at(traces, 5)
    uuid = traces[1].device.uuid
    assert [r.key for r in table.rows(state, filter_text=uuid[-8:].upper())] == [uuid]
    assert table.rows(state, filter_text="no such device") == []


def test_lost_and_dark_devices_are_said_not_crashed(traces: list[Trace]) -> None:
    state = _state_at(traces, 10)
    gone = traces[1].device.uuid
    batch = next(ticks(traces, 11, 12))
    # 1) the source stops listing a device
    state.ingest(TickBatch(batch.time, batch.devices[:1], batch.values[:1]))
    row = {r.key: r for r in table.rows(state)}[gone]
    assert "LOST" in row.cells["info"] and row.cells["util"] == MISSING
    assert "NO DATA" in table.status_line(state) and "lost" in table.status_line(state)
    state.ingest(batch)
    assert "is back" in table.status_line(state)
    # 2) the source keeps the row but it reads NaN (what the NVML source does for a GPU off the bus)
    dark = batch.values.copy()
    dark[1, :] = np.nan
    state.ingest(TickBatch(batch.time + 1, batch.devices, dark, events=["GPU lost: #1 (test)"]))
    row = {r.key: r for r in table.rows(state)}[gone]
    assert "NO DATA" in row.cells["info"]
    assert all(row.cells[k] == MISSING for k in ("util", "mem", "power", "temp", "clocks", "pcie"))
    assert "GPU lost: #1 (test)" in table.status_line(state)


def _me(device_uuid: str | None, cpu: float) -> ProcessSample:
    """A real process (this test) as a source would report it."""
    p = psutil.Process(os.getpid())
    return ProcessSample(time=0.0, pid=p.pid, device_uuid=device_uuid, name=p.name(), cpu_util=cpu,
                         rss=float(p.memory_info().rss), threads=float(p.num_threads()), uses_torch=False)


def test_process_sub_rows(traces: list[Trace]) -> None:
    state = LiveState("test")
    batch = next(ticks(traces[:1], 0, 1))  # one device: a process with no device belongs to it
    batch.processes = [_me(None, 0.25)]
    state.process_labels[os.getpid()] = "demo training"
    state.ingest(batch)
    rows = table.rows(state)
    assert [r.kind for r in rows] == ["device", "process"]
    proc = rows[1]
    assert proc.cells["name"].startswith(f"  └ {os.getpid()} ")
    assert proc.cells["util"] == "25%"
    assert proc.cells["mem"].startswith("rss ")
    assert "no torch" in proc.cells["info"] and "demo training" in proc.cells["info"]
    assert [r.kind for r in table.rows(state, filter_text="demo training")] == ["device", "process"]


def test_many_processes_are_capped_and_sorted(traces: list[Trace]) -> None:
    state = LiveState("test")
    batch = next(ticks(traces, 0, 1))
    uuid = traces[0].device.uuid
    base = _me(uuid, 0.0)
    batch.processes = [
        ProcessSample(time=0.0, pid=base.pid + k, device_uuid=uuid, name=base.name, cpu_util=k / 100)
        for k in range(MAX_PROCESS_ROWS + 3)
    ]
    state.ingest(batch)
    rows = [r for r in table.rows(state, "util") if r.device_uuid == uuid and r.kind == "process"]
    assert len(rows) == MAX_PROCESS_ROWS + 1 and rows[-1].cells["name"].endswith("+3 more")
    assert rows[0].cells["util"] == fmt_ratio((MAX_PROCESS_ROWS + 2) / 100)  # busiest first
    assert rows[1].cells["info"].endswith(f"{MISSING} thr · no torch")


def _slice(t: Trace, lo: int, hi: int) -> Trace:
    return Trace(t.device, t.time[lo:hi], {s: t[s][lo:hi] for s in t.present_signals()})


def test_preload_fills_the_rings_like_ticks_would(traces: list[Trace]) -> None:
    """History preloaded from a store equals the same samples ingested as ticks, for the rows shown and
    the ring (wrapped: more samples than it holds); ticks, energy and cost stay this session's."""
    n = DEFAULT_HISTORY + 57
    i = n + 20
    ticked = _state_at(traces, i)
    loaded = LiveState("replay")
    history = [_slice(t, i + 1 - n, i + 1) for t in traces]
    # The store gives devices in its own order; the source's order decides the rows.
    assert loaded.preload(history[::-1], [t.device for t in traces]) == DEFAULT_HISTORY * 2
    assert [r.key for r in table.rows(loaded)] == [t.device.uuid for t in traces]
    for a, b in zip(table.rows(loaded), table.rows(ticked), strict=True):
        for key in ("util", "mem", "power", "temp", "spark_util", "spark_power"):
            assert a.cells[key] == b.cells[key], key
        assert a.cells["energy"] == MISSING  # energy so far: this session's only
    uuid = traces[0].device.uuid
    np.testing.assert_array_equal(loaded.history(uuid, "power"), ticked.history(uuid, "power"))
    np.testing.assert_array_equal(loaded.history_times(uuid), ticked.history_times(uuid))
    assert loaded.ticks == 0 and "waiting for the first sample" in table.status_line(loaded)


def test_preload_leaves_unwatched_devices_out_and_marks_the_restart_gap(traces: list[Trace]) -> None:
    i = _mid_workload(traces)
    gpu0, gpu1 = traces
    state = LiveState("replay")
    # Only GPU 1 is watched now, and GPU 0's history is left out; a later new device goes below GPU 1.
    state.preload([_slice(t, i - 100, i) for t in traces], [gpu1.device])
    assert state.device_uuids() == [gpu1.device.uuid]
    resumed = float(gpu1.time[i - 1]) + 60.0  # a restart one minute later
    values = np.stack([np.stack([t[s] for s in SIGNAL_NAMES], axis=1)[i] for t in traces])
    state.ingest(TickBatch(resumed, [gpu0.device, gpu1.device], values))
    assert [r.key for r in table.rows(state)] == [gpu1.device.uuid, gpu0.device.uuid]
    util = state.history(gpu1.device.uuid, "gpu_util")
    times = state.history_times(gpu1.device.uuid)
    assert len(util) == 102 and np.isnan(util[100]) and not np.isnan(util[[99, 101]]).any()
    assert times[99] < times[100] < times[101] == resumed
    assert table.rows(state)[0].cells["spark_util"][-2] == " "  # the restart shows as a blank column
    # The next tick a second later is no gap: no second blank.
    state.ingest(TickBatch(resumed + 1.0, [gpu0.device, gpu1.device], values))
    assert len(state.history(gpu1.device.uuid, "gpu_util")) == 103
    assert len(state.history(gpu0.device.uuid, "gpu_util")) == 2  # no history, no blank either


def test_host_row_shows_hook_phases_not_the_gpu_classifier_and_a_time_cost() -> None:
    import subprocess
    import sys
    import time

    from phasescope.kpi.cost import Prices
    from phasescope.sources.host import HostSource
    from phasescope.views.display import fmt_usd
    from phasescope.views.table import HOOKS_MARK, HOST_NO_PHASE

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        src = HostSource(find_torch=False)
        src.watch([os.getpid(), other.pid])
        state = LiveState("host", prices=Prices(usd_per_gpu_hour=3600.0))  # $1 a second: easy to check
        loop = TickLoop(src, 1.0, state)  # the pipeline's energy meter, under the state's phases
        first = src.read()
        loop.on_tick(first)
        host = first.devices[0].uuid
        state.set_phase(host, "other", 0.97, first.time)  # the GPU model's verdict on CPU load: not shown
        dev = table.rows(state)[0]
        assert dev.cells["phase"] == MISSING and HOST_NO_PHASE in dev.cells["info"]
        assert dev.cells["energy"] == f"{MISSING} kWh · {fmt_usd(0.0)}"  # one tick: no time held yet
        # The hooks say what each process does; the host shows their phases, marked as exact.
        state.set_process_phases({os.getpid(): "training", other.pid: "inference"})
        time.sleep(0.2)
        second = src.read()
        loop.on_tick(second)
        rows = table.rows(state)
        dev, procs = rows[0], {r.key.rpartition("/")[2]: r for r in rows[1:]}
        assert dev.cells["phase"] == "training+inference" + HOOKS_MARK
        assert dev.phase in {"training", "inference"} and HOST_NO_PHASE not in dev.cells["info"]
        assert procs[str(os.getpid())].cells["phase"] == "training" + HOOKS_MARK
        assert procs[str(other.pid)].cells["phase"] == "inference" + HOOKS_MARK
        assert procs[str(other.pid)].phase == "inference"
        # No power sensor: energy unmeasured, cost = held time x price, under the hooks' phase.
        span = second.time - first.time
        assert dev.cells["energy"] == f"{MISSING} kWh · {fmt_usd(span)}"
        phases = state.energy_results()[host].phases
        assert set(phases) == {"training+inference"}  # not "other": the classifier's verdict is not used
        assert phases["training+inference"].seconds == pytest.approx(span)
        assert f"energy {MISSING} kWh · cost" in table.status_line(state)
        assert [r.key for r in table.rows(state, filter_text="training+inference")][:1] == [host]
        # Energy priced only: nothing measured, so no cost at all rather than $0.
        kwh_only = LiveState("host", prices=Prices(usd_per_kwh=0.3))
        kwh_loop = TickLoop(src, 1.0, kwh_only)
        kwh_loop.on_tick(first)
        kwh_loop.on_tick(second)
        assert table.rows(kwh_only)[0].cells["energy"] == MISSING
    finally:
        other.kill()
        other.wait()


def test_the_host_kpi_side_and_sort_follow_its_hooks_never_a_classifier_phase(traces: list[Trace]) -> None:
    from phasescope.live.state import phase_from_hooks
    from phasescope.schema import DeviceInfo
    from phasescope.sources.host import HOST_KIND
    from phasescope.views.table import HOOKS_MARK

    host = DeviceInfo("host:n1", "Some CPU", None, "n1", extra={"kind": HOST_KIND})
    gpu = traces[0].device
    assert phase_from_hooks(host) and not phase_from_hooks(gpu)
    state = LiveState("test")
    batch = next(ticks(traces[:1], 0, 1))
    values = np.vstack([batch.values, np.full((1, len(SIGNAL_NAMES)), np.nan)])
    state.ingest(TickBatch(batch.time, [gpu, host], values, processes=[_me(host.uuid, 0.5)]))
    both = {"samples_per_s": 100.0, "requests_per_s": 4.0}
    state.set_kpis({host.uuid: both}, {os.getpid(): both})
    # A phase written for the host (what the annotator used to copy from the classifier) picks nothing.
    state.set_phase(host.uuid, "inference", 0.9, batch.time)
    state.set_phase(gpu.uuid, "idle", 0.9, batch.time)
    dev = {r.key: r for r in table.rows(state)}[host.uuid]
    assert dev.cells["phase"] == MISSING and "samp/s" in dev.cells["kpi"] and "req/s" not in dev.cells["kpi"]
    assert state.phase(host.uuid) is None and table.rows(state, filter_text="inference") == []
    assert [r.key for r in table.rows(state, sort="phase") if r.kind == "device"] == [gpu.uuid, host.uuid]
    # Its hooks say inference: the badge, the KPI side (device and process rows) and the sort follow.
    state.set_process_phases({os.getpid(): "inference"})
    dev, proc = (r for r in table.rows(state) if r.device_uuid == host.uuid)
    assert dev.cells["phase"] == "inference" + HOOKS_MARK and dev.phase == "inference"
    assert "req/s" in dev.cells["kpi"] and "req/s" in proc.cells["kpi"]
    view = state.phase(host.uuid)
    assert view is not None and view.label == "inference" and not view.training_alarm
    assert [r.key for r in table.rows(state, sort="phase") if r.kind == "device"] == [host.uuid, gpu.uuid]


def test_gpu_rows_keep_the_classifier_badge_and_processes_show_their_hook_phase(traces: list[Trace]) -> None:
    from phasescope.views.table import HOOKS_MARK

    state = LiveState("test")
    batch = next(ticks(traces[:1], 0, 1))
    batch.processes = [_me(traces[0].device.uuid, 0.5)]
    state.ingest(batch)
    state.set_phase(traces[0].device.uuid, "inference", 0.8, batch.time, held=True)
    state.set_process_phases({os.getpid(): "training"})
    dev, proc = table.rows(state)
    assert dev.cells["phase"] == "inference 80% (held)" and dev.phase == "inference"
    assert proc.cells["phase"] == "training" + HOOKS_MARK


def test_training_alarm_is_a_note_on_its_device_while_it_holds(traces: list[Trace]) -> None:
    from phasescope.views.table import TRAINING_ALARM_NOTE

    i = _mid_workload(traces)
    state = _state_at(traces, i)
    busy, idle = (t.device.uuid for t in traces)
    t = float(traces[0].time[i])
    state.set_phase(busy, "idle", 0.9, t, training_alarm=True)  # the alarm fires before the badge turns
    state.set_phase(idle, "idle", 0.9, t)
    rows = {r.key: r for r in table.rows(state)}
    assert rows[busy].cells["info"].startswith(TRAINING_ALARM_NOTE)
    assert rows[busy].cells["phase"] == "idle 90%"  # the badge itself stays the classifier's
    assert TRAINING_ALARM_NOTE not in rows[idle].cells["info"]
    version = state.version
    state.set_phase(busy, "idle", 0.9, t)  # the alarm no longer holds: the note goes
    assert state.version > version  # a redraw is due
    assert TRAINING_ALARM_NOTE not in {r.key: r for r in table.rows(state)}[busy].cells["info"]
    # A device that went dark shows NO DATA, not a stale alarm.
    state.set_phase(busy, "idle", 0.9, t, training_alarm=True)
    batch = next(ticks(traces, i + 1, i + 2))
    dark = batch.values.copy()
    dark[0, :] = np.nan
    state.ingest(TickBatch(batch.time, batch.devices, dark))
    info = {r.key: r for r in table.rows(state)}[busy].cells["info"]
    assert "NO DATA" in info and TRAINING_ALARM_NOTE not in info


def test_process_rows_show_user_elapsed_command_and_share_of_ram(traces: list[Trace]) -> None:
    """nvitop's USER, TIME, COMMAND and %MEM on a process sub-row; the filter finds a process by user or by
    anything on its command line; `process_entries` (JSON-ready; not served by /api/state) carry the same,
    NaN as None."""
    state = LiveState("test")
    batch = next(ticks(traces[:1], 0, 1))
    uuid = traces[0].device.uuid
    cmd = "python train.py --config configs/gpt2-small.yaml --lr 3e-4 --batch-size 64 --run-name sweep-7"
    batch.processes = [
        ProcessSample(time=batch.time, pid=4242, device_uuid=uuid, name="python", cpu_util=0.5,
                      rss=2 * 2**30, gpu_mem_used=10 * 2**30, user="alice",
                      start_time=batch.time - (3 * 3600 + 12 * 60 + 5), cmdline=cmd),
        ProcessSample(time=batch.time, pid=77, device_uuid=uuid, name="Xorg", rss=2**20),  # nothing known
    ]
    state.ingest(batch)
    state.host_mem_total = 64 * 2**30  # what the loop hands set_local_processes on a real host
    rows = {r.pid: r for r in table.rows(state) if r.kind == "process"}
    alice = rows[4242].cells
    assert alice["name"] == "  └ 4242 python (alice)"
    assert alice["mem"] == "dev 10.0 GiB · rss 2.0 GiB (3.1%)"
    assert alice["info"] == "cpu 50% · – thr · no torch · up 3h12m · " + cmd[: CMD_CELL_CHARS - 1] + "…"
    assert len(alice["info"].rpartition(" · ")[2]) == CMD_CELL_CHARS
    bare = rows[77].cells
    assert bare["name"] == "  └ 77 Xorg" and "up " not in bare["info"] and bare["info"].endswith("no torch")
    assert bare["mem"] == "rss 1.0 MiB (0.0%)"
    for needle in ("alice", "sweep-7", "gpt2-small"):
        assert [r.pid for r in table.rows(state, filter_text=needle)] == [None, 4242], needle

    entries = state.process_entries()[uuid]
    assert entries[0] == {
        "pid": 4242, "name": "python", "user": "alice", "cmdline": cmd,
        "start_time": batch.time - 11525, "elapsed_s": 11525.0, "gpu_mem_used": 10 * 2**30, "sm_util": None,
        "cpu_util": 0.5, "rss": 2 * 2**30, "mem_ratio": 1 / 32, "threads": None, "uses_torch": False,
    }
    assert entries[1]["user"] == "" and entries[1]["start_time"] is None and entries[1]["elapsed_s"] is None
    detail = process_detail(state.process_sample(uuid, 4242), state.host_mem_total)  # type: ignore[arg-type]
    assert detail.startswith("PID 4242 · alice · started ") and "(up 3h12m)" in detail
    assert detail.endswith(f" · rss 2.0 GiB = 3.1% of RAM · {cmd}")  # the whole command line


def test_share_of_ram_from_a_host_row_or_this_host() -> None:
    """%MEM needs host RAM: a host row's mem_total (a replay's, the demo's), else this host's when the
    source's processes run here; unknown otherwise, shown as nothing rather than a made-up share."""
    state = LiveState("replay")
    host = DeviceInfo("host:box", extra={"kind": "host"})
    values = np.full((1, len(SIGNAL_NAMES)), np.nan)
    values[0, SIGNAL_NAMES.index("mem_total")] = 8 * 2**30
    p = ProcessSample(time=1.0, pid=5, device_uuid=host.uuid, name="python", rss=2**30)
    state.ingest(TickBatch(1.0, [host], values, processes=[p]))
    assert state.host_mem_total == 8 * 2**30 and not state.local_processes
    assert table.rows(state)[1].cells["mem"] == "rss 1.0 GiB (12.5%)"

    bare = LiveState("replay")
    bare.ingest(TickBatch(1.0, [DeviceInfo("GPU-1")], np.full((1, len(SIGNAL_NAMES)), np.nan),
                          processes=[ProcessSample(time=1.0, pid=5, device_uuid="GPU-1", rss=2**30)]))
    assert table.rows(bare)[1].cells["mem"] == "rss 1.0 GiB"
    bare.set_local_processes(True, host_ram_bytes())  # what the loop does for a source of this host
    assert bare.local_processes and bare.host_mem_total == psutil.virtual_memory().total
    assert table.rows(bare)[1].cells["mem"].startswith("rss 1.0 GiB (")


def test_fmt_elapsed() -> None:
    assert [fmt_elapsed(s) for s in (0, 42.9, 60, 725, 3600, 11525, 86400 + 3 * 3600 + 59)] == [
        "0s", "42s", "1m00s", "12m05s", "1h00m", "3h12m", "1d03h"]
    assert fmt_elapsed(math.nan) == MISSING and fmt_elapsed(-1) == MISSING  # a clock step: not "-1s"


@pytest.mark.parametrize("method_says", [None, "integrated_power", "none"])
def test_energy_reads_unmeasured_until_a_second_is_covered(
    traces: list[Trace], monkeypatch: pytest.MonkeyPatch, method_says: str | None
) -> None:
    """The energy cell, the status line and the totals ask kpi/energy's one rule (`measured`: some covered
    second), not the meter's method name: a metered GPU on its first tick, or with its power gone since
    the start, reads – kWh beside its time-based cost and adds nothing to the totals; once a second is
    covered it shows its kWh. Whatever `method` says: None is the real meter; "integrated_power" a method
    named from the sensor seen (as the batch curve names it for one sample), which used to read 0.000 kWh;
    "none" one that used to hide measured energy."""
    from phasescope.kpi.cost import Prices
    from phasescope.kpi.energy import EnergyMeter
    from phasescope.views.display import fmt_usd

    if method_says is not None:
        monkeypatch.setattr(EnergyMeter, "method", property(lambda self: method_says))
    state = LiveState("replay", prices=Prices(usd_per_gpu_hour=3600.0))  # $1 a second, no energy price
    loop = TickLoop(ReplaySource(traces), 1.0, state)
    power, energy = SIGNAL_NAMES.index("power"), SIGNAL_NAMES.index("energy")
    batches = list(ticks(traces, 0, 5))
    t0 = batches[0].time
    for i, batch in enumerate(batches):
        batch.values[:, energy] = np.nan  # power only
        if i in (1, 2):
            batch.values[:, power] = np.nan  # a power dropout: ticks 0-3 cover no second
        loop.on_tick(batch)
        devices = [r for r in table.rows(state) if r.kind == "device"]
        assert len(devices) == len(traces)
        joules, _ = state.energy_totals()
        status = table.status_line(state)
        if i <= 2:  # the first tick, then the dropout since the start
            held = fmt_usd(batch.time - t0)
            assert all(r.cells["energy"] == f"{MISSING} kWh · {held}" for r in devices), i
            assert f"energy {MISSING} kWh · cost" in status and "0.000 kWh" not in status
            assert joules is None
            continue
        results = state.energy_results()
        if i == 3:  # power back, but no interval with power at both ends yet
            assert all(not r.measured for r in results.values())
            assert joules is None and f"energy {MISSING} kWh" in status
            continue
        assert all(r.covered_s == pytest.approx(batch.time - batches[3].time) for r in results.values())
        for row in devices:
            kwh = results[row.key].joules / 3.6e6
            assert row.cells["energy"] == f"{kwh:.3f} kWh · {fmt_usd(batch.time - t0)}"
        total = sum(r.joules for r in results.values())
        assert total > 0 and joules == pytest.approx(total)
        assert f"energy {total / 3.6e6:.3f} kWh" in status and f"{MISSING} kWh" not in status
