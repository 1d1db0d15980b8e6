"""LiveClassifier on a replayed real recording: a GPU idles, then a training run migrates onto it."""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from phasescope.classify import onset, verdict
from phasescope.classify.model import PhaseModel, WindowPredictions
from phasescope.features import Floors, WindowFeatures
from phasescope.live.classify import LiveClassifier
from phasescope.live.state import LiveState
from phasescope.schema import PHASES, SIGNAL_NAMES, DeviceInfo, TickBatch, Trace
from phasescope.sources.host import HOST_KIND
from phasescope.sources.replay import read
from tests.live_helpers import TRAINING_RUN, ticks, training_traces

# Real RTX 3090 run (sensorguard): GPU 4 idles for ~50 s, then the training run migrates onto it.
MIGRATION_RUN = "sensorguard-rtx3090/20260830T145310Z_dev-migration_node1-gpu3-4_r01/nvml.csv"
TRAINING_FROM = 91407.932  # labels.csv: the labelled training span of this run starts here


@pytest.fixture(scope="module")
def model() -> PhaseModel:
    return PhaseModel.load()


@pytest.fixture(scope="module")
def migration(shared_data: Path) -> list[Trace]:
    return read(shared_data / MIGRATION_RUN)


@pytest.fixture(scope="module")
def alarm_model() -> PhaseModel:
    return onset.load_alarm_model()


def _replay(traces: list[Trace], lc: LiveClassifier, stop: int | None = None) -> tuple[LiveState, dict]:
    """Feed the recording tick by tick; returns the state and each device's sequence of phase changes."""
    state = LiveState("replay")
    changes: dict[str, list[tuple[float, str, float]]] = {}
    for batch in ticks(traces, stop=stop):
        state.ingest(batch)
        lc.update(state)
        for dev in batch.devices:
            r = lc.reading(dev.uuid)
            seq = changes.setdefault(dev.uuid, [])
            if r is not None and (not seq or seq[-1][1] != r.phase):
                seq.append((batch.time, r.phase, r.since))
    return state, changes


def test_idle_gpu_turns_training_when_the_run_migrates_onto_it(
    migration: list[Trace], model: PhaseModel
) -> None:
    lc = LiveClassifier(model)
    _, changes = _replay(migration, lc)
    gpu4 = next(t.device.uuid for t in migration if t.device.index == 4)
    phases = [p for _, p, _ in changes[gpu4]]
    assert "idle" in phases and phases[-1] == "training", phases
    assert phases.index("idle") < phases.index("training")
    seen_at, _, since = changes[gpu4][phases.index("training")]
    # Training is first seen after it began (labels.csv) and within two windows of it.
    assert TRAINING_FROM <= since <= seen_at <= TRAINING_FROM + 2 * lc.window_s
    r = lc.reading(gpu4)
    assert r is not None and r.phase == "training"
    assert set(r.proba) == set(PHASES) and math.isclose(sum(r.proba.values()), 1.0, rel_tol=1e-6)
    assert r.confidence == pytest.approx(r.proba["training"]) and r.confidence >= model.rules.min_proba
    bands = lc.bands(gpu4)
    assert [b.phase for b in bands][-1] == "training"
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(bands))  # in order, no overlap
    assert lc.phases()[gpu4] == "training"


def test_runs_only_every_s_on_the_data_clock(migration: list[Trace], model: PhaseModel) -> None:
    lc = LiveClassifier(model, every_s=10.0)
    state, _ = _replay(migration, lc, stop=61)  # 60 s of 1 Hz data, 2 devices
    # Runs at t0, t0+10, ..., t0+60 (ticks are ~1 s apart, jitter may shift one): 6 or 7 per device.
    assert 12 <= lc.runs <= 14
    before = lc.runs
    lc.update(state)  # same data time again: nothing is due
    assert lc.runs == before


def test_unknown_until_enough_history(migration: list[Trace], model: PhaseModel) -> None:
    lc = LiveClassifier(model)
    state = LiveState("replay")
    assert lc.reading(migration[0].device.uuid) is None
    lc.update(state)  # no tick yet: nothing to do
    assert lc.runs == 0
    batch = next(ticks(migration))
    state.ingest(batch)
    lc.update(state)
    r = lc.reading(migration[0].device.uuid)
    assert r is not None and r.phase == "unknown" and r.proba == {} and math.isnan(r.confidence)
    assert r.to_dict()["confidence"] is None


