"""From raw hook rows to tables (forwards, backward passes, optimizer steps) and a phase timeline.

Rules (exact, from what the hooks saw):
- a root call flagged DOWNSTREAM (a module holding no state, or one called on a forward's output: a loss or
  metric module) is no forward and carries no batch; its time is kept as work (`x_t0`, `x_t1`);
- a forward is *trained* when a backward pass reached its output graph;
- a step window runs from the first trained forward after the previous step of the main optimizer to the
  end of this step; everything in it (teacher forwards, loss, backward, step) is training work;
- a forward outside every step window that no backward reached is inference;
- live (`build(..., now=...)`, a run still going): a forward whose output carries an autograd graph and that
  no backward reached yet is *pending* (neither phase) while it is the newest call of its module and ended
  less than PENDING_GRACE_S ago: its backward may still come. The next call of the same module, or the grace
  period, settles it, so autograd-mode inference is late by one request at most; no-grad forwards never wait;
- consecutive units of one phase form a segment; a gap longer than `idle_gap_s` is an idle segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from phasescope.instrument import events as ev

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

# Longer than the hooks' default flush interval (2 s), so a backward written in the next chunk is still seen.
PENDING_GRACE_S = 5.0


@dataclass
class Segment:
    phase: str  # training | inference | idle
    start: float  # monotonic seconds
    end: float
    steps: int = 0
    forwards: int = 0

    def to_dict(self, wall_offset: float) -> dict[str, Any]:
        return {"phase": self.phase, "start": self.start + wall_offset, "end": self.end + wall_offset,
                "duration_s": self.end - self.start, "steps": self.steps, "forwards": self.forwards}


@dataclass
class Timeline:
    """Columnar tables of one process; times are monotonic seconds (wall = t + wall_offset)."""

    pid: int
    device: str
    wall_offset: float
    meta: dict[str, Any]
    # forwards (outermost module calls that finished), in start order
    f_idx: I64
    f_root: I64
    f_t0: F64
    f_t1: F64
    f_batch: F64
    f_seq: F64
    f_flags: I64
    f_trained: B
    f_in_window: B
    # calls that are no forward of their own (DOWNSTREAM: loss and metric modules), as work intervals
    x_t0: F64
    x_t1: F64
    # backward passes
    b_t0: F64
    b_t1: F64
    # optimizer steps of every optimizer
    o_id: I64
    o_step: I64
    o_t0: F64
    o_t1: F64
    main_opt: int
    # step windows of the main optimizer
    w_t0: F64
    w_t1: F64
    w_flop_sampled: B
    f_pending: B | None = None  # live only: may still be trained (see module doc); None: nothing pending
    # losses (the scalar each backward pass started from), in time order
    l_t: F64 = field(default_factory=lambda: np.empty(0))
    l_v: F64 = field(default_factory=lambda: np.empty(0))
    segments: list[Segment] = field(default_factory=list)

    def flag(self, bit: int) -> B:
        return (self.f_flags & bit) != 0

    @property
    def settled_mask(self) -> B:
        return ~self.f_pending if self.f_pending is not None else np.ones(self.f_idx.size, dtype=bool)

    @property
    def inference_mask(self) -> B:
        return ~self.f_trained & ~self.f_in_window & self.settled_mask

    @property
    def steps(self) -> int:
        return int(self.w_t1.size)


def _pair_by_key(begin: F64, end: F64, key_col: int) -> tuple[I64, F64, F64]:
    """Match begin/end rows on column `key_col`; keep keys that have both."""
    kb = begin[:, key_col].astype(np.int64)
    ke = end[:, key_col].astype(np.int64)
    common, ib, ie = np.intersect1d(kb, ke, assume_unique=False, return_indices=True)
    return common, begin[ib, 1], end[ie, 1]


def _forward_rows(rows: F64, kind: F64) -> F64:
    """Every finished forward as one FWD row (t=start, e=end); a version 1 log's FWD_BEGIN / FWD_END pairs
    are matched on the forward index and folded into such rows."""
    fwd = rows[kind == ev.FWD]
    fb, fe = rows[kind == ev.FWD_BEGIN], rows[kind == ev.FWD_END]
    if not fe.size:
        return fwd
    idx, t0, t1 = _pair_by_key(fb, fe, 3)
    # FWD_END rows are written in end order; re-find each forward's own row by its index.
    order_e = np.argsort(fe[:, 3], kind="stable")
    old = fe[order_e][np.searchsorted(fe[order_e, 3].astype(np.int64), idx)].copy()
    old[:, 0], old[:, 1], old[:, 7] = ev.FWD, t0, t1
    return np.concatenate([fwd, old])


def build(pe: ev.ProcessEvents, idle_gap_s: float = 10.0, now: float | None = None) -> Timeline:
    """The timeline of one process; `now` (Unix seconds) marks a live view of a run that is still going."""
    rows = pe.rows
    kind = rows[:, 0]
    fwd = _forward_rows(rows, kind)
    fwd = fwd[np.lexsort((fwd[:, 3], fwd[:, 1]))]  # written in end order; kept in start order (then index)
    down = (fwd[:, 6].astype(np.int64) & ev.DOWNSTREAM) != 0
    x_t0, x_t1 = fwd[down, 1], fwd[down, 7]
    fwd = fwd[~down]
    idx, t0, t1 = fwd[:, 3].astype(np.int64), fwd[:, 1], fwd[:, 7]
    trained_ids = np.unique(rows[kind == ev.BWD_FWD, 2].astype(np.int64))
    trained = np.isin(idx, trained_ids)

    bb, be = rows[kind == ev.BWD_BEGIN, 1], rows[kind == ev.BWD_END, 1]
    nb = min(bb.size, be.size)
    b_t0, b_t1 = bb[:nb], be[:nb]

    ob, oe = rows[kind == ev.OPT_BEGIN], rows[kind == ev.OPT_END]
    key_b = ob[:, 2].astype(np.int64) * 1_000_000_000 + ob[:, 3].astype(np.int64)
    key_e = oe[:, 2].astype(np.int64) * 1_000_000_000 + oe[:, 3].astype(np.int64)
    okey, ib, ie = np.intersect1d(key_b, key_e, return_indices=True)
    o_id, o_step = okey // 1_000_000_000, okey % 1_000_000_000
    o_t0, o_t1 = ob[ib, 1], oe[ie, 1]
    oo = np.argsort(o_t1, kind="stable")
    o_id, o_step, o_t0, o_t1 = o_id[oo], o_step[oo], o_t0[oo], o_t1[oo]

    main_opt = -1
    if o_id.size:
        ids, counts = np.unique(o_id, return_counts=True)
        main_opt = int(ids[np.argmax(counts)])  # most steps; ties -> first seen (lowest id)
    sel = o_id == main_opt
    s_t0, s_t1, s_step = o_t0[sel], o_t1[sel], o_step[sel]
    # Window start: the first trained forward after the previous step ended (or this step's own begin, for
    # closure-style optimizers that run forward and backward inside step()).
    tt0 = np.sort(t0[trained])
    prev_end = np.concatenate(([-np.inf], s_t1[:-1]))[: s_t1.size]
    cand = np.full(s_t1.shape, np.inf)
    if tt0.size:
        j = np.searchsorted(tt0, prev_end, side="right")
        ok = j < tt0.size
        cand[ok] = tt0[j[ok]]
    cand = np.where(cand < s_t1, cand, np.inf)
    w_t0 = np.minimum(cand, s_t0)
    w_t1 = s_t1
    flop = rows[kind == ev.FLOP_SAMPLE_END]
    sampled = np.isin(s_step, flop[:, 3].astype(np.int64)) if main_opt == 0 else np.zeros(s_step.size, bool)

    in_window = np.zeros(idx.size, dtype=bool)
    if w_t0.size and idx.size:
        k = np.searchsorted(w_t0, t0, side="right") - 1
        ok = k >= 0
        in_window[ok] = t0[ok] < w_t1[k[ok]]

    tl = Timeline(
        pid=pe.pid, device=pe.device, wall_offset=pe.wall_offset, meta=pe.meta,
        f_idx=idx, f_root=fwd[:, 2].astype(np.int64), f_t0=t0, f_t1=t1,
        f_batch=fwd[:, 4], f_seq=fwd[:, 5], f_flags=fwd[:, 6].astype(np.int64),
        f_trained=trained, f_in_window=in_window, x_t0=x_t0, x_t1=x_t1, b_t0=b_t0, b_t1=b_t1,
        o_id=o_id, o_step=o_step, o_t0=o_t0, o_t1=o_t1, main_opt=main_opt,
        w_t0=w_t0, w_t1=w_t1, w_flop_sampled=sampled,
    )
    loss = rows[kind == ev.LOSS]
    loss = loss[np.argsort(loss[:, 1], kind="stable")]  # written when read back, not when called
    tl.l_t, tl.l_v = loss[:, 1], loss[:, 2]
    if now is not None:
        tl.f_pending = _pending(tl, now - pe.wall_offset)
    tl.segments = _segments(tl, idle_gap_s)
    return tl


def _pending(tl: Timeline, now_mono: float) -> B:
    """Forwards a backward may still reach (module doc): graph, unreached, newest of their module, recent."""
    open_ = (tl.flag(ev.HAS_GRAPH) & ~tl.f_trained & ~tl.f_in_window
             & (tl.f_t1 > now_mono - PENDING_GRACE_S))
    newest = np.zeros(tl.f_idx.size, dtype=bool)
    if tl.f_idx.size:
        # forwards are in start order: the last occurrence of each root is its newest call
        _, last_rev = np.unique(tl.f_root[::-1], return_index=True)
        newest[tl.f_idx.size - 1 - last_rev] = True
    return open_ & newest


def _segments(tl: Timeline, idle_gap_s: float) -> list[Segment]:
    # Units: (start, end, is_training, steps, forwards)
    starts: list[F64] = []
    ends: list[F64] = []
    train: list[B] = []
    steps: list[I64] = []
    fwds: list[I64] = []
    if tl.w_t0.size:
        n_in = np.zeros(tl.w_t0.size, dtype=np.int64)
        if tl.f_in_window.any():
            k = np.searchsorted(tl.w_t0, tl.f_t0[tl.f_in_window], side="right") - 1
            n_in = np.bincount(k, minlength=tl.w_t0.size).astype(np.int64)
        starts.append(tl.w_t0)
        ends.append(tl.w_t1)
        train.append(np.ones(tl.w_t0.size, bool))
        steps.append(np.ones(tl.w_t0.size, np.int64))
        fwds.append(n_in)
    loose = ~tl.f_in_window & tl.settled_mask
    if loose.any():
        # trained forwards outside windows (backward without a step) run until their backward ended
        f_end = tl.f_t1[loose].copy()
        tr = tl.f_trained[loose]
        if tr.any() and tl.b_t1.size:
            kb = np.searchsorted(tl.b_t0, tl.f_t1[loose][tr], side="left")
            kb = np.minimum(kb, tl.b_t1.size - 1)
            f_end[tr] = np.maximum(f_end[tr], tl.b_t1[kb])
        starts.append(tl.f_t0[loose])
        ends.append(f_end)
        train.append(tr)
        steps.append(np.zeros(int(loose.sum()), np.int64))
        fwds.append(np.ones(int(loose.sum()), np.int64))
    if not starts:
        return []
    s, e, tr_all = np.concatenate(starts), np.concatenate(ends), np.concatenate(train)
    st, fw = np.concatenate(steps), np.concatenate(fwds)
    order = np.argsort(s, kind="stable")
    s, e, tr_all, st, fw = s[order], e[order], tr_all[order], st[order], fw[order]
    out: list[Segment] = []
    for i in range(s.size):
        phase = "training" if tr_all[i] else "inference"
        last = out[-1] if out else None
        if last is not None and s[i] - last.end > idle_gap_s:
            out.append(Segment("idle", last.end, float(s[i])))
            last = None
        if last is not None and last.phase == phase:
            last.end = max(last.end, float(e[i]))
            last.steps += int(st[i])
            last.forwards += int(fw[i])
        else:
            out.append(Segment(phase, float(s[i]), float(e[i]), int(st[i]), int(fw[i])))
    return out


def phase_segments(processes: list[ev.ProcessEvents], idle_gap_s: float = 10.0,
                   now: float | None = None) -> list[dict[str, Any]]:
    """Every phase segment (wall-clock times, with its `pid` and `device`) of the processes that ran at least
    one forward or optimizer step, by start time: the run summary's `segments`, without its KPIs."""
    out: list[dict[str, Any]] = []
    for pe in processes:
        tl = build(pe, idle_gap_s=idle_gap_s, now=now)
        if tl.f_idx.size or tl.o_id.size:
            out += [dict(s.to_dict(tl.wall_offset), pid=tl.pid, device=tl.device) for s in tl.segments]
    out.sort(key=lambda s: s["start"])
    return out
