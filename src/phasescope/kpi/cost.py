"""Cost from device time and energy, per phase and per unit of work, and the training/inference crossover.

Two price components, either or both configured:

- time: device-seconds / 3600 x $/GPU-hour (a GPU held is paid for, busy or not);
- energy: joules / 3.6e6 x $/kWh (measured energy only; see `coverage` in kpi/energy.py).

A component whose price is not set is None, not 0, so "not priced" never reads as "free".
Counts of steps, requests and tokens come from the caller (kpi/training.py, kpi/inference.py).

A GPU split into MIG instances is one physical GPU: `mig_prices` turns each row's price into its share of
the GPU's (see `MigShare`), so the parent row and its instances together cost one GPU-hour per hour.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from phasescope.kpi.energy import J_PER_KWH, DeviceEnergy
from phasescope.schema import DeviceInfo

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Prices:
    """What one device costs: per hour held, per kWh drawn, or both (None = not priced)."""

    usd_per_gpu_hour: float | None = None
    usd_per_kwh: float | None = None

    def __post_init__(self) -> None:
        for name in ("usd_per_gpu_hour", "usd_per_kwh"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def priced(self) -> bool:
        return self.usd_per_gpu_hour is not None or self.usd_per_kwh is not None


@dataclass(frozen=True)
class Cost:
    """A cost split into its time and energy components (USD); None where that price is not set."""

    time_usd: float | None
    energy_usd: float | None

    @property
    def total_usd(self) -> float | None:
        parts = [p for p in (self.time_usd, self.energy_usd) if p is not None]
        return sum(parts) if parts else None

    def __add__(self, other: Cost) -> Cost:
        return Cost(_add(self.time_usd, other.time_usd), _add(self.energy_usd, other.energy_usd))

    def scaled(self, factor: float) -> Cost:
        return Cost(
            None if self.time_usd is None else self.time_usd * factor,
            None if self.energy_usd is None else self.energy_usd * factor,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"time_usd": self.time_usd, "energy_usd": self.energy_usd, "total_usd": self.total_usd}


ZERO = Cost(None, None)


def _add(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else a + b


# ---------------------------------------------------------------- MIG: one physical GPU, priced once

# Compute slices of a whole GPU in MIG mode, by model (NVIDIA MIG user guide: A30 has 4, the others 7).
# Matched as substrings of the lowercased model name, longest first; a model not listed splits equally.
MIG_TOTAL_SLICES: Mapping[str, int] = {
    "a30": 4, "a100": 7, "a800": 7, "h100": 7, "h200": 7, "h800": 7, "h20": 7, "gh200": 7,
    "b100": 7, "b200": 7, "gb200": 7,
}
# A GPU-instance profile "3g.40gb" (also in "1c.3g.40gb", or "1g.10gb+me" with a media extension): its
# leading number is the compute slices (3).
_PROFILE_RE = re.compile(r"(\d+)g\.\d+gb(?:\+\w+)?", re.IGNORECASE)


@dataclass(frozen=True)
class MigShare:
    """The part of its physical GPU's prices one row pays. `time`: fraction of the GPU-hour price;
    `energy`: fraction of the row's own measured energy that is priced (0 when the parent row prices it)."""

    time: float
    energy: float
    note: str

    def apply(self, prices: Prices) -> Prices:
        return Prices(
            None if prices.usd_per_gpu_hour is None else prices.usd_per_gpu_hour * self.time,
            # 0: this row's power is the board's, priced on the parent row; None keeps "not priced here"
            # apart from a measured $0.
            None if prices.usd_per_kwh is None or self.energy == 0 else prices.usd_per_kwh * self.energy,
        )


def mig_parent(device: DeviceInfo) -> str:
    """A MIG instance's physical GPU uuid; "" for a whole GPU, also one listed as its own parent (a damaged
    file), which is priced, exported and backfilled as a whole GPU."""
    parent = device.parent_uuid
    return parent if parent and parent != device.uuid else ""


