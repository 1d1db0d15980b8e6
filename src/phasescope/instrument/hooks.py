"""PyTorch hooks, mostly through supported APIs; they write rows into an EventBuffer and do O(1) work.

- Roots (outermost module calls: one request, or one training forward). A global pre hook
  (`register_module_forward_pre_hook`, the finder) sees a root's first call, which the root's own one-off
  forward hook (always_call) ends, and gives the root a slot: its `_compiled_call_impl`, which torch's
  `__call__` calls before `_call_impl` (the attribute `Module.compile()` sets; `_Slot` below; a compiled
  call the user put there is called by the slot and given back). The slot times each later call. During a
  root call the finder is out of torch's dict, so every module inside it (and the root, after its first
  call) takes `_call_impl`'s fast path: any module hook, global or the root's own, sends a call through
  the slow one (several us each on a CPU). The finder is back in torch's dict between root calls, so new
  roots are found. Hook dicts are per-process, not per-thread: once a second thread calls modules, or more
  threads run than at install(), the finder stays in so no thread can miss a new root. Roots that cannot
  have a slot (a ScriptModule, a torch without the attribute) are followed by global hooks on every call
  ("global mode", slower).
- The outermost forward's output `grad_fn.register_prehook(...)`: fires when a backward pass reaches that
  forward's graph, so we learn which forwards were trained on. The autograd engine's `queue_callback`
  (what DDP and FSDP use) marks the end of that backward pass.
- `register_optimizer_step_pre_hook` / `register_optimizer_step_post_hook`: one optimizer step = one step.
- The loss: `torch.autograd.backward` (which `Tensor.backward` calls) is wrapped while installed, and a
  one-element tensor a backward pass starts from is kept (an AMP `GradScaler.scale` output maps back to the
  loss it scaled). Never a device sync in the step: a CPU loss is read at once, a CUDA one is copied to
  pinned host memory without blocking and read by the flush thread once its CUDA event has completed.
- A root call is flagged DOWNSTREAM, no forward of its own and no batch (timeline.py keeps it as work only),
  when its module holds no state (no parameters, buffers or state dict: a loss, metric or activation module)
  or its first input carries an autograd graph (called on a forward's output: `criterion(model(x), y)`).
- Once per run (on one sampled step) `FlopCounterMode` counts that step's FLOPs and the optimizer's
  parameter / gradient / state bytes are summed; once per root module, `saved_tensors_hooks` measures
  the activations autograd keeps for one grad-enabled forward.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
import threading
import weakref
from functools import partial
from pathlib import Path
from time import monotonic
from typing import Any

import torch
import torch.fx._symbolic_trace as fx_trace
import torch.nn.modules.module as nn_module
from torch import Tensor
from torch.optim import optimizer as optim_module

from phasescope.instrument import events as ev

_RAISED: Any = object()  # sentinel: torch called the forward hook on the exception path
# Module-level names for the hot path (a global lookup instead of an attribute lookup per event).
_FWD = ev.FWD
_GRAD_ENABLED, _INFERENCE_MODE, _MODULE_TRAINING = ev.GRAD_ENABLED, ev.INFERENCE_MODE, ev.MODULE_TRAINING
_TOKEN_INPUT, _HAS_GRAPH, _RAISED_FLAG = ev.TOKEN_INPUT, ev.HAS_GRAPH, ev.RAISED
_DOWNSTREAM = ev.DOWNSTREAM
is_grad_enabled = torch.is_grad_enabled
is_inference_mode_enabled = torch.is_inference_mode_enabled
# True while torch.compile traces: the slot then only calls through, and the global hooks run their eager
# selves (torch.compiler.disable: a graph break around them, where they run; the model is still compiled).
is_compiling = torch.compiler.is_compiling
is_exporting = torch.compiler.is_exporting
# The autograd node running in this thread, None outside backward: recomputation (activation checkpointing)
# inside backward is not a new forward. Per thread, unlike a flag set by our backward hooks.
_autograd_node = torch._C._current_autograd_node
_tracing_state = torch._C._get_tracing_state  # set while torch.jit.trace runs the model: not a forward


def _fx_tracing() -> bool:
    """torch.fx.symbolic_trace runs: its calls of modules on Proxies are not forwards (torch's own flag, read
    directly: `is_fx_tracing()` warns)."""
    return bool(getattr(fx_trace, "_is_fx_tracing_flag", False))
_MODULE_PY = nn_module.__file__
_TOKEN_DTYPES = frozenset({torch.int64, torch.int32, torch.int16})


class _ActiveCount:
    """len() is threading.active_count(): stands in for threading's dicts where this Python has none."""

    def __len__(self) -> int:
        return threading.active_count()


# `len(_LIMBO) + len(_ACTIVE)` is threading.active_count() without its lock and Python frame (~300 ns a root
# call; two len() ~50 ns). _LIMBO is read first: a thread moving from _limbo to _active meanwhile is counted
# twice, never missed.
_LIMBO: Any = getattr(threading, "_limbo", None)
_ACTIVE: Any = getattr(threading, "_active", None)
if type(_LIMBO) is not dict or type(_ACTIVE) is not dict:
    _LIMBO, _ACTIVE = _ActiveCount(), {}

