"""A small real labelled subset (absolute paths into ../shared/data), for quick fit/eval tests."""

from __future__ import annotations

import csv
from pathlib import Path

# Families kept: two runs each of training, inference, other and idle, plus their idle bystander GPUs.
FAMILIES = {
    "train_gpt2_wikitext",
    "train_resnet_cifar10",
    "infer_bert",
    "infer_gpt2",
    "hpc_gemm",
    "hpc_memcpy",
    "idle",
    "duty_shaping",
}
BYSTANDER_RUN_HINTS = ("20260825_idle_verifier-gpu0", "20260825_hpc_gemm_verifier-gpu0")


def write_subset(shared_data: Path, out_dir: Path) -> Path:
    rows = list(csv.DictReader((shared_data / "labels.csv").open(newline="")))
    keep = [
        r
        for r in rows
        if (r["family"] in FAMILIES and "sensorguard-rtx3090" in r["path"])
        or (r["family"] == "bystander_idle" and r["run"].startswith(BYSTANDER_RUN_HINTS))
    ]
    return write_labels(keep, shared_data, out_dir / "labels.csv")


def write_labels(rows: list[dict[str, str]], shared_data: Path, out: Path) -> Path:
    """`rows` of labels.csv as a labels file at `out`, paths made absolute into `shared_data`."""
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({**r, "path": str(shared_data / r["path"])})
    return out