def mig_profile(device: DeviceInfo) -> str:
    """A MIG instance's GPU-instance profile ("3g.40gb"), from dcgm's `GPU_I_PROFILE` or the NVML name
    "... MIG 3g.40gb"; "" when neither says (a whole GPU)."""
    for text in (device.extra.get("GPU_I_PROFILE", ""), device.name):
        found = list(_PROFILE_RE.finditer(text))
        if found:
            return found[-1].group(0)
    return ""


def mig_slices(device: DeviceInfo) -> int | None:
    """Compute slices of a MIG instance, from its profile (`mig_profile`); None when it has none."""
    found = _PROFILE_RE.match(mig_profile(device))
    return int(found.group(1)) if found else None


def mig_total_slices(model: str) -> int | None:
    lowered = model.lower()
    for key in sorted(MIG_TOTAL_SLICES, key=len, reverse=True):
        if key in lowered:
            return MIG_TOTAL_SLICES[key]
    return None


def _frac(x: float) -> str:
    return f"{x:.3g}"


def mig_shares(devices: Iterable[DeviceInfo]) -> dict[str, MigShare]:
    """The share of its physical GPU's prices each MIG row pays, keyed by uuid (rows not in MIG: absent).

    The rule: time cost belongs to the physical GPU; each instance pays its slices / the GPU's slices of
    the GPU-hour (3g of 7 = 3/7), the parent row the unassigned rest; when a slice count is not known the
    instances split it equally. Energy is the board's: priced on the parent row when the recording has one
    (an instance's power, where a source gives one, is the same board reading), else on each instance at its
    time share.
    """
    devs = {d.uuid: d for d in devices}
    children: dict[str, list[DeviceInfo]] = {}
    for d in devs.values():
        if mig_parent(d):
            children.setdefault(mig_parent(d), []).append(d)
    out: dict[str, MigShare] = {}
    for parent_uuid, kids in children.items():
        parent = devs.get(parent_uuid)
        names = ([parent.name] if parent is not None else []) + [k.name for k in kids]
        total = next((t for t in map(mig_total_slices, names) if t is not None), None)
        slices = [mig_slices(k) for k in kids]
        known = [s for s in slices if s is not None]
        if total is not None and len(known) == len(kids) and 0 < sum(known) <= total:
            shares = [s / total for s in known]
            how = [f"{s}/{total} of the GPU-hour ({s} of its {total} compute slices)" for s in known]
        else:
            shares = [1.0 / len(kids)] * len(kids)
            why = "slice count not known" if total is None or len(known) < len(kids) else (
                f"profiles claim {sum(known)} slices of {total}")
            how = [f"1/{len(kids)} of the GPU-hour, split equally ({why})"] * len(kids)
        has_parent = parent is not None
        for kid, share, text in zip(kids, shares, how, strict=True):
            energy = 0.0 if has_parent else share
            where = "energy priced on the parent GPU row" if has_parent else (
                f"{_frac(share)} of the board energy it reports")
            out[kid.uuid] = MigShare(share, energy, f"MIG instance: pays {text}; {where}")
        rest = max(1.0 - sum(shares), 0.0)
        if has_parent:
            out[parent_uuid] = MigShare(
                rest, 1.0,
                f"MIG parent: pays the unassigned {_frac(rest)} of the GPU-hour, and the board energy",
            )
    return out


def mig_prices(
    prices: Mapping[str, Prices], devices: Iterable[DeviceInfo]
) -> tuple[dict[str, Prices], dict[str, str]]:
    """Per-device prices with MIG shares applied (an instance starts from its parent's prices when the parent
    is priced here), and the note that says each MIG row's share. Keys and other rows are kept as they are."""
    devs = list(devices)
    shares = mig_shares(devs)
    out = dict(prices)
    parents = {d.uuid: d.parent_uuid for d in devs}
    for uuid, share in shares.items():
        if uuid not in prices:
            continue
        base = prices.get(parents.get(uuid) or "", prices[uuid])
        # A physical GPU is priced once per hour: each MIG instance pays its compute-slice share of its
        # GPU's price (equal shares when slices are unknown), the parent row the unassigned rest and the
        # board's energy (or, with no parent row, each instance its share of the board energy it reports).
        out[uuid] = share.apply(base)
    return out, {u: s.note for u, s in shares.items() if u in prices}