# Layers whose forward differs between train() and eval(): what makes a mode bug a real bug.
_MODE_SENSITIVE: tuple[type[torch.nn.Module], ...] = (
    torch.nn.modules.dropout._DropoutNd,
    torch.nn.modules.batchnorm._BatchNorm,
)


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Tensor | None:
    for a in args:
        if isinstance(a, Tensor):
            return a
    if kwargs:
        t = kwargs.get("input_ids")
        if isinstance(t, Tensor):
            return t
        for v in kwargs.values():
            if isinstance(v, Tensor):
                return v
    if args:
        a0 = args[0]
        if isinstance(a0, (list, tuple)) and a0 and isinstance(a0[0], Tensor):
            return a0[0]
        if isinstance(a0, dict):
            return _first_tensor((), a0)
    return None


def _graph_of(out: Any) -> Any:
    """The autograd node of the forward's main output (loss if the model returns one), or None."""
    if isinstance(out, Tensor):
        return out.grad_fn
    if isinstance(out, dict):  # also Hugging Face ModelOutput
        loss = out.get("loss")
        if isinstance(loss, Tensor) and loss.grad_fn is not None:
            return loss.grad_fn
        values = list(out.values())[:4]
    elif isinstance(out, (tuple, list)):
        values = list(out[:4])
    else:
        return None
    for v in values:
        if isinstance(v, Tensor) and v.grad_fn is not None:
            return v.grad_fn
    return None


def _cuda_uuid(device: torch.device) -> str:
    props = torch.cuda.get_device_properties(device)
    text = str(props.uuid)
    # NVML names devices "GPU-<uuid>" (MIG: "MIG-<uuid>"); torch gives the bare UUID.
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _has_state(module: torch.nn.Module) -> bool:
    """Whether the module saves any state (True when its state dict cannot be taken: it counts as a model)."""
    try:
        return bool(module.state_dict())
    except Exception:
        return True


def _tensor_bytes(t: Tensor) -> int:
    return int(t.numel() * t.element_size())


def _module_py_frame(frame: Any) -> Any:
    """The nearest frame, `frame` or a caller, running torch's module.py (None if none): where torch called a
    hook from, past the frames torch.compiler.disable adds."""
    while frame is not None and frame.f_code.co_filename != _MODULE_PY:
        frame = frame.f_back
    return frame


def _hook_caller(frame: Any) -> Any:
    """The frame of torch's `_call_impl` that called a hook (or of its compiled resumption when the hook runs
    at a torch.compile graph break). Not its nested `inner()`: torch runs always-called hooks from
    `_call_impl` itself after `inner()` raised, and the call is alive until then."""
    caller = _module_py_frame(frame)
    if caller is None:
        return frame
    outer = caller.f_back
    if caller.f_code.co_name == "inner" and outer is not None and outer.f_code.co_filename == _MODULE_PY:
        return outer
    return caller


def _on_stack(frame: Any, target: Any) -> bool:
    """Whether `target` is `frame` or one of its callers."""
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


class _ThreadState:
    """One thread's place in the forward calls (slots: ~20 ns an access; threading.local: ~130 ns)."""

    __slots__ = ("end_hook", "frame", "gmode", "idx", "rid", "root", "same", "t0")

    def __init__(self) -> None:
        self.root: torch.nn.Module | None = None  # the module of the root call running, None between calls
        self.same = 0  # a hooks-followed call: how many times that module has called itself
        self.gmode = False  # hooks follow this call, not the slot (a root's first call, or one with no slot)
        self.end_hook: Any = None  # handle of the root's own one-off forward hook that ends this call, if any
        self.rid = -1  # root id, forward index and start (monotonic) of that call
        self.idx = -1
        self.t0 = 0.0
        # A hooks-followed call's caller frame: gone from the stack once a BaseException (KeyboardInterrupt)
        # ended the call without torch's always-call hooks, which catch Exception only.
        self.frame: Any = None