def _after_100_ticks(
    migration: list[Trace], model: PhaseModel, stop: int
) -> tuple[LiveClassifier, LiveState, list[TickBatch]]:
    """A classifier (30 s windows, a run every 5 s) that has seen the migration run's first 100 ticks, and
    the ticks up to `stop` (the tests play the rest with a device lost or failing)."""
    lc = LiveClassifier(model, window_s=30.0, every_s=5.0)
    state = LiveState("replay")
    all_ticks = list(ticks(migration, stop=stop))
    for batch in all_ticks[:100]:
        state.ingest(batch)
        lc.update(state)
    return lc, state, all_ticks


def test_a_lost_device_goes_unknown_once_its_window_is_empty(
    migration: list[Trace], model: PhaseModel
) -> None:
    lc, state, all_ticks = _after_100_ticks(migration, model, 150)
    keep = migration[1].device.uuid
    lost = migration[0].device.uuid
    assert lc.reading(lost) is not None and lc.reading(lost).phase != "unknown"  # type: ignore[union-attr]
    for batch in all_ticks[100:]:  # device 0 falls off: ticks carry device 1 only
        state.ingest(TickBatch(batch.time, [batch.devices[1]], batch.values[1:2]))
        lc.update(state)
    assert lc.reading(lost).phase == "unknown"  # type: ignore[union-attr]
    assert lc.reading(keep).phase != "unknown"  # type: ignore[union-attr]


def test_a_gpu_whose_rows_turn_nan_goes_unknown_within_two_runs(
    migration: list[Trace], model: PhaseModel
) -> None:
    """NVML keeps a lost GPU's row, all NaN: the samples before the loss must not keep (or give) it a phase
    for the rest of the window, nor meter its time under one. Dark for `every_s` is dark."""
    lc, state, all_ticks = _after_100_ticks(migration, model, 115)
    lost, keep = migration[0].device.uuid, migration[1].device.uuid
    assert lc.reading(lost).phase != "unknown"  # type: ignore[union-attr]
    for batch in all_ticks[100:112]:  # two classifier runs later, with 18 s of pre-loss data in its window
        values = batch.values.copy()
        values[0] = np.nan
        state.ingest(TickBatch(batch.time, batch.devices, values))
        lc.update(state)
    r = lc.reading(lost)
    assert r is not None and r.phase == "unknown" and not r.training_alarm
    assert lc.phases()[lost] == "unknown"  # what the energy meter attributes its time to
    assert lc.reading(keep).phase != "unknown"  # type: ignore[union-attr]


def test_one_failed_read_neither_flips_the_phase_nor_resets_the_alarm(
    migration: list[Trace], model: PhaseModel
) -> None:
    """A single all-NaN tick (one failed NVML read) on a classifier and alarm tick is not a lost GPU: the
    badge must not flip to unknown and back, nor the training alarm fall and fire again with a new start."""
    lc, state, all_ticks = _after_100_ticks(migration, model, 140)
    gpu = migration[0].device.uuid
    before = lc.reading(gpu)
    assert before is not None and before.phase == "training" and before.training_alarm
    seen, failed, last_failed = [], 0, False
    track = lc._tracks[gpu]
    for batch in all_ticks[100:]:
        values = batch.values.copy()
        due = batch.time - min(track.last_run, track.alarm_run) >= 5.0
        if due and not last_failed and failed < 4:  # isolated failed reads, each on a run tick
            values[0] = np.nan
            failed += 1
        last_failed = not np.isfinite(values[0]).any()
        state.ingest(TickBatch(batch.time, batch.devices, values))
        lc.update(state)
        r = lc.reading(gpu)
        assert r is not None
        seen.append((r.phase, r.training_alarm, r.alarm_at))
    assert failed == 4
    assert {s[0] for s in seen} == {"training"}
    assert all(s[1] and s[2] == before.alarm_at for s in seen)


T0 = 1000.0  # the scripted device's first sample


class _Confident:
    """A stand-in model whose k-th window (cut k strides after the device's first sample, as the real windows
    are) says script[k]: (label, probability of that label), or ("unknown", NaN) for a window not judged. The
    live path cuts, keeps and decodes the windows; only the model's answer is scripted."""

    def __init__(self, script: list[tuple[str, float]]) -> None:
        base = PhaseModel.load()
        self.rules, self.config, self.version, self.script = base.rules, base.config, "scripted", script

    def for_interval(self, interval_s: float) -> _Confident:
        return self

    def predict_features(self, wf: WindowFeatures, present: set[str], evidence: bool = False) -> tuple:
        n = len(wf.start)
        proba = np.full((n, len(PHASES)), np.nan)
        labels = []
        for i, start in enumerate(wf.start.tolist()):
            label, p = self.script[min(round((start - T0) / self.config.stride_s), len(self.script) - 1)]
            if label != "unknown":
                proba[i] = (1.0 - p) / (len(PHASES) - 1)
                proba[i, PHASES.index(label)] = p
            labels.append(label)
        return proba, labels, [{}] * n, "scripted", [""] * n


