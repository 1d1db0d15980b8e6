"""Sampler overhead: our own CPU time per tick (time.process_time) for 8 GPUs, and for the host source.

The 8 GPUs are the scripted fake NVML (tests/fakes/fake_nvml.py) replaying real recorded traces from
../shared/data through the real NvmlSource code path. Every call path is switched on: energy, power limit,
clocks-event reasons, NVLink and GPM (fed, for cost only, with recorded series standing in for the
fields the RTX 3090 / A100 recordings lack), and two processes per GPU with per-process utilisation.
The figure includes the fake's own Python work, which stands in for the driver's. Goal: <= 1 ms per tick.

The sample buffers (nvmlDeviceGetSamples: three calls per GPU and tick) are timed apart: the same 8 GPUs with
and without them, the fake's buffer holding 1 or 10 new samples per kind at each tick (10: a 1 Hz poll of a
driver that samples at 10 Hz); `--samples-only` runs just that.

    .venv/bin/python benchmarks/bench_sampler.py [--ticks N] [--samples-only]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.fakes

import psutil  # noqa: E402
from tests.fakes.fake_nvml import FakeNvml, FakeProcess  # noqa: E402

from phasescope.schema import MIB, Trace  # noqa: E402
from phasescope.sources.host import CombinedSource, HostSource  # noqa: E402
from phasescope.sources.nvml import NvmlSource  # noqa: E402
from phasescope.sources.replay import read  # noqa: E402

DATA = Path(os.environ.get("PHASESCOPE_SHARED_DATA", REPO.parent / "shared" / "data"))
RUNS = (
    "sensorguard-rtx3090/20260824_train_gpt2_wikitext_verifier-gpu0_s0_r01/nvml.csv",
    "sensorguard-rtx3090/20260825_infer_gpt2_verifier-gpu0_s2_r03/nvml.csv",
    "spar-a100/gpt2_wikitext2_amp_NVIDIA_A100_SXM4_40GB_580ec1ad_20260309_182332.parquet",
    "spar-a100/blender_bmw_NVIDIA_A100_SXM4_40GB_6f9cd9b4_20260309_183828.parquet",
)


def eight_gpus() -> list[Trace]:
    traces = [t for run in RUNS for t in read(DATA / run)]
    out = []
    for t in (traces * 8)[:8]:
        out.append(t.with_columns(sm_active=t["gpu_util"], tensor_active=t["mem_util"],
                                  dram_active=t["mem_util"], nvlink_tx=t["pcie_tx"], nvlink_rx=t["pcie_rx"]))
    return out


def cpu_ms_per_tick(read_tick: Callable[[], object], advance: Callable[[], None], ticks: int) -> float:
    for _ in range(20):  # warm-up: first-tick probes, GPM's first sample
        read_tick()
        advance()
    start = time.process_time()
    for _ in range(ticks):
        read_tick()
        advance()
    return (time.process_time() - start) / ticks * 1e3


def sample_buffer_cost(ticks: int) -> None:
    """CPU per tick of NvmlSource on 8 fake GPUs without and with the sample buffers, and the ratio."""
    for per_tick in (1, 10):
        ms = {}
        for samples in (False, True):
            fake = FakeNvml(eight_gpus(), mem_total_bytes=24576 * MIB, power_limit_w=350.0,
                            energy_from_power=True, throttle_reasons=0, max_clocks_mhz=(2100, 9751))
            with fake.installed():
                src = NvmlSource(processes=False, samples=samples)
                ms[samples] = cpu_ms_per_tick(src.read, functools.partial(fake.advance, per_tick), ticks)
                calls = sum(fake.calls.values()) / (ticks + 20)
                src.close()
            print(f"nvml, 8 GPUs, no processes, sample buffers {'on ' if samples else 'off'} "
                  f"({per_tick} new sample(s) per kind per tick): {ms[samples]:.3f} ms CPU per tick "
                  f"({calls:.0f} NVML calls per tick)")
        extra = (ms[True] - ms[False]) / 8
        print(f"  sample buffers add {extra * 1e3:.0f} us CPU per tick per GPU; "
              f"{ms[True] / ms[False]:.2f}x the tick without them")


def spawn_sleepers(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--samples-only", action="store_true", help="only the sample buffers' cost")
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
          f"{args.ticks} ticks each")
    sample_buffer_cost(args.ticks)
    if args.samples_only:
        return

    sleepers = spawn_sleepers(8)  # real processes, one per fake GPU, for psutil to sample
    try:
        procs = {i: [FakeProcess(sleepers[i].pid, 2 * 2**30, sm_util_pct=60), FakeProcess(900000 + i, 2**28)]
                 for i in range(8)}
        fake = FakeNvml(eight_gpus(), mem_total_bytes=24576 * MIB, power_limit_w=350.0,
                        energy_from_power=True, throttle_reasons=0, max_clocks_mhz=(2100, 9751),
                        processes=procs)
        with fake.installed():
            src = NvmlSource()
            ms = cpu_ms_per_tick(src.read, fake.advance, args.ticks)
            calls = sum(fake.calls.values()) / (args.ticks + 20)
            print(f"nvml, 8 GPUs, all signals + 16 processes: {ms:.3f} ms CPU per tick "
                  f"({calls:.0f} NVML calls per tick; {ms / 10:.3f}% of one core at 1 Hz)")
            src.close()

        steady = HostSource()
        steady.watch(p.pid for p in sleepers)
        steady.read()
        ms_steady = cpu_ms_per_tick(steady.read, lambda: None, max(args.ticks // 4, 100))
        print(f"host, 8 watched processes, no torch scan due: {ms_steady:.3f} ms CPU per tick")

        t0 = time.process_time()
        HostSource().read()
        cold_ms = (time.process_time() - t0) * 1e3
        rescans = HostSource(scan_s=0.0)  # a torch scan on every tick
        rescans.watch(p.pid for p in sleepers)
        rescans.read()
        ms_scan = cpu_ms_per_tick(rescans.read, lambda: None, 50)
        print(f"host, torch scan of {len(psutil.pids())} PIDs: first scan {cold_ms:.2f} ms CPU; "
              f"with a rescan every tick {ms_scan:.3f} ms per tick; at 1 Hz with the default 5 s scan, "
              f"amortised {ms_steady + (ms_scan - ms_steady) / 5:.3f} ms per tick")

        with fake.installed():
            fake.tick = 0
            combined = CombinedSource(NvmlSource(), HostSource())
            ms = cpu_ms_per_tick(combined.read, fake.advance, max(args.ticks // 4, 100))
            print(f"nvml+host combined (8 GPUs, 8 live GPU processes enriched by psutil): "
                  f"{ms:.3f} ms CPU per tick")
            combined.close()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
