"""The agent behind `phasescope serve` (and the demo's dashboard): the live tick loop over a source, and what
the web app and the Prometheus collector read of it.

The loop (live/loop.py, the same as `top`'s) does all the writing in one sampler thread: LiveState ring
buffers, the LiveClassifier, the one energy meter; the web app and the collector only read the state
through its lock, so a scrape never waits for a tick and a tick never waits for a scrape beyond a short copy.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from phasescope.classify.decide import finite_or_none
from phasescope.config import PriceConfig
from phasescope.kpi.cost import Prices, cost_of
from phasescope.kpi.energy import DEFAULT_GAP_FACTOR, DeviceEnergy
from phasescope.live.annotate import Annotator, HookKpiReader
from phasescope.live.classify import LiveClassifier, PhaseReading
from phasescope.live.evidence import EvidenceTracker
from phasescope.live.history import backfill_phases, loaded_note, recent_traces
from phasescope.live.loop import Sink, TickLoop
from phasescope.live.state import LiveState, phase_from_hooks
from phasescope.schema import (
    PHASES,
    SIGNAL_COLUMN,
    SIGNAL_NAMES,
    DeviceInfo,
    FloatArray,
    GpuHealth,
    TickBatch,
)
from phasescope.sources.base import LiveSource
from phasescope.sources.host import is_host_device
from phasescope.sources.sampler import Sampler
from phasescope.store.live import Store
from phasescope.views.kpis import kpi_items, kpi_note, kpi_text
from phasescope.views.table import status_line

# Signals the dashboard draws, in this order (the others are in the JSON "latest" block and /metrics).
CHART_SIGNALS: tuple[str, ...] = ("gpu_util", "mem_util", "power", "mem_used", "temperature", "sm_clock")
UP_AFTER_INTERVALS = 3.0  # the source counts as up while its last tick is younger than this many intervals


def _num(x: float, digits: int = 6) -> float | None:
    """A JSON-safe number: None for NaN/inf (JSON has no NaN), rounded to keep payloads small."""
    return finite_or_none(round(float(x), digits))


def _series(values: FloatArray, digits: int) -> list[float | None]:
    rounded = np.round(values, digits)
    return [finite_or_none(float(v)) for v in rounded.tolist()]


def _health_doc(h: GpuHealth | None) -> dict[str, Any] | None:
    """A GPU's health for /api/state: only what the GPU offers (no key, not 0, for the rest); None when its
    source reads no health (the host, a replay, a MIG instance: its parent GPU has it)."""
    if h is None:
        return None
    doc: dict[str, Any] = {"time": _num(h.time, 3)}
    if h.ecc:
        doc["ecc_errors"] = {kind: dict(scopes) for kind, scopes in h.ecc.items()}
    if h.remapped_rows:
        doc["remapped_rows"] = dict(h.remapped_rows)
    for key, value in (("row_remap_pending", h.remap_pending), ("row_remap_failure", h.remap_failure),
                       ("pcie_replays", h.pcie_replays), ("mem_temperature_c", h.mem_temperature_c),
                       ("xid_errors", h.xid_errors), ("last_xid", h.last_xid),
                       ("last_xid_time", h.last_xid_time), ("critical_xid_errors", h.critical_xid_errors),
                       ("last_critical_xid", h.last_critical_xid)):
        if value is not None:
            doc[key] = value
    return doc


def _telemetry_doc(kpis: dict[str, Any]) -> dict[str, Any]:
    """A device's telemetry-only KPIs for /api/state: `telemetry_kpis` as `classify --json`'s `kpis` (the
    figures of `trace_kpis`, {} before the first), and as the views show them: `telemetry_kpis_text` (the
    one line `top` shows) and `telemetry_kpis_notes` (each shown figure's method, for a tooltip)."""
    doc = {k: (_num(v, 3) if isinstance(v, float) else v) for k, v in kpis.items()}
    return {"telemetry_kpis": doc, "telemetry_kpis_text": kpi_text(kpis),
            "telemetry_kpis_notes": {i.name: kpi_note(i) for i in kpi_items(kpis)}}


class Agent:
    """Samples `source` every `interval_s` seconds in a background thread and keeps what the views read."""

    def __init__(
        self,
        source: LiveSource,
        interval_s: float = 1.0,
        *,
        classifier: LiveClassifier | None = None,
        prices: PriceConfig | None = None,
        history_ticks: int = 600,
        idle_util: float = 0.05,
        gap_factor: float = DEFAULT_GAP_FACTOR,
        hooks: HookKpiReader | None = None,
        store: Store | None = None,
        auto_scrape: bool = True,
    ) -> None:
        self.source = source
        self.interval_s = float(interval_s)
        self.prices = prices or PriceConfig()
        self.classifier = classifier if classifier is not None else LiveClassifier()
        # The data clock's interval: a replay at speed N still has its recorded spacing.
        self.data_interval_s = float(getattr(source, "native_interval_s", interval_s))
        # The ring holds at least what the classifier and its alarm read (120 s is 1,201 ticks at 10 Hz).
        capacity = max(history_ticks, self.classifier.ring_ticks(self.data_interval_s))
        self.state = LiveState(source.name, capacity=capacity, prices=self._device_prices,
                               idle_util=idle_util)
        self.hooks = hooks
        self.store = store  # every tick is also kept here, for `verify --since/--until` and history
        sinks: list[Sink] = [("writing the store", store.ingest)] if store is not None else []
        # `top`'s pipeline: phase into the state, hook KPIs where a run writes them, the one energy meter.
        # Each local GPU process's own claim beside the phase; a recognised engine scraped unasked.
        self.evidence = EvidenceTracker(auto_scrape)
        self.loop = TickLoop(source, interval_s, self.state,
                             annotate=Annotator(self.classifier, hooks, evidence=self.evidence),
                             sinks=sinks, gap_factor=gap_factor)
        self.started = time.time()
        self._thread: threading.Thread | None = None

    def _device_prices(self, info: DeviceInfo) -> Prices:
        return self.prices.for_device(info.name)

    def load_history(
        self, seconds: float | None = None, *, now: float | None = None,
        say: Callable[[str], None] | None = None,
    ) -> int:
        """Before `start()`: the watched devices' last `seconds` in the store (default: what the charts
        hold, `history_ticks` at the data's own interval) into the charts, with the classifier replayed over
        them, so the page has its history and a phase before the first live tick (as `top --store`).

        Energy, cost and ticks still count this session only. What was loaded, and any problem with the
        store (one line each, never raised), go to `say` (default: the status line). Returns samples loaded.
        """
        if self.store is None:
            return 0
        now = time.time() if now is None else now
        seconds = self.state.capacity * self.data_interval_s if seconds is None else seconds
        tell = self.state.note if say is None else say
        devices = self.source.devices()
        traces, failed = recent_traces(self.store, devices, seconds, tell, now)
        loaded = self.state.preload(traces, devices) if traces else 0
        if loaded:
            backfill_phases(self.state, self.classifier)
            tell(loaded_note(self.store.path, traces, now))
        elif not failed and seconds > 0:
            tell(f"history: {self.store.path}: nothing from the last {seconds / 60:.3g} min for the watched "
                 "devices")
        return loaded

    # ---- lifecycle ----

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="phasescope-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.loop.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        self.evidence.stop()

    def run(
        self, stop: threading.Event | None = None, duration: float | None = None, warm: bool = True
    ) -> None:
        """The loop: sample until `stop` (or `stop()`) is set or `duration` has passed, then close the source.
        Blocks: `start()` runs it in a thread; a view that owns the sampling thread (the demo's TUI) calls it
        there. `warm=False` when the classifier is being warmed elsewhere (its update waits for it)."""
        # warm: parse the model before the first tick, not inside it (it takes ~2 s)
        self.loop.run(stop, duration, before=self.classifier.warm_up if warm else None)

    def on_tick(self, batch: TickBatch) -> None:
        """One sample through the loop (the sampler calls it; tests drive it directly)."""
        self.loop.on_tick(batch)

    # ---- readers ----

    @property
    def sampler(self) -> Sampler:
        return self.loop.sampler

    @property
    def running(self) -> bool:
        return self.loop.running

    @property
    def exhausted(self) -> bool:
        """A replay that reached its end: the last picture stays up."""
        return self.loop.exhausted

    @property
    def failure(self) -> str:
        return self.loop.failure

    def source_up(self) -> bool:
        """Fresh samples are arriving: sampling runs and the last tick is recent."""
        last = self.loop.last_tick_mono
        if not self.running or not math.isfinite(last):
            return False
        return time.monotonic() - last <= max(UP_AFTER_INTERVALS * self.interval_s, 2.0)

    def devices(self) -> list[tuple[DeviceInfo, FloatArray, PhaseReading | None, bool]]:
        """(identity, latest values, phase reading, lost) per device, in the order first seen. Lost: no longer
        listed, or no data now (a GPU off the bus, which NVML keeps listed), as the views' NO DATA."""
        out = []
        for uuid in self.state.device_uuids():
            lost = self.state.is_dark(uuid)
            latest = np.full(len(SIGNAL_NAMES), np.nan) if lost else self.state.latest(uuid)
            info = self.state.device_info(uuid)
            # The classifier judges GPU telemetry: its verdict on the host's CPU load is not shown.
            reading = None if phase_from_hooks(info) else self.classifier.reading(uuid)
            out.append((info, latest, reading, lost))
        return out

    def health(self) -> dict[str, GpuHealth]:
        """uuid -> the GPU's last health read (ECC, remapped rows, PCIe replays, memory temperature, XIDs);
        GPUs whose source reads none are absent."""
        return self.state.health()

    def energy_results(self) -> dict[str, DeviceEnergy]:
        """uuid -> the device's energy so far (method, per-phase figures, and whether any was `measured`):
        the loop's one meter, as the status line and `top` read it."""
        return self.loop.energy_results()

    def snapshot(self) -> dict[str, Any]:
        """Everything the dashboard shows now, as JSON-ready data (the /api/state body)."""
        energy = self.energy_results()
        # Every process the newest tick saw, not the table's rows (capped, with a "+N more" row).
        procs = Counter({uuid: len(ps) for uuid, ps in self.state.processes().items()})
        idle_held = self.state.idle_held()
        kpis = self.state.device_kpis()
        telemetry = self.state.telemetry_kpis()
        evidence = self.state.evidence()
        proc_kpis = self._process_kpis()
        host_phases = self.state.host_phases()
        devices = []
        totals: dict[str, dict[str, float]] = {}
        # MIG rows at their share of the physical GPU's prices, as `top`'s and `cost`'s (kpi/cost.py).
        row_prices, price_notes = self.state.row_prices()
        health = self.health()
        for info, latest, reading, lost in self.devices():
            prices = row_prices.get(info.uuid) or self.prices.for_device(info.name)
            dev_energy = energy.get(info.uuid)
            phases = {}
            for label, pe in sorted((dev_energy.phases if dev_energy else {}).items()):
                # No second with a power or energy reading (`_EnergyFigures.measured`): the energy is unknown
                # (null), not 0 J, and so is its energy cost, also on a metered GPU (a phase spent in a
                # power-sensor dropout).
                cost = cost_of(pe.seconds, pe.joules, prices, pe.measured)
                phases[label] = {
                    "joules": _num(pe.joules, 3) if pe.measured else None,
                    "kwh": _num(pe.kwh) if pe.measured else None, "seconds": _num(pe.seconds, 3),
                    "covered_s": _num(pe.covered_s, 3), "cost": cost.to_dict(),
                }
                # NaN (null in the JSON) until some device in the phase has a known energy / cost.
                tot = totals.setdefault(label, {"joules": math.nan, "seconds": 0.0, "usd": math.nan})
                if pe.measured:
                    tot["joules"] = pe.joules + (tot["joules"] if math.isfinite(tot["joules"]) else 0.0)
                tot["seconds"] += pe.seconds
                if cost.total_usd is not None:
                    tot["usd"] = cost.total_usd + (tot["usd"] if math.isfinite(tot["usd"]) else 0.0)
            values = {s: _num(float(latest[SIGNAL_COLUMN[s]])) for s in SIGNAL_NAMES}
            devices.append({
                "uuid": info.uuid, "index": info.index, "name": info.name, "host": info.host, "lost": lost,
                "host_device": is_host_device(info),
                "phase": self._phase_doc(info, reading, host_phases),
                "latest": {k: v for k, v in values.items() if v is not None},
                "processes": procs[info.uuid],
                "idle_held": info.uuid in idle_held,
                "kpis": {k: _num(v) for k, v in kpis.get(info.uuid, {}).items()},
                "process_kpis": proc_kpis.get(info.uuid, []),
                **_telemetry_doc(telemetry.get(info.uuid, {})),
                # What its processes say they are (engine names and a role, never a command line): context
                # beside the phase, with `disagrees` where it contradicts the telemetry; null if not read.
                "evidence": claim.to_dict() if (claim := evidence.get(info.uuid)) is not None else None,
                # `measured`: the page's one test for "has energy" (the same rule as the phases' nulls).
                "energy": {"method": dev_energy.method if dev_energy else "none",
                           "measured": dev_energy.measured if dev_energy else False, "phases": phases},
                "priced": prices.priced,
                "price_note": price_notes.get(info.uuid, ""),
                "health": _health_doc(health.get(info.uuid)),
            })
        return {
            "source": self.source.name,
            "up": self.source_up(),
            "exhausted": self.exhausted,
            "ticks": self.state.ticks,
            "skipped": self.sampler.stats.skipped,
            "max_late_s": _num(self.sampler.stats.max_late_s),
            "interval_s": self.interval_s,
            "time": _num(self.state.last_tick_time, 3),
            # Add to every time here for the one to show: a replay's own clock (the trace's), 0 when live.
            "clock_offset_s": _num(self._clock_offset_s(), 3),
            "status": status_line(self.state),
            "model_version": self.classifier.model.version,
            "phases": list(PHASES),
            "devices": devices,
            "idle_held": idle_held,
            "totals": {k: {kk: _num(vv, 4) for kk, vv in v.items()} for k, v in sorted(totals.items())},
        }

    def _clock_offset_s(self) -> float:
        """The live state's clock offset (the tick loop keeps it per pass of a looping replay); the source's
        own where the state keeps none; 0 for a live source."""
        kept = getattr(self.state, "clock_offset_s", None)
        if kept:
            return float(kept)
        return float(getattr(self.source, "clock_offset_s", 0.0))

    def _phase_doc(
        self, info: DeviceInfo, reading: PhaseReading | None, host_phases: dict[str, str]
    ) -> dict[str, Any] | None:
        """The classifier's reading for a GPU; for the host, the phase its processes' hooks report (exact:
        no confidence), or None with a note when none report."""
        if not phase_from_hooks(info):
            return dict(reading.to_dict(), source="classifier") if reading else None
        label = host_phases.get(info.uuid, "")
        if not label:
            return None
        return {"phase": label, "confidence": None, "proba": {}, "since": None, "t": None, "held": False,
                "training_alarm": False, "alarm_at": None, "unknown_reason": None, "source": "hooks"}

    def _process_kpis(self) -> dict[str, list[dict[str, Any]]]:
        """uuid -> [{pid, label, phase, kpis}] for every process a hooked run reports on (e.g. the demo's
        two), from the state's per-PID records."""
        return {uuid: [{"pid": r.pid, "label": r.label, "phase": r.phase,
                        "kpis": {k: _num(v) for k, v in r.kpis.items()}} for r in records]
                for uuid, records in self.state.process_kpis().items()}

    def history(self, since: float = -math.inf) -> dict[str, Any]:
        """Chart data newer than `since` (data clock), per device: times, CHART_SIGNALS and phase bands."""
        out: dict[str, Any] = {}
        for uuid in self.state.device_uuids():
            times, columns = self.state.history_columns(uuid, CHART_SIGNALS)  # one tick's worth, all of it
            keep = np.round(times, 3) > since  # compare as sent: `since` is a t the client got from us
            series: dict[str, Any] = {"t": _series(times[keep], 3)}
            for s in CHART_SIGNALS:
                series[s] = _series(columns[s][keep], 4)
            lo = float(times[0]) if times.size else math.inf
            host = phase_from_hooks(self.state.device_info(uuid))  # no classifier bands on CPU load
            series["bands"] = [] if host else [  # every band in the kept history: few, the last one grows
                [round(b.start, 3), round(b.end, 3), b.phase] for b in self.classifier.bands(uuid, since=lo)
            ]
            out[uuid] = series
        return out