def _scripted(script: list[str]) -> _Confident:
    """Windows that are sure of what they say."""
    return _Confident([(label, 1.0) for label in script])


def _run_script(lc: LiveClassifier) -> list:
    """1 s ticks from T0; the reading at the tick each scripted window completes (the run that judges it)."""
    model = lc.model
    dev = DeviceInfo("GPU-x", "NVIDIA GeForce RTX 3090", 0)
    state = LiveState("scripted")
    row = np.full((1, len(SIGNAL_NAMES)), np.nan)
    row[0, 0] = 0.5
    cfg = model.config
    length = cfg.window_s - 1.0  # 30 grid points at 1 s: first to last
    ends = [T0 + k * cfg.stride_s + length for k in range(len(model.script))]  # type: ignore[attr-defined]
    out = []
    for k in range(int(ends[-1] - T0) + 1):
        t = T0 + k
        state.ingest(TickBatch(t, [dev], row))
        lc.update(state)
        if t in ends:
            out.append(lc.reading(dev.uuid))
    return out


def test_one_odd_window_does_not_flip_the_phase() -> None:
    script = ["idle", "idle", "training", "idle", "unknown", "training", "training", "training"]
    lc = LiveClassifier(_scripted(script), every_s=1.0, alarm=False)  # type: ignore[arg-type]
    seen = _run_script(lc)
    # One sure window gives 4.6 nats, a switch costs 6: the lone "training" (k=2) is ignored, "unknown"
    # (k=4) is bridged and keeps the phase (held), two in a row switch (k=6).
    assert [r.phase for r in seen] == ["idle", "idle", "idle", "idle", "idle", "idle", "training", "training"]
    assert seen[4].held and not seen[3].held
    assert seen[-1].since == seen[6].t == T0 + 6 * 15.0 + 29.0  # first shown when window 6 was judged


def test_rejects_nonsense_settings(model: PhaseModel) -> None:
    with pytest.raises(ValueError, match="every_s"):
        LiveClassifier(model, every_s=0.0)


def _labelled_starts(shared_data: Path, run: str, traces: list[Trace]) -> dict[str, float | None]:
    """uuid -> labelled training start (labels.csv t_from) of one recording's devices; None: no training."""
    with open(shared_data / "labels.csv", newline="") as f:
        rows = {r["gpu_index"]: r for r in csv.DictReader(f) if r["path"] == run}
    out = {}
    for t in traces:
        r = rows[str(t.device.index)]
        out[t.device.uuid] = float(r["t_from"]) if r["label"] == "training" else None
    return out


def _alarm_replay(traces: list[Trace], lc: LiveClassifier, stop: int | None = None) -> dict[str, dict]:
    """Per uuid: data time the alarm first held, the badge first said training, the alarm's states."""
    state = LiveState("replay")
    out: dict[str, dict] = {t.device.uuid: {"fired": None, "badge": None, "states": set()} for t in traces}
    for batch in ticks(traces, stop=stop):
        state.ingest(batch)
        lc.update(state)
        for dev in batch.devices:
            r = lc.reading(dev.uuid)
            seen = out[dev.uuid]
            if r is None:
                continue
            seen["states"].add((r.training_alarm, r.alarm_at is not None))
            if r.training_alarm and seen["fired"] is None:
                seen["fired"] = batch.time
                assert r.alarm_at == batch.time and r.to_dict()["alarm_at"] == batch.time
            if r.phase == "training" and seen["badge"] is None:
                seen["badge"] = batch.time
    return out