def cost_of(device_seconds: float, joules: float, prices: Prices, measured: bool = True) -> Cost:
    """Cost of `device_seconds` of held device time that drew `joules`. `measured=False`: the device has no
    power or energy reading (`_EnergyFigures.measured`), so its energy cost is unknown (None), not $0."""
    time_usd = (
        None
        if prices.usd_per_gpu_hour is None
        else device_seconds / SECONDS_PER_HOUR * prices.usd_per_gpu_hour
    )
    energy_usd = (
        None if prices.usd_per_kwh is None or not measured else joules / J_PER_KWH * prices.usd_per_kwh
    )
    return Cost(time_usd, energy_usd)


def device_cost(result: DeviceEnergy, prices: Prices) -> Cost:
    """Whole-trace cost of one device: its span as held time, its measured energy (unknown without any)."""
    # As its JSON `joules`: no covered second, no known energy cost, whatever the method.
    return cost_of(result.span_s, result.joules, prices, measured=result.measured)


def phase_costs(results: Iterable[DeviceEnergy], prices: Prices | Mapping[str, Prices]) -> dict[str, Cost]:
    """Cost per phase label, summed over devices. `prices`: one Prices, or a map device uuid -> Prices.

    A device without phase segments counts whole under ``unknown``, so the labels sum to `total_cost`.
    """
    out: dict[str, Cost] = {}
    for r in results:
        p = prices if isinstance(prices, Prices) else prices[r.device]
        for label, pe in r.phases_or_whole().items():
            # A phase without any power or energy reading has an unknown energy cost, also on a metered GPU.
            out[label] = out.get(label, ZERO) + cost_of(pe.seconds, pe.joules, p, pe.measured)
    return out


def total_cost(results: Iterable[DeviceEnergy], prices: Prices | Mapping[str, Prices]) -> Cost:
    total = ZERO
    for r in results:
        total = total + device_cost(r, prices if isinstance(prices, Prices) else prices[r.device])
    return total


def _per(cost: Cost, count: float | None, unit: float) -> Cost | None:
    if count is None or not math.isfinite(count) or count <= 0:
        return None
    return cost.scaled(unit / count)


def per_1k_requests(cost: Cost, requests: float | None) -> Cost | None:
    """Cost of 1,000 requests, given the cost of serving `requests` (None when there were none)."""
    return _per(cost, requests, 1000.0)


def per_step(cost: Cost, steps: float | None) -> Cost | None:
    """Cost of one training step, given the cost of `steps` steps."""
    return _per(cost, steps, 1.0)


def per_million_tokens(cost: Cost, tokens: float | None) -> Cost | None:
    """Cost of 1,000,000 tokens, given the cost of processing `tokens`."""
    return _per(cost, tokens, 1e6)


def crossover(train_cost: float, queries_per_day: float, cost_per_query: float) -> float:
    """Days until cumulative inference spend equals the training spend: train_cost / (queries/day x $/query).

    Infinite when inference costs nothing per day. $10M training, 1M queries/day at $0.001: 10,000 days.
    """
    for name, value in (
        ("train_cost", train_cost),
        ("queries_per_day", queries_per_day),
        ("cost_per_query", cost_per_query),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    daily = queries_per_day * cost_per_query
    return math.inf if daily == 0 else train_cost / daily


def cost_per_query(
    results: Iterable[DeviceEnergy],
    requests: float,
    prices: Prices | Mapping[str, Prices],
    phase: str | None = None,
) -> Cost:
    """Measured cost of one query: the cost of the devices that served `requests` requests, divided by them.

    With `phase` (e.g. "inference"), only that phase's time and energy count; else each device's whole trace.
    Raises ValueError when `requests` is not positive.
    """
    if not (math.isfinite(requests) and requests > 0):
        raise ValueError(f"requests must be > 0, got {requests!r}")
    results = list(results)
    spent = total_cost(results, prices) if phase is None else phase_costs(results, prices).get(phase, ZERO)
    return spent.scaled(1.0 / requests)
