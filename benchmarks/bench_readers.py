"""Reader throughput: data rows per second for each file format, on one core.

Big inputs are synthesised at run time in a temp dir by repeating real files from ../shared/data
(timestamps shifted per repetition so the files stay valid), then read with
`phasescope.sources.replay.read(path)` (auto-detect included). The process is pinned to one CPU and
Arrow to one thread. Prints one line per format: rows, best-of-N seconds, rows/s.

    .venv/bin/python benchmarks/bench_readers.py [--rows 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from phasescope.sources.replay import read  # noqa: E402

DATA = Path(os.environ.get("PHASESCOPE_SHARED_DATA", REPO.parent / "shared" / "data"))


def one_core() -> str:
    cpu = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {cpu})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    return f"cpu {cpu}"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def make_nvidia_smi_csv(tmp: Path, rows: int) -> tuple[Path, int]:
    """The 8-GPU H100 log, repeated with its timestamps shifted past the previous copy."""
    src = _lines(DATA / "nvidia-smi-h100-training/ckpt1.csv")
    header, body = src[0], src[1:]
    stamps = np.array(
        [ln.split(",", 1)[0].replace("/", "-").replace(" ", "T") for ln in body], dtype="datetime64[ms]"
    )
    rest = np.array([ln.split(",", 1)[1] for ln in body], dtype=object)
    span = stamps[-1] - stamps[0] + np.timedelta64(100, "ms")
    reps = max(1, -(-rows // len(body)))
    p = tmp / "smi.csv"
    with p.open("w") as fh:
        fh.write(header + "\n")
        for k in range(reps):
            text = np.datetime_as_string(stamps + span * k, unit="ms")
            text = np.char.replace(np.char.replace(text, "-", "/"), "T", " ")
            fh.write("\n".join(f"{a},{b}" for a, b in zip(text.tolist(), rest.tolist(), strict=True)) + "\n")
    return p, reps * len(body)


def make_sensorguard(tmp: Path, rows: int) -> tuple[Path, int]:
    """A 2-GPU SensorGuard run with its data rows repeated (times shifted by the run's length)."""
    run = DATA / "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r02"
    src = (run / "nvml.csv").read_bytes().decode().split("\r\n")
    header, anchor, body = src[0], src[1], [ln for ln in src[2:] if ln]
    cols = [ln.split(",") for ln in body]
    t = np.array([float(c[2]) for c in cols])
    shift = t.max() - t.min() + 1.0
    reps = max(1, -(-rows // len(body)))
    d = tmp / "sg"
    d.mkdir()
    with (d / "nvml.csv").open("w", newline="") as fh:
        fh.write(header + "\r\n" + anchor + "\r\n")
        for k in range(reps):
            out = []
            for c, tv in zip(cols, (t + shift * k).tolist(), strict=True):
                out.append(",".join((c[0], c[1], f"{tv:.9f}", *c[3:])))
            fh.write("\r\n".join(out) + "\r\n")
    (d / "manifest.yaml").write_bytes((run / "manifest.yaml").read_bytes())
    return d, reps * len(body)


def make_spar(tmp: Path, rows: int) -> tuple[Path, int]:
    """All SPAR tables of one run concatenated until `rows`, times shifted per copy."""
    base = pq.read_table(sorted((DATA / "spar-a100").glob("blender_bmw*.parquet"))[0])
    span = (
        float(pa.compute.max(base["timestamp_epoch"]).as_py())
        - float(pa.compute.min(base["timestamp_epoch"]).as_py())
        + 1
    )
    reps = max(1, -(-rows // base.num_rows))
    parts = []
    for k in range(reps):
        ts = pa.compute.add(base["timestamp_epoch"], span * k)
        parts.append(base.set_column(base.schema.get_field_index("timestamp_epoch"), "timestamp_epoch", ts))
    p = tmp / "spar.parquet"
    pq.write_table(pa.concat_tables(parts), p)
    return p, reps * base.num_rows


def make_dmon(tmp: Path, rows: int) -> tuple[Path, int]:
    """The OrbitQuant dmon capture's rows repeated under one header (dmon text layout)."""
    src = _lines(
        DATA / "formats/nvidia-smi-dmon/iamwavecut__OrbitQuant__rtx-pro-6000-kernel-bench_dmon-15s.txt"
    )
    head = [ln for ln in src if ln.startswith("#")][:2]
    body = [ln for ln in src if ln.strip() and not ln.startswith("#") and ln.strip()[0].isdigit()]
    reps = max(1, -(-rows // len(body)))
    p = tmp / "dmon.txt"
    p.write_text("\n".join(head + body * reps) + "\n")
    return p, reps * len(body)


def make_dcgm(tmp: Path, rows: int) -> tuple[Path, int]:
    """The T4 dcgm-exporter scrape concatenated `rows / samples` times (one scrape per copy)."""
    text = (
        DATA / "formats/dcgm-exporter-prom/cncf__k8s-ai-conformance__ericsson-ccd_accelerator_metrics.prom"
    ).read_text()
    samples = sum(1 for ln in text.splitlines() if ln.startswith("DCGM_FI_"))
    reps = max(1, -(-rows // samples))
    p = tmp / "scrape.prom"
    p.write_text((text.rstrip("\n") + "\n") * reps)
    return p, reps * samples


def make_alibaba(tmp: Path, rows: int) -> tuple[Path, int]:
    """Both GenTD26 files repeated with timestamps shifted; rows counted over both files."""
    total = 0
    d = tmp / "ali"
    d.mkdir()
    for name in ("pod_gpu_duty_cycle_anon.csv", "pod_gpu_memory_used_bytes_anon.csv"):
        src = _lines(DATA / "alibaba-gentd26" / name)
        header, body = src[0], src[1:]
        names = header.split(",")
        ti = names.index("timestamp_anon")
        cols = [ln.split(",") for ln in body]
        t = np.array([float(c[ti]) for c in cols])
        shift = t.max() - t.min() + 60.0
        reps = max(1, -(-(rows // 2) // len(body)))
        with (d / name).open("w") as fh:
            fh.write(header + "\n")
            for k in range(reps):
                out = []
                for c, tv in zip(cols, (t + shift * k).tolist(), strict=True):
                    c = list(c)
                    c[ti] = repr(tv)
                    out.append(",".join(c))
                fh.write("\n".join(out) + "\n")
        total += reps * len(body)
    return d / "pod_gpu_duty_cycle_anon.csv", total


MAKERS: dict[str, Callable[[Path, int], tuple[Path, int]]] = {
    "nvidia-smi-csv": make_nvidia_smi_csv,
    "sensorguard": make_sensorguard,
    "spar": make_spar,
    "alibaba-gentd26": make_alibaba,
    "nvidia-smi-dmon": make_dmon,
    "dcgm-prom": make_dcgm,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows", type=int, default=1_000_000, help="data rows per synthesised file (text formats)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="reads per format; the best is reported")
    ap.add_argument("--only", nargs="*", default=None, help="formats to run (default: all)")
    args = ap.parse_args()
    where = one_core()
    print(f"reader throughput, one core ({where}), arrow threads {pa.cpu_count()}, best of {args.repeat}")
    print(f"{'format':<18}{'rows':>12}{'seconds':>10}{'rows/s':>14}  devices")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for fmt, make in MAKERS.items():
            if args.only and fmt not in args.only:
                continue
            # Slow text formats get fewer rows so the run stays short; rows/s is what is compared.
            rows = args.rows if fmt not in ("nvidia-smi-dmon", "dcgm-prom") else args.rows // 5
            path, n = make(tmp, rows)
            best = float("inf")
            devices = 0
            for _ in range(args.repeat):
                start = time.perf_counter()
                traces = read(path)
                best = min(best, time.perf_counter() - start)
                devices = len(traces)
                assert traces[0].meta["format"] == fmt, traces[0].meta["format"]
            print(f"{fmt:<18}{n:>12,}{best:>10.3f}{n / best:>14,.0f}  {devices}")


if __name__ == "__main__":
    main()