@pytest.mark.parametrize("run", [MIGRATION_RUN, TRAINING_RUN])
def test_training_alarm_fires_after_the_labelled_start_and_before_the_badge(
    shared_data: Path, run: str, model: PhaseModel, alarm_model: PhaseModel
) -> None:
    # Real SensorGuard recordings with telemetry before the start. The shipped onset model was fitted on
    # these runs among others, so this checks the live wiring, not accuracy (docs/EVALUATION.md has that).
    traces = read(shared_data / run) if run == MIGRATION_RUN else training_traces(shared_data)
    starts = _labelled_starts(shared_data, run, traces)
    assert all(t.time[0] < start for t in traces if (start := starts[t.device.uuid]) is not None)
    lc = LiveClassifier(model, alarm_model=alarm_model)
    begun = [s for s in starts.values() if s is not None]
    # Stop two minutes after the start: time enough for the alarm, not for the test.
    stop = int(np.searchsorted(traces[0].time, max(begun) + 120.0))
    got = _alarm_replay(traces, lc, stop=stop)
    for uuid, start in starts.items():
        seen = got[uuid]
        assert seen["states"] <= {(False, False), (True, True)}  # alarm_at set exactly while it holds
        if start is None:  # an idle bystander: never alarmed
            assert seen["fired"] is None, seen
            continue
        assert seen["fired"] is not None and start <= seen["fired"] <= start + 60.0, (start, seen)
        # The point of the onset model: it fires before the window classifier's badge turns training.
        assert seen["badge"] is None or seen["fired"] < seen["badge"], (start, seen)
    assert lc.alarm_runs > 0


def test_alarm_can_be_turned_off(migration: list[Trace], model: PhaseModel) -> None:
    off = LiveClassifier(model, alarm=False)
    _replay(migration, off, stop=40)
    assert off.alarm_runs == 0 and off.runs > 0
    r = off.reading(migration[0].device.uuid)
    assert r is not None and not r.training_alarm and r.to_dict()["alarm_at"] is None