class Recorder:
    """Holds the hook handles, the event buffer and what was learned about modules and optimizers."""

    def __init__(self, events_dir: str | Path | None = None, flush_s: float = 2.0,
                 flop_sample_step: int = 1, count_flops: bool = True) -> None:
        self.buffer = ev.EventBuffer()
        self._emit = self.buffer.rows.append
        self._tl = threading.local()
        self._roots: dict[int, int] = {}
        self._unsampled: set[int] = set()  # roots whose activation memory is still to be measured
        self._root_refs: list[weakref.ReferenceType[torch.nn.Module]] = []
        self.roots: list[dict[str, Any]] = []
        self._stateless: list[bool] = []  # per root: holds no state (its calls are DOWNSTREAM, not forwards)
        self._opts: dict[int, int] = {}
        self._opt_refs: list[weakref.ReferenceType[torch.optim.Optimizer]] = []
        self.optimizers: list[dict[str, Any]] = []
        self._opt_steps: list[int] = []
        self._fwd_ids = itertools.count()
        self._lock = threading.Lock()  # rare paths only: first call of a new root, the saved-tensor sample
        self._in_bwd = False
        self._engine = getattr(torch.autograd.Variable, "_execution_engine", None)
        self.device: str | None = None
        self.device_name = ""
        self.flop_sample_step = max(1, int(flop_sample_step))
        self._count_flops = count_flops
        self._flop_mode: Any = None
        self.flop_sample: dict[str, Any] | None = None
        self.memory_sample: dict[str, Any] | None = None
        self._saved_ctx: Any = None
        self._handles: list[Any] = []
        # Losses not yet written: (t, value) on the CPU, (t, pinned host buffer, CUDA event) for a CUDA loss.
        self._losses: list[tuple[float, Any, Any]] = []
        self._loss_lock = threading.Lock()
        self._scaled: dict[int, tuple[weakref.ReferenceType[Tensor], Tensor]] = {}  # GradScaler out -> loss
        self._patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) put back by uninstall
        self._gdict: dict[int, Any] | None = None
        self._gid = -1
        self._finder: Any = None
        self._armed = False
        self._global_post: Any = None  # the global forward hook, while calls of roots with no slot run
        self._gmode_calls = 0
        # Handles of the one-off forward hooks that end the calls the finder began (a root's first call),
        # removed by uninstall() if still there.
        self._end_hooks: set[Any] = set()
        # per root: has a slot (False: followed by the global hooks; None: not tried since install())
        self._hooked: list[bool | None] = []
        # Roots given a slot (weak: a slot holds its module weakly too, so a model is freed when dropped).
        self._root_slots: list[weakref.ReferenceType[torch.nn.Module]] = []
        # Threads that have called a module since install(), with their state (the flush thread reads it).
        self._callers: dict[int, _ThreadState] = {}
        self._multi = False
        # Threads alive at install() (with phasescope's flush thread): while no more run and one thread has
        # called modules, no other thread can call one during a root call, so the finder may leave the dict.
        self._threads0 = 1
        self._registered = False  # the at-fork and at-exit callbacks
        self.events_dir = Path(events_dir) if events_dir else None
        self.flush_s = flush_s
        self._flush_lock = threading.Lock()
        self._seq = 0
        self._wrote = False
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        # Hooks torch.compile meets in code it traces run for real (a graph break where they are called).
        self._find_root_eager = torch.compiler.disable(self._find_root_body)
        self._global_end_eager = torch.compiler.disable(self._global_end_body)
        self._own_end_eager = torch.compiler.disable(self._own_end)

    # ----- installation -------------------------------------------------------------------------
    def install(self) -> None:
        self._reset_threads()  # a thread stopped mid-forward by uninstall() must not stay "inside"
        pre = nn_module.register_module_forward_pre_hook(self._find_root)
        # torch's dict of global pre hooks: the finder is taken out of it during a root call and put back
        # after, by its handle id. Without that dict (another torch) it just stays in: slower, still right.
        gdict = getattr(nn_module, "_global_forward_pre_hooks", None)
        self._gdict = gdict if isinstance(gdict, dict) and gdict.get(pre.id) is not None else None
        self._gid = pre.id
        self._finder = self._gdict[pre.id] if self._gdict is not None else None
        self._armed = True
        self._handles = [
            pre,
            optim_module.register_optimizer_step_pre_hook(self._opt_pre),
            optim_module.register_optimizer_step_post_hook(self._opt_post),
        ]
        self._patch_loss()
        if not self._registered:  # once per Recorder, however often it is installed
            self._registered = True
            os.register_at_fork(after_in_child=self._after_fork)
            if self.events_dir is not None:
                atexit.register(self.flush)
        if self.flush_s > 0:  # writes new rows, or (in memory only) compacts them into arrays
            self._stop = threading.Event()
            self._flusher = threading.Thread(target=self._flush_loop, name="phasescope-flush", daemon=True)
            self._flusher.start()
        self._threads0 = len(_LIMBO) + len(_ACTIVE)

    def uninstall(self) -> None:
        self._armed = False  # a root call still running must not put the finder back
        for h in self._handles:
            h.remove()
        self._handles = []
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched = []
        if self._global_post is not None:
            self._global_post.remove()
            self._global_post = None
        self._gmode_calls = 0
        for handle in list(self._end_hooks):
            handle.remove()
        self._end_hooks.clear()
        for ref in self._root_slots:
            module = ref()
            slot = None if module is None else module.__dict__.get("_compiled_call_impl")
            if isinstance(slot, _Slot) and slot.rec is self:
                if slot.users is None:
                    del module.__dict__["_compiled_call_impl"]
                else:
                    module.__dict__["_compiled_call_impl"] = slot.users
        self._root_slots = []
        self._hooked = [None] * len(self._hooked)  # a later install() gives the roots slots again
        self._reset_threads()
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(5.0)  # gone before a later install() counts the threads alive
        self._end_flop_sample(record=False)
        self.flush()
        with self._lock:  # a root call that read _armed before it was cleared may have put the finder back
            if self._gdict is not None:
                self._gdict.pop(self._gid, None)

    def _reset_threads(self) -> None:
        self._tl = threading.local()  # .st: this thread's _ThreadState
        self._callers = {}
        self._multi = False

    def _after_fork(self) -> None:
        # A forked child (DataLoader worker, fork-based server) starts with an empty log and does not write:
        # its parent's rows are the parent's. Spawned children are recorded through sitecustomize instead.
        self.buffer.clear()
        self._losses = []  # the parent's CUDA events mean nothing here
        self._loss_lock = threading.Lock()
        self._pid = os.getpid()
        self.events_dir = None
        self._reset_threads()
        self._lock = threading.Lock()  # another parent thread may have held it at the fork
        for handle in self._end_hooks:  # first calls running in other parent threads do not run here
            handle.remove()
        self._end_hooks.clear()
        self._arm()

    # ----- forward ------------------------------------------------------------------------------
    # Per thread, a _ThreadState says which root call runs. A root's slot is set once, under a lock, the
    # first time the root is seen, so threads calling one model at once cannot race on it.
    def _init_thread(self) -> _ThreadState:
        st = self._tl.st = _ThreadState()
        with self._lock:
            self._callers[threading.get_ident()] = st
            self._multi = len(self._callers) > 1  # from now on the finder stays in torch's dict
        return st

    @staticmethod
    def _alive(st: _ThreadState) -> bool:
        """Whether this thread's global-mode root call runs: its caller frame is on the current stack."""
        return st.frame is None or _on_stack(sys._getframe(2), st.frame)

    def _drop_dead_call(self, st: _ThreadState) -> None:
        """Forget a hooks-followed root call a BaseException ended without torch's always-called hooks (run
        in the call's own thread: its open activation sample, if any, is closed unrecorded here)."""
        if self._saved_ctx is not None and self._saved_ctx[3] == threading.get_ident():
            self._end_saved_sample(record=False)
        self._hooks_done(st)
        st.root = st.frame = None
        st.same = 0
        st.gmode = False
        self._arm()  # a first call takes the finder out of torch's dict

    def _arm(self) -> None:
        if self._gdict is not None and self._armed:
            self._gdict[self._gid] = self._finder

    def _find_root(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """Global pre hook: in torch's dict between root calls (always, once two threads call modules). It
        sees a root's first call, and calls of roots that have no slot (global mode)."""
        if is_compiling():
            # torch.export's traces are not forwards. In code torch.compile traces, the finder runs for real
            # (a graph break) where it is called: a first call takes it out of torch's dict (one thread), so
            # the model's own graph stays whole; with two threads it is called, and breaks, at every module.
            if not is_exporting():
                self._find_root_eager(module, args)
            return
        if _tracing_state() is None and not _fx_tracing():
            self._find_root_body(module, args)

    def _find_root_body(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        try:
            st = self._tl.st
        except AttributeError:
            st = self._init_thread()
        root = st.root
        if root is not None:
            if not st.gmode:
                return  # nested in a slot call (the finder is in during one only with two threads)
            # Nested in a global-mode call, unless a BaseException ended that one (the stack walk runs in
            # global mode only: a root's first call, and roots with no slot).
            if self._alive(st):
                if root is module and st.end_hook is None:
                    st.same += 1  # a root with no slot calling itself (a slot counts its own root's)
                return
            self._drop_dead_call(st)
        if _autograd_node() is not None:
            return
        rid = self._roots.get(id(module))
        if rid is None or self._root_refs[rid]() is not module or self._hooked[rid] is None:
            with self._lock:  # two threads meeting a new root at once must not both register it
                rid = self._roots.get(id(module))
                if rid is None or self._root_refs[rid]() is not module:
                    rid = self._new_root(module)
                elif self._hooked[rid] is None:  # seen under an earlier install()
                    self._hooked[rid] = self._slot_root(module, rid)
        # This call is already inside torch's _call_impl, so hooks follow it: the root's own one-off forward
        # hook if it has a slot (its next calls go through the slot, unless it is bypassed: a subclass's own
        # __call__, code torch.compile traces), else the global forward hook.
        self._begin(st, module, rid, True, _hook_caller(sys._getframe(1)))

    def _begin(self, st: _ThreadState, module: torch.nn.Module, rid: int, gmode: bool,
               caller: Any = None) -> None:
        """Begin a root call: its start time now, its one row when it ends. `st.root` is set last: a
        KeyboardInterrupt landing in here leaves no half-begun call behind. `_Slot.__call__` inlines the
        common case (a slotted root, nothing to sample): a change here goes there too."""
        st.same = 0
        st.gmode = gmode
        st.rid = rid
        st.idx = next(self._fwd_ids)  # itertools.count: atomic under the GIL, unique across threads
        slotted = self._hooked[rid]
        if gmode:
            st.frame = caller
            if slotted:  # one module hook, not a global one: other modules' calls stay hook-free
                handle = module.register_forward_hook(self._own_end_eager, with_kwargs=True, always_call=True)
                st.end_hook = handle
                with self._lock:
                    self._end_hooks.add(handle)
            else:  # the global forward hook is in torch's dict only while such calls run
                with self._lock:
                    self._gmode_calls += 1
                    if self._global_post is None:
                        self._global_post = nn_module.register_module_forward_hook(
                            self._global_end, with_kwargs=True, always_call=True)
        if (slotted and not self._multi and self._gdict is not None
                and len(_LIMBO) + len(_ACTIVE) <= self._threads0):
            self._gdict.pop(self._gid, None)  # all module calls inside this one take torch's fast path
        if self._unsampled and rid in self._unsampled and self._saved_ctx is None and is_grad_enabled():
            with self._lock:  # one sample at a time, in one thread
                if self._saved_ctx is None and rid in self._unsampled:
                    self._start_saved_sample(rid)
        st.t0 = monotonic()
        st.root = module

    def _global_end(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs_or_out: Any,
                    out: Any = _RAISED) -> None:
        """Global forward hook, registered only while global-mode root calls run."""
        # torch calls (module, args, kwargs, out) normally and (module, args, None) when the forward raised.
        if is_compiling():
            if not is_exporting():
                self._global_end_eager(module, args, kwargs_or_out, out)
            return
        self._global_end_body(module, args, kwargs_or_out, out)

    def _global_end_body(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs_or_out: Any,
                         out: Any = _RAISED) -> None:
        try:
            st = self._tl.st
        except AttributeError:
            return
        if st.root is not module or not st.gmode or st.end_hook is not None:
            return
        self._hooks_end(st, module, args, kwargs_or_out, out)

    def _own_end(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs_or_out: Any,
                 out: Any = _RAISED) -> None:
        """A root's own one-off forward hook: ends the call the finder began (every call of that module runs
        it while it is there, in any thread)."""
        try:
            st = self._tl.st
        except AttributeError:
            return
        if st.root is not module or st.end_hook is None:
            return
        if out is not _RAISED:  # torch calls a module's own always-called hooks from `_call_impl`'s except
            # block when the call raised (`inner()` on the normal path), passing whatever result it had
            caller = _module_py_frame(sys._getframe(1))
            name = caller.f_code.co_name if caller is not None else ""
            if name == "_call_impl" or (name != "inner" and out is None and sys.exc_info()[0] is not None):
                out = _RAISED
        self._hooks_end(st, module, args, kwargs_or_out, out)

    def _hooks_end(self, st: _ThreadState, module: torch.nn.Module, args: tuple[Any, ...],
                   kwargs_or_out: Any, out: Any) -> None:
        if st.same:  # the root returning from calling itself
            st.same -= 1
            return
        raised = out is _RAISED
        self._end(st, module, args, None if raised else kwargs_or_out, None if raised else out, raised)
        self._hooks_done(st)

    def _hooks_done(self, st: _ThreadState) -> None:
        """A hooks-followed call ended: its own forward hook goes; the global one after the last such call."""
        with self._lock:
            if st.end_hook is not None:
                st.end_hook.remove()
                self._end_hooks.discard(st.end_hook)
                st.end_hook = None
                return
            self._gmode_calls = max(0, self._gmode_calls - 1)
            if not self._gmode_calls and self._global_post is not None:
                self._global_post.remove()
                self._global_post = None

    def _end(self, st: _ThreadState, module: torch.nn.Module, args: tuple[Any, ...], kwargs: Any, out: Any,
             raised: bool) -> None:
        """End this thread's root call and write its row (what it read, the grad state, whether it raised)."""
        t = monotonic()
        st.root = st.frame = None  # the frame holds the call's inputs and outputs
        flags = _RAISED_FLAG if raised else 0
        batch = seq = 0
        x = args[0] if args and type(args[0]) is Tensor else _first_tensor(args, kwargs)
        if x is not None:
            try:
                shape = x.shape  # one C call (~100 ns) for ndim, batch and sequence length
                if shape:
                    batch = shape[0]
                    if len(shape) >= 2 and x.dtype in _TOKEN_DTYPES:
                        seq = shape[1]
                        flags |= _TOKEN_INPUT
            except Exception:  # a strided nested tensor has no shape: batch and length unknown (0)
                pass
            if type(batch) is not int or type(seq) is not int:  # a jagged tensor's nested (symbolic) length
                batch = batch if type(batch) is int else 0
                seq = seq if type(seq) is int else 0
        if self._stateless[st.rid]:
            flags |= _DOWNSTREAM
        if is_grad_enabled():
            flags |= _GRAD_ENABLED
            if x is not None and x.grad_fn is not None:  # called on a forward's output (a loss module)
                flags |= _DOWNSTREAM
            if out is not None:  # no grad mode, no graph: skip the search on the inference hot path
                node = _graph_of(out)
                if node is not None:
                    flags |= _HAS_GRAPH
                    node.register_prehook(partial(self._on_backward, st.idx))
        if is_inference_mode_enabled():
            flags |= _INFERENCE_MODE
        if module.training:
            flags |= _MODULE_TRAINING
        if self._saved_ctx is not None and self._saved_ctx[3] == threading.get_ident():
            self._end_saved_sample()
        if self._gdict is not None and self._armed:
            self._gdict[self._gid] = self._finder  # between root calls, the finder looks for new roots
        self._emit((_FWD, st.t0, st.rid, st.idx, batch, seq, flags, t))

    def _slot_root(self, module: torch.nn.Module, rid: int) -> bool:
        """Put a root's slot in place; False (global mode) where it cannot have one."""
        if not _HAS_SLOT or isinstance(module, torch.jit.ScriptModule):
            return False
        d = module.__dict__
        current = d.get("_compiled_call_impl")
        if isinstance(current, _Slot):
            current = current.users  # a slot in a copy of another module's __dict__ (a replica's): replaced
        # A module the user compiled (`Module.compile()`): the slot calls its compiled call, and puts it back.
        d["_compiled_call_impl"] = _Slot(self, module, rid, current)
        self._root_slots.append(weakref.ref(module))
        return True

    def _new_root(self, module: torch.nn.Module) -> int:
        rid = len(self.roots)
        n_params = 0
        param_bytes = 0
        dtype = ""
        device: torch.device | None = None
        for p in module.parameters():
            n_params += p.numel()
            param_bytes += _tensor_bytes(p)
            if device is None:
                device, dtype = p.device, str(p.dtype).replace("torch.", "")
        sensitive = sorted({type(m).__name__ for m in module.modules() if isinstance(m, _MODE_SENSITIVE)
                            and (getattr(m, "p", 1.0) > 0 and getattr(m, "track_running_stats", True))})
        # No parameters, buffers or saved state (a loss, metric or activation module): it learns and serves
        # nothing of its own, so its calls are not forwards (a quantized model keeps packed weights in its
        # state dict, not in parameters, and stays a model).
        stateless = (device is None and next(module.buffers(), None) is None
                     and not _has_state(module))
        self.roots.append({"name": type(module).__name__, "params": n_params, "param_bytes": param_bytes,
                           "dtype": dtype, "device": str(device) if device is not None else "",
                           "mode_sensitive_layers": sensitive, "saved_bytes": None, "stateless": stateless})
        self._stateless.append(stateless)
        self._unsampled.add(rid)
        self._root_refs.append(weakref.ref(module))
        self._hooked.append(self._slot_root(module, rid))
        self._roots[id(module)] = rid  # published last: lock-free readers in other threads see it whole
        if device is not None and device.type == "cuda" and self.device is None:
            with contextlib.suppress(Exception):
                self.device = _cuda_uuid(device)
                self.device_name = torch.cuda.get_device_name(device)
        return rid

    # ----- activation memory, sampled once per root ---------------------------------------------
    def _start_saved_sample(self, rid: int) -> None:
        seen: set[int] = set()
        total = [0]

        def pack(t: Tensor) -> Tensor:
            with contextlib.suppress(Exception):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in seen and not isinstance(t, torch.nn.Parameter):
                    seen.add(key)
                    total[0] += storage.nbytes()
            return t

        ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        try:
            ctx.__enter__()
        except Exception:
            self.roots[rid]["saved_bytes"] = -1
            self._unsampled.discard(rid)
            return
        self._saved_ctx = (ctx, total, seen, threading.get_ident(), rid)

    def _end_saved_sample(self, record: bool = True) -> None:
        ctx, total, seen, _thread, sampled_rid = self._saved_ctx
        self._saved_ctx = None
        with contextlib.suppress(Exception):
            ctx.__exit__(None, None, None)
        if not record:  # the sampled call died: the root stays unsampled, its next forward is measured
            return
        module = self._root_refs[sampled_rid]()
        if module is not None:  # weights are kept anyway; only activations are the cost of autograd
            for p in module.parameters():
                with contextlib.suppress(Exception):
                    if p.untyped_storage().data_ptr() in seen:
                        total[0] -= p.untyped_storage().nbytes()
        self.roots[sampled_rid]["saved_bytes"] = max(0, total[0])
        self._unsampled.discard(sampled_rid)

    # ----- backward -----------------------------------------------------------------------------
    def _on_backward(self, idx: int, grad_outputs: Any) -> None:
        t = monotonic()
        if not self._in_bwd:
            self._in_bwd = True
            self._emit((ev.BWD_BEGIN, t, idx, 0.0, 0.0, 0.0, 0.0, 0.0))
            try:
                self._engine.queue_callback(self._on_backward_end)  # type: ignore[union-attr]
            except Exception:
                self._on_backward_end()
        self._emit((ev.BWD_FWD, t, idx, 0.0, 0.0, 0.0, 0.0, 0.0))

    def _on_backward_end(self) -> None:
        self._in_bwd = False
        self._emit((ev.BWD_END, monotonic(), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))

    # ----- loss ---------------------------------------------------------------------------------
    def _patch_loss(self) -> None:
        import torch.autograd as autograd

        real_backward = autograd.backward
        note = self._note_loss

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            note(tensors)
            return real_backward(tensors, *args, **kwargs)

        autograd.backward = backward
        self._patched.append((autograd, "backward", real_backward))
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is not None:
            real_scale = scaler_cls.scale
            scaled = self._scaled

            def scale(scaler: Any, outputs: Any) -> Any:
                out = real_scale(scaler, outputs)
                if isinstance(out, Tensor) and out is not outputs and out.numel() == 1:
                    if len(scaled) > 64:  # scaled losses never backpropagated: drop, do not grow
                        scaled.clear()
                    scaled[id(out)] = (weakref.ref(out), outputs.detach())
                return out

            scaler_cls.scale = scale
            self._patched.append((scaler_cls, "scale", real_scale))

    def _note_loss(self, tensors: Any) -> None:
        t = monotonic()
        loss = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            return
        try:
            hit = self._scaled.pop(id(loss), None)
            if hit is not None and hit[0]() is loss:
                loss = hit[1]
            value = loss.detach()
            if value.device.type == "cpu":
                self._losses.append((t, float(value), None))
            elif value.device.type == "cuda":
                host = torch.empty((), dtype=value.dtype, pin_memory=True)
                host.copy_(value.reshape(()), non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                self._losses.append((t, host, done))
        except Exception:  # never break the user's backward for a figure
            return

    def _drain_losses(self, wait: bool = False) -> None:
        """Write the losses whose values are on the host, in order (all of them, waiting, when `wait`).
        Only this takes from the list; the training thread's appends after the count taken here stay."""
        with self._loss_lock:
            losses = self._losses
            ready = 0
            for _, _, done in losses[: len(losses)]:
                if done is not None and not wait and not done.query():
                    break  # one stream's events complete in order: the rest are not done either
                ready += 1
            taken = losses[:ready]
            del losses[:ready]
        for t, value, done in taken:
            if done is not None:
                done.synchronize()  # done already, or `wait` (the end of the run)
                value = float(value)
            self._emit((ev.LOSS, t, value, 0.0, 0.0, 0.0, 0.0, 0.0))

    # ----- optimizer ----------------------------------------------------------------------------
    def _opt_id(self, opt: torch.optim.Optimizer) -> int:
        oid = self._opts.get(id(opt))
        if oid is None or self._opt_refs[oid]() is not opt:
            with self._lock:
                oid = self._opts.get(id(opt))
                if oid is None or self._opt_refs[oid]() is not opt:
                    oid = len(self.optimizers)
                    self._opt_refs.append(weakref.ref(opt))
                    self.optimizers.append({"name": type(opt).__name__})
                    self._opt_steps.append(0)
                    self._opts[id(opt)] = oid  # published last, as for roots
        return oid

    def _opt_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        oid = self._opt_id(opt)
        self._emit((ev.OPT_BEGIN, monotonic(), oid, self._opt_steps[oid], 0.0, 0.0, 0.0, 0.0))

    def _opt_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        t = monotonic()
        oid = self._opt_id(opt)
        step = self._opt_steps[oid]
        self._opt_steps[oid] = step + 1
        self._emit((ev.OPT_END, t, oid, step, 0.0, 0.0, 0.0, 0.0))
        if oid == 0:
            if self._flop_mode is not None and step == self.flop_sample_step:
                self._end_flop_sample(record=True, opt=opt, step=step)
            elif step == self.flop_sample_step - 1 and self.flop_sample is None:
                self._begin_flop_sample(step + 1)

    def _begin_flop_sample(self, step: int) -> None:
        if not self._count_flops:
            return
        try:
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
        except Exception as exc:
            self.flop_sample = {"error": f"{type(exc).__name__}: {exc}"}
            return
        self._flop_mode = mode
        self._emit((ev.FLOP_SAMPLE_BEGIN, monotonic(), 0.0, step, 0.0, 0.0, 0.0, 0.0))

    def _end_flop_sample(self, record: bool, opt: torch.optim.Optimizer | None = None,
                         step: int = -1) -> None:
        mode = self._flop_mode
        if mode is None:
            return
        self._flop_mode = None
        try:
            mode.__exit__(None, None, None)
            flops = int(mode.get_total_flops())
        except Exception as exc:
            self.flop_sample = {"error": f"{type(exc).__name__}: {exc}"}
            return
        if not record:
            return
        self._emit((ev.FLOP_SAMPLE_END, monotonic(), 0.0, step, 0.0, 0.0, 0.0, 0.0))
        self.flop_sample = {"step": step, "flops": flops, "autocast": self._autocast_dtype()}
        if opt is not None:
            self.memory_sample = self._optimizer_memory(opt)

    @staticmethod
    def _autocast_dtype() -> str | None:
        with contextlib.suppress(Exception):
            for dev in ("cuda", "cpu"):
                if torch.is_autocast_enabled(dev):
                    return str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        return None

    def _optimizer_memory(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        seen: set[int] = set()
        param_bytes = grad_bytes = state_bytes = 0
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) in seen:
                    continue
                seen.add(id(p))
                param_bytes += _tensor_bytes(p)
                if p.grad is not None:
                    grad_bytes += _tensor_bytes(p.grad)
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, Tensor):
                    state_bytes += _tensor_bytes(v)
        return {"param_bytes": param_bytes, "grad_bytes": grad_bytes, "optimizer_state_bytes": state_bytes}

    # ----- output -------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        return {
            "device": self.device or ev.device_for_host(),
            "device_name": self.device_name or "cpu",
            "roots": self.roots,
            "optimizers": [dict(o, steps=n) for o, n in zip(self.optimizers, self._opt_steps, strict=True)],
            "flop_sample": self.flop_sample,
            "memory_sample": self.memory_sample,
            "argv": list(sys.argv),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "tf32": bool(torch.backends.cuda.matmul.allow_tf32
                         or torch.get_float32_matmul_precision() != "highest"),
        }

    def process_events(self) -> ev.ProcessEvents:
        import time

        self._drain_losses(wait=True)
        return ev.ProcessEvents(self._pid, self.buffer.snapshot(), time.time() - monotonic(), self.meta())

    def flush(self) -> None:
        self._drain_losses(wait=True)
        if self.events_dir is None or os.getpid() != self._pid:
            return
        with self._flush_lock:
            rows = self.buffer.take_new()
            if not rows.size and not self._wrote:
                return
            with contextlib.suppress(OSError):
                ev.write_chunk(self.events_dir, self._pid, self._seq, rows, self.meta())
                self._seq += 1
                self._wrote = True

    def _watch_dead_calls(self) -> None:
        """Find hooks-followed calls a BaseException (Ctrl-C) ended, from the flush thread: take a dead first
        call's one-off forward hook off its module (until the thread's next module call drops the call, it
        would stay in the module's dict, where `torch.save(model)` would meet it) and put the finder back in
        torch's dict (a first call took it out, so new models would go unseen). It only removes the handle
        (idempotent) and re-arms; the thread's own next call forgets the call. Each thread's state is read
        before the frames: a call begun after that read is not judged on an older snapshot."""
        states = [(tid, st.end_hook, st.frame) for tid, st in list(self._callers.items())]
        if not any(frame is not None for _, _, frame in states):
            return
        frames = sys._current_frames()
        for tid, handle, frame in states:
            if frame is not None and not _on_stack(frames.get(tid), frame):
                if handle is not None:
                    handle.remove()
                self._arm()

    def _flush_loop(self) -> None:
        stop = self._stop
        while not stop.wait(self.flush_s):
            self._watch_dead_calls()
            self._drain_losses()
            if self.events_dir is None:
                self.buffer.compact()
            else:
                self.flush()


class _Slot:
    """A root's slot: its `_compiled_call_impl`, which `Module.compile()` also uses. torch's `__call__` calls
    it before `_call_impl` looks at any hook, so the slot can take the finder out of torch's global dict for
    the call: the root and every module inside it take `_call_impl`'s fast path, instead of torch's hook
    dispatch (several us a call on a CPU, with cold caches after the model's kernels; docs/BENCHMARKS.md).
    A BaseException (Ctrl-C) ending the call passes through here, so the call's end is always seen. The slot
    holds its module weakly, so a dropped model is freed at once (the module's `__dict__` holds the slot).

    Copies: `Module.__getstate__` drops the slot, so `torch.save`, pickle, `copy.copy` and `copy.deepcopy` of
    a module never carry it; a deep copy of the module's `__dict__` itself (a parametrized module's deepcopy)
    holds None in its place. A shallow copy of that `__dict__` (a DataParallel replica) shares it: replicas
    run in DataParallel's worker threads, so once other threads call modules the slot checks which module
    torch's `__call__` was called on (~0.2 us) and lets a replica run as itself (the finder then gives it a
    slot of its own); one thread alone calls the original's `_call_impl` for such a copy."""

    __slots__ = ("call_impl", "rec", "ref", "rid", "users")

    def __init__(self, rec: Recorder, module: torch.nn.Module, rid: int, users: Any = None) -> None:
        self.rec = rec
        self.ref = weakref.ref(module)
        self.rid = rid
        self.users = users  # the compiled call the user had put in the slot (Module.compile()), or None
        self.call_impl = type(module)._call_impl  # the function: a bound method would hold the module

    def _run(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        users = self.users
        return self.call_impl(module, *args, **kwargs) if users is None else users(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.ref()
        rec = self.rec
        try:
            st = rec._tl.st
        except AttributeError:
            st = rec._init_thread()  # a thread's first module call: now the finder stays in
        if module is None or rec._multi:
            me = sys._getframe(1).f_locals.get("self")  # the module torch's __call__ was called on
            if me is not module and isinstance(me, torch.nn.Module):
                return me._call_impl(*args, **kwargs)  # it holds a copy of this one's __dict__ (a replica)
            if module is None:
                raise RuntimeError("phasescope: a root's slot was called after its module was freed, "
                                   "not by a module's __call__")
        if (is_compiling() or _tracing_state() is not None or getattr(fx_trace, "_is_fx_tracing_flag", False)
                or not rec._armed):
            # torch.compile / export / jit.trace / fx tracing, or a copy's slot left after uninstall()
            return self._run(module, args, kwargs)
        root = st.root
        if root is not None:
            if not st.gmode or rec._alive(st):  # nested in a root call, or this root calling itself
                if root is module and st.gmode:
                    st.same += 1  # its first call: the one-off end hook runs at this inner call's end too
                return self._run(module, args, kwargs)
            rec._drop_dead_call(st)
        if _autograd_node() is not None:
            return self._run(module, args, kwargs)
        rid = self.rid
        if self.users is not None or (rec._unsampled and rid in rec._unsampled and is_grad_enabled()):
            # rare: a user's compiled call, or the grad forward whose activations are to be measured
            try:
                rec._begin(st, module, rid, False)
                out = self._run(module, args, kwargs)
            except BaseException:
                if st.root is module:
                    rec._end(st, module, args, kwargs, None, True)
                else:  # interrupted inside _begin: its finder may be out of torch's dict
                    rec._arm()
                raise
            rec._end(st, module, args, kwargs, out, False)
            return out
        # The hot path: `_begin` inlined for a slotted root with nothing to sample, saving the `_begin` and
        # `_run` frames on every call (docs/design/hooks.md, "Per-call cost").
        try:
            st.same = 0
            st.gmode = False
            st.rid = rid
            st.idx = next(rec._fwd_ids)
            gdict = rec._gdict
            if (gdict is not None and rec._hooked[rid] and not rec._multi
                    and len(_LIMBO) + len(_ACTIVE) <= rec._threads0):
                gdict.pop(rec._gid, None)  # all module calls inside this one take torch's fast path
            st.t0 = monotonic()
            st.root = module  # set last, as in _begin
            out = self.call_impl(module, *args, **kwargs)
        except BaseException:
            if st.root is module:
                rec._end(st, module, args, kwargs, None, True)
            else:  # interrupted before the call began: the finder may be out of torch's dict
                rec._arm()
            raise
        rec._end(st, module, args, kwargs, out, False)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None  # the copy is a module of its own: the finder gives it its own slot

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(None), ())  # a pickled __dict__ never carries phasescope objects


# torch's __call__ looks at the slot first (torch >= 2.2); without it, roots are followed by global hooks.
_HAS_SLOT = (torch.nn.Module.__dict__.get("_compiled_call_impl", False) is None
             and torch.nn.Module.__call__ is getattr(torch.nn.Module, "_wrapped_call_impl", None))