def test_the_host_is_never_judged_nor_alarmed_on(
    migration: list[Trace], model: PhaseModel, alarm_model: PhaseModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host pseudo-device (CPU and RAM) gets its phase from hooks: neither the phase model nor the
    # alarm ever sees its telemetry (here the GPU's own values, which the model would happily judge).
    host = DeviceInfo("host-n1", "Some CPU", None, "n1", extra={"kind": HOST_KIND})
    gpu = migration[0]
    judged: list[str] = []
    alarmed: list[str] = []
    predict, alarm_windows = LiveClassifier._predict_batched, onset.OnsetAlarm.windows

    def spy_predict(
        self: LiveClassifier, asked: Sequence[tuple[Trace, Floors, bool]]
    ) -> list[WindowPredictions]:
        judged.extend(trace.device.uuid for trace, _, _ in asked)
        return predict(self, asked)

    def spy_alarm(self: onset.OnsetAlarm, trace: Trace) -> WindowFeatures | None:
        alarmed.append(trace.device.uuid)
        return alarm_windows(self, trace)

    monkeypatch.setattr(LiveClassifier, "_predict_batched", spy_predict)
    monkeypatch.setattr(onset.OnsetAlarm, "windows", spy_alarm)
    lc = LiveClassifier(model, alarm_model=alarm_model)
    state = LiveState("replay")
    for batch in ticks([gpu], stop=40):
        state.ingest(TickBatch(batch.time, [gpu.device, host], np.vstack([batch.values, batch.values])))
        lc.update(state)
    assert host.uuid not in judged and host.uuid not in alarmed
    assert set(judged) == {gpu.device.uuid} and lc.runs > 0  # the GPU beside it is judged as ever
    assert lc.reading(host.uuid) is None and lc.bands(host.uuid) == [] and host.uuid not in lc.phases()
    assert lc.reading(gpu.device.uuid) is not None
    assert lc.alarm_runs == lc.runs  # every_s and the alarm's stride are both 5 s: one per GPU run


def test_warm_up_parses_the_alarm_model_too(model: PhaseModel) -> None:
    fresh = onset.load_alarm_model()
    assert all(sub._booster is None for sub in fresh.submodels)  # parsed on first use, not on load
    LiveClassifier(model, alarm_model=fresh, alarm=False).warm_up()
    assert all(sub._booster is None for sub in fresh.submodels)  # alarm off: not parsed at all
    LiveClassifier(model, alarm_model=fresh).warm_up()
    assert all(sub._booster is not None for sub in fresh.submodels)  # no tick pays for the parse


CONFIDENT = [("training", 0.9), ("training", 0.9), ("training", 0.55), ("training", 0.55), ("training", 0.9)]


def test_min_confidence_unset_changes_nothing() -> None:
    lc = LiveClassifier(_Confident(list(CONFIDENT)), every_s=1.0, alarm=False)  # type: ignore[arg-type]
    seen = _run_script(lc)
    assert [r.phase for r in seen] == ["training"] * 5
    assert all(r.to_dict()["unknown_reason"] is None for r in seen)


def test_a_reading_below_min_confidence_reads_unknown_and_says_why() -> None:
    lc = LiveClassifier(  # the config's [thresholds] min_confidence
        _Confident(list(CONFIDENT)), every_s=1.0, alarm=False, min_confidence=0.6  # type: ignore[arg-type]
    )
    seen = _run_script(lc)
    assert [r.phase for r in seen] == ["training", "training", "unknown", "unknown", "training"]
    low = seen[2].to_dict()
    assert low["unknown_reason"] == "training at confidence 0.55 < min_confidence 0.6"
    assert low["confidence"] is None and low["proba"]["training"] == pytest.approx(0.55)
    assert seen[3].since == seen[2].t  # unknown since it first fell below
    # The phase underneath never changed: it returns at once, with its own since, and bands say what showed.
    assert seen[4].since == seen[0].since and seen[4].unknown_reason == ""
    # (The first band is the first tick's: one sample, nothing to judge.)
    assert [b.phase for b in lc.bands("GPU-x")] == ["unknown", "training", "unknown", "training"]
    assert lc.phases() == {"GPU-x": "training"}


def test_min_confidence_does_not_blank_a_confident_transition() -> None:
    # Every window is 95% sure. While the decoder holds training against inference, the reading's own
    # confidence is training's share of an inference window (~2%): gating on it showed "unknown" until the
    # switch, with a reason that blamed a confident model.
    script = [("training", 0.95)] * 3 + [("inference", 0.95)] * 6
    lc = LiveClassifier(
        _Confident(list(script)), every_s=1.0, alarm=False,  # type: ignore[arg-type]
        min_confidence=0.6, min_segment_s=3.0,
    )
    seen = _run_script(lc)
    # log(0.95 / 0.0167) = 4.0 nats a window against a 6-nat switch: the second inference window switches.
    assert [r.phase for r in seen] == ["training"] * 4 + ["inference"] * 5
    assert all(r.unknown_reason == "" for r in seen)
    assert [b.phase for b in lc.bands("GPU-x")] == ["unknown", "training", "inference"]
    # An unsure window still gates, whichever phase the decoder holds: the reason names the window's call.
    unsure = [("training", 0.95)] * 3 + [("inference", 0.55)]
    lc = LiveClassifier(_Confident(list(unsure)), every_s=1.0, alarm=False,  # type: ignore[arg-type]
                        min_confidence=0.6)
    last = _run_script(lc)[-1]
    assert last.phase == "unknown"
    assert last.unknown_reason == "inference at confidence 0.55 < min_confidence 0.6"


def test_min_segment_s_makes_a_new_phase_wait_that_long() -> None:
    # Two sure training windows between idle ones, then a training run: the decoder shows the short stretch
    # until an idle window after it makes two switches dearer than ignoring it; with min_segment_s (as the
    # verdict's `merge_short`) a phase shows only once its segment is that long.
    script = ["idle"] * 5 + ["training"] * 2 + ["idle"] * 3 + ["training"] * 6
    default = LiveClassifier(_scripted(script), every_s=1.0, alarm=False)  # type: ignore[arg-type]
    assert [r.phase for r in _run_script(default)][:8] == ["idle"] * 6 + ["training", "idle"]
    lc = LiveClassifier(_scripted(script), every_s=1.0, alarm=False, min_segment_s=60.0)  # type: ignore[arg-type]
    seen = _run_script(lc)
    # The later run's segment starts halfway between the centres of windows 9 and 10 (T0 + 157 s) and
    # reaches 60 s with window 13 (ends T0 + 224 s); the short stretch (37 s) never reaches it.
    assert [r.phase for r in seen] == ["idle"] * 13 + ["training"] * 3
    assert seen[-1].since == T0 + 13 * 15.0 + 29.0


def test_bad_thresholds_are_refused(model: PhaseModel) -> None:
    with pytest.raises(ValueError, match="min_confidence"):
        LiveClassifier(model, min_confidence=1.5)
    with pytest.raises(ValueError, match="min_segment_s"):
        LiveClassifier(model, min_segment_s=-1.0)


def test_min_confidence_under_the_models_bar_lowers_it(model: PhaseModel) -> None:
    assert LiveClassifier(model, alarm=False).model.rules.min_proba == model.rules.min_proba == 0.5
    assert LiveClassifier(model, alarm=False, min_confidence=0.3).model.rules.min_proba == 0.3
    # Above it, the model's bar stays: a window it calls below min_confidence reads unknown with the reason.
    assert LiveClassifier(model, alarm=False, min_confidence=0.8).model.rules.min_proba == 0.5


def _phase_changes(traces: list[Trace], lc: LiveClassifier, capacity: int) -> dict[int, list[tuple]]:
    """Per GPU index: (tick, phase, since) at each phase change, times from the first tick, rounded to ms."""
    state = LiveState("replay", capacity)
    t0 = float(traces[0].time[0])
    changes: dict[int, list[tuple]] = {}
    for batch in ticks(traces):
        state.ingest(batch)
        lc.update(state)
        for dev in batch.devices:
            r = lc.reading(dev.uuid)
            seq = changes.setdefault(dev.index, [])
            if r is not None and (not seq or seq[-1][1] != r.phase):
                seq.append((round(batch.time - t0, 3), r.phase, round(r.since - t0, 3)))
    return changes


def _lag_bound_s(stride_s: float, window_s: float, every_s: float, k: int) -> float:
    """How long the live phase may trail a change the verdict places, when k new windows are needed to
    outweigh the decoder's switch cost (docs/design/live-classifier.md, "One verdict")."""
    return (k - 0.5) * stride_s + window_s / 2 + every_s


def test_a_training_gpu_sampled_at_0_1_hz_reads_training_within_a_few_runs(
    shared_data: Path, model: PhaseModel
) -> None:
    # The real 1 Hz training run, every 10th row: 0.1 Hz, as a 10 s NVML interval or recording gives. 60 s
    # held 6 samples and the model judges no window under 8 (offline `classify` answers on such data), so
    # this GPU read "unknown" for its whole 13 minutes.
    traces = [t.take(np.arange(0, len(t), 10)) for t in training_traces(shared_data)]
    lc = LiveClassifier(model, alarm=False)
    # Windows widen to 8 points (80 s, stride 40 s); a run reads 120 s of context, a window, a stride, a run.
    assert lc.read_span(10.0) == 120.0 + 80.0 + 40.0 + 5.0
    changes = _phase_changes(traces, lc, capacity=lc.ring_ticks(10.0))  # the ring the views would size
    gpu0 = [p for _, p, _ in changes[0]]
    assert "training" in gpu0, changes[0]
    first = gpu0.index("training")
    # Judged from the 8th sample (70 s) on; training within the lag bound (two sure windows) of where the
    # 1 Hz verdict starts it (82 s, `test_at_1_hz_the_live_phase_follows_the_verdict`).
    assert changes[0][1][0] <= 70.0 and changes[0][first][0] <= 82.0 + _lag_bound_s(40.0, 80.0, 5.0, 2)
    # The GPU idling beside it is never called working. (Samples 10 s apart with ms jitter put some spans'
    # median interval just over the model's 10 s limit: those windows are unknown, and bridged or not.)
    assert set(p for _, p, _ in changes[1]) <= {"unknown", "idle"} and changes[1][-1][1] == "idle"


def test_at_1_hz_the_live_phase_follows_the_verdict(shared_data: Path, model: PhaseModel) -> None:
    # The live path decodes the verdict's own windows: the same phases in the same order, each shown after
    # the verdict places it and within the lag bound. The run's first training windows are less sure (about
    # 2-3 nats each against the 6-nat switch): three are needed, so k = 3 there.
    traces = training_traces(shared_data)
    lc = LiveClassifier(model, alarm=False)
    assert lc.read_span(1.0) == 120.0 + 30.0 + 15.0 + 5.0 and lc.ring_ticks(1.0) == 171
    changes = _phase_changes(traces, lc, capacity=lc.ring_ticks(1.0))
    t0 = float(traces[0].time[0])
    bound = _lag_bound_s(15.0, 30.0, lc.every_s, 3) + 1.0  # + one 1 s tick
    for trace in traces:
        segs = verdict.build(trace, model).segments
        live = changes[trace.device.index]
        assert live[0][1] == "unknown" and [p for _, p, _ in live[1:]] == [s.label for s in segs]
        assert live[1][0] <= 11.0  # the first reading after a few samples (warm-up: the newest window)
        for (t, _, _), seg in zip(live[2:], segs[1:], strict=True):
            assert seg.start - t0 <= t <= seg.start - t0 + bound, (t, seg)
