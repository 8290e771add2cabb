"""Launch plans: the host work of a CUDA product, done once for the calls that would repeat it.

Before its kernels run, one product (``glyd.kernels.linear``) checks x, the bias and the matrix,
chooses a kernel from the GPU's table, and its family's launcher works out the split, the grid,
the flags, the exception pass and the constexprs; then Triton derives every argument's
specialization again to find the compiled kernel. All of it depends only on

* the packed arrays (these tensors, at these addresses, unchanged in place: ``_version``) and the
  op's layout, shape and format version;
* x's shape, strides, dtype, device and address modulo 16, and the bias's presence (and its
  shape, strides, dtype, device and address modulo 16); the current CUDA device.

A :class:`Plan` holds the result for one such key (its family's ``Kernel.plan``); a later call with
the same key allocates its outputs and launches. On the H200 a fixed12 product at M = 1 cost 397 us
of host time against 38 us for bf16 ``F.linear`` (``benchmarks/history/2026-12-04-h200.md``).

A :class:`Launch` is one Triton launch with its grid, constants and options fixed at plan time; per
call only its :class:`Slot` tensors change. It launches through Triton's own ``kernel[grid](...)``
until it has been called twice, then (``_Fast``) straight through the compiled kernel's launcher,
with every constant tensor already a device address: the same compiled kernel Triton would pick,
because every argument is the same except the slot tensors, whose dtype the plan fixes and whose
16-byte alignment (all Triton specializes a pointer on) is checked every call; a mismatch, a launch
hook, ``TRITON_DEBUG`` changed or Triton's interpreter take Triton's own path. (Not repeated: Triton's
check that the globals a kernel read did not change since it was compiled; glyd's kernels read
module constants only.)

A family whose plan works for any M (``Kernel.any_rows``: unpack + cuBLAS, which looks at x's device
and K only) keeps one plan for every M of an M bucket of the tables instead (``store``'s ``rows``): a
prompt of a length not seen before then takes the plan, and the fast launches, that an earlier prompt
made, and prompts of many lengths do not push out the decode steps' plans. Only for contiguous x.

Other per-matrix host work lives in the same entries under keys of its own (``keep`` / ``kept``: an
experts product's kept launches and plans, its preparation for a capture), and goes with them.

Plans are on by default; ``GLYD_PLANS=0`` (or ``set_enabled(False)``, for comparisons) turns them off.
Nothing here imports Triton until a launch is recorded.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

import torch

from glyd import _env

log = logging.getLogger(__name__)

__all__ = ["Slot", "slots", "Launch", "Plan", "enabled", "set_enabled", "run", "store", "kept", "keep", "clear",
           "count", "LAUNCHES"]

#: Plans kept a matrix (x shapes seen; the oldest goes first): decode steps of 1-64 sequences fit.
MAX_PLANS = 64
#: Plans kept in all (about 5 KB each); past it every plan is forgotten and made again as needed.
MAX_TOTAL = 8192
#: Plans for a range of M kept a matrix (M buckets x the kinds of x and bias seen; the oldest goes first).
MAX_RANGED = 8

_FORCED: list[bool | None] = [None]

#: Launches so far: [through the compiled kernel's launcher, through Triton's ``kernel[grid]``].
LAUNCHES = [0, 0]
#: [False]: kept plans launch through Triton's ``kernel[grid]`` too (for comparisons).
FAST = [True]


def enabled() -> bool:
    """True when products use launch plans (``GLYD_PLANS``, unless ``set_enabled`` says otherwise)."""
    forced = _FORCED[0]
    return _env.settings().plans if forced is None else forced


def set_enabled(flag: bool | None) -> None:
    """Turn plans on or off in this process (``None``: back to ``GLYD_PLANS``); forgets every plan."""
    _FORCED[0] = flag
    clear()


class Slot:
    """Per-call argument ``index`` of a :class:`Launch` call, seen by the kernel as ``dtype`` (a view).
    ``fixed``: the same tensor on every call of a kept plan (the packed matrix's arrays, which the
    plan's key pins down: these tensors, at these addresses), so a fast launch takes its address once."""

    __slots__ = ("index", "dtype", "fixed")

    def __init__(self, index: int, dtype: torch.dtype | None = None, fixed: bool = False) -> None:
        self.index = index
        self.dtype = dtype
        self.fixed = fixed

    def view(self, dtype: torch.dtype) -> Slot:
        return Slot(self.index, dtype, self.fixed)

    def value(self, vals: tuple) -> Any:
        v = vals[self.index]
        return v if self.dtype is None else v.view(self.dtype)

    def __repr__(self) -> str:
        return f"Slot({self.index}{'' if self.dtype is None else f', {self.dtype}'}{', fixed' if self.fixed else ''})"


def slots(n: int, start: int = 0, fixed: bool = False) -> tuple[Slot, ...]:
    """``Slot(start) ... Slot(start + n - 1)``."""
    return tuple(Slot(i, fixed=fixed) for i in range(start, start + n))


class Launch:
    """``kernel[grid](*args, **meta)`` with everything but the :class:`Slot` entries fixed.

    Calling it with ``*vals`` (and ``stream=``, a ``torch.cuda.Stream``, else the current one)
    fills slot ``i`` with ``vals[i]`` and launches. Constant tensors in ``args``/``meta`` are held:
    never a packed matrix's arrays or shape views of them (a plan must not keep a matrix alive;
    pass them as fixed slots).
    """

    __slots__ = ("kernel", "grid", "args", "meta", "calls", "fast", "_tried")

    def __init__(self, kernel: Any, grid: tuple[int, ...], args: tuple, meta: dict[str, Any]) -> None:
        self.kernel = kernel
        self.grid = tuple(int(g) for g in grid)
        self.args = tuple(args)
        self.meta = dict(meta)
        self.calls = 0
        self.fast: _Fast | None = None
        self._tried = False

    def __call__(self, *vals: Any, stream: Any = None) -> None:
        fast = self.fast
        if fast is not None and fast.launch(vals, stream):
            return
        args = [a.value(vals) if type(a) is Slot else a for a in self.args]
        meta = {k: v.value(vals) if type(v) is Slot else v for k, v in self.meta.items()}
        if stream is None:
            compiled = self.kernel[self.grid](*args, **meta)
        else:
            with torch.cuda.stream(stream):
                compiled = self.kernel[self.grid](*args, **meta)
        self.calls += 1
        LAUNCHES[1] += 1
        # recorded at the second call: a launch of a plan that was kept (a plan made for one call,
        # the uncached path, never pays for it)
        if self.calls >= 2 and not self._tried and enabled():
            self._tried = True
            self.fast = _record(self, compiled, args, meta)


def _triton_internals():
    from triton import knobs
    from triton.runtime.jit import compute_cache_key

    return knobs, compute_cache_key


def _device() -> int:
    return torch.cuda.current_device()


def _current_device() -> int:
    """The current CUDA device's index (a plan's key; torch's private call, else the public one)."""
    get = getattr(torch._C, "_cuda_getDevice", None)
    return get() if get is not None else torch.cuda.current_device()


def _raw_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


def _record(launch: Launch, compiled: Any, args: list, meta: dict) -> _Fast | None:
    """The fast launch of ``launch`` after Triton launched ``compiled`` for ``args``/``meta``, when
    Triton's own cache maps these arguments to ``compiled`` (else None: Triton's path each call)."""
    kernel = launch.kernel
    try:
        knobs, cache_key = _triton_internals()
        device = _device()
        kernel_cache, key_cache, _target, _backend, binder = kernel.device_caches[device]
        kwargs = dict(meta)  # what JITFunction.run adds to the options
        kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound, spec, options = binder(*args, **kwargs)
        if kernel_cache.get(cache_key(key_cache, spec, options)) is not compiled:
            return None
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        names = list(kernel.arg_names)
        # CUDA's launcher (CudaLauncher.__call__) allocates no scratch when the kernel needs none and
        # then calls its C launch with the launch flags: call that directly
        direct = None
        if getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0:
            direct = (run.launch, bool(run.launch_cooperative_grid), bool(run.launch_pdl))
    except Exception as exc:  # the interpreter, another Triton, a kernel without a compiled form
        log.debug("no fast launch for %r: %s", kernel, exc)
        return None
    slot_of = {names[i]: a for i, a in enumerate(launch.args) if type(a) is Slot}
    slot_of.update({k: v for k, v in launch.meta.items() if type(v) is Slot})
    template: list[Any] = []
    ptr_slots: list[tuple[int, int, bool]] = []
    obj_slots: list[tuple[int, int]] = []
    keep: list[Any] = []
    for pos, (name, value) in enumerate(bound.items()):
        slot = slot_of.get(name)
        if slot is not None and slot.fixed and isinstance(value, torch.Tensor):
            template.append(value.data_ptr())  # a matrix array: the plan's key holds its address
        elif slot is not None and isinstance(value, torch.Tensor):
            ptr_slots.append((pos, slot.index, value.data_ptr() % 16 == 0))
            template.append(None)
        elif slot is not None:  # a tensor descriptor: its specialization is its dtype, block and layout
            obj_slots.append((pos, slot.index))
            template.append(None)
        elif isinstance(value, torch.Tensor):
            keep.append(value)
            template.append(value.data_ptr())
        else:
            template.append(value)
    return _Fast(kernel, launch.grid, run, direct, function, packed, template, ptr_slots, obj_slots, keep, device,
                 knobs.runtime.debug, kwargs["instrumentation_mode"], knobs)


class _Fast:
    """A recorded launch: the compiled kernel's launcher called with the arguments Triton would bind."""

    __slots__ = ("kernel", "grid", "run", "direct", "function", "packed", "template", "ptr_slots", "obj_slots", "keep",
                 "device", "debug", "mode", "knobs")

    def __init__(self, kernel, grid, run, direct, function, packed, template, ptr_slots, obj_slots, keep, device, debug,
                 mode, knobs) -> None:
        g = tuple(grid) + (1, 1)
        self.kernel, self.grid, self.run, self.direct = kernel, g[:3], run, direct
        self.function, self.packed = function, packed
        self.template, self.ptr_slots, self.obj_slots, self.keep = template, ptr_slots, obj_slots, keep
        self.device, self.debug, self.mode, self.knobs = device, debug, mode, knobs

    def launch(self, vals: tuple, stream: Any) -> bool:
        # Not checked here: the current device, which the kept plan's key holds (it is the one
        # this launch was recorded on).
        knobs = self.knobs
        rt = knobs.runtime
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        if not (FAST[0] and (enter is None or not getattr(enter, "calls", True))
                and (leave is None or not getattr(leave, "calls", True)) and not self.kernel.pre_run_hooks
                and rt.debug == self.debug and knobs.compilation.instrumentation_mode == self.mode):
            return False
        args = list(self.template)  # a copy: two threads may launch one plan
        for pos, i, aligned in self.ptr_slots:
            ptr = vals[i].data_ptr()
            if (ptr % 16 == 0) != aligned:
                return False
            args[pos] = ptr
        for pos, i in self.obj_slots:
            args[pos] = vals[i]
        raw = stream.cuda_stream if stream is not None else _raw_stream(self.device)
        g = self.grid
        if self.direct is not None:  # no launch metadata and no hooks: Triton passes them for its hooks only
            c_launch, coop, pdl = self.direct
            c_launch(g[0], g[1], g[2], raw, self.function, coop, pdl, None, None, self.packed, None, None, None, *args)
        else:
            self.run(g[0], g[1], g[2], raw, self.function, self.packed, None, None, None, *args)
        LAUNCHES[0] += 1
        return True


class Plan:
    """One product for one key: ``plan(x, bias, arrays)`` -> the output (None: run the uncached path).

    ``body(x2, bias, out, arrays)`` is the family's ``Kernel.plan`` (``out`` None where the body has
    ``makes_out`` set: it returns an output of its own); x is taken to the [M, K] ``x2``
    the way ``glyd.kernels._common.check_x`` does, which must leave it at the address modulo 16 it
    had when the plan was made (the family's choices may depend on it: a fresh copy always does).
    ``rows``: the body works for any M (``Kernel.any_rows``), so the plan takes x's M from each call."""

    __slots__ = ("body", "m", "n", "k", "flat", "contig", "align", "out_shape", "device", "makes_out", "rows")

    def __init__(self, body: Callable, x: torch.Tensor, x2: torch.Tensor, n: int, rows: bool = False) -> None:
        self.body = body
        self.makes_out = bool(getattr(body, "makes_out", False))  # the body allocates its output
        self.rows = rows
        self.m, self.k = x2.shape
        self.n = n
        self.flat = x.dim() == 2 and x.stride(1) == 1
        self.contig = x.reshape(-1, self.k).stride(1) != 1
        self.align = x2.data_ptr() % 16
        self.out_shape = (*x.shape[:-1], n)
        self.device = x2.device

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, arrays) -> torch.Tensor | None:
        m, out_shape = (x.numel() // self.k, (*x.shape[:-1], self.n)) if self.rows else (self.m, self.out_shape)
        if self.flat:
            x2 = x
        else:
            x2 = x.reshape(m, self.k)
            if self.contig:
                x2 = x2.contiguous()
            if x2.data_ptr() % 16 != self.align:
                return None
        if bias is not None:
            bias = bias.contiguous()
        out = None if self.makes_out else torch.empty((m, self.n), dtype=torch.bfloat16, device=self.device)
        y = self.body(x2, bias, out, arrays)
        return y if self.flat else y.view(out_shape)


class _Entry:
    """The plans of one matrix (its arrays and op arguments), by x and bias key."""

    __slots__ = ("ids", "versions", "ptrs", "op", "plans", "ranged", "__weakref__")

    def __init__(self, arrays, op: tuple) -> None:
        self.ids = tuple(map(id, arrays))
        self.versions = tuple(a._version for a in arrays)
        self.ptrs = tuple(a.data_ptr() for a in arrays)
        self.op = op
        self.plans: dict[tuple, Plan] = {}
        self.ranged: list[tuple[int, int, tuple, Plan]] = []  # (first M, last M, _rows_key, plan)

    def holds(self, arrays, op: tuple) -> bool:
        if self.op != op or len(arrays) != len(self.ids):
            return False
        for a, i, v, p in zip(arrays, self.ids, self.versions, self.ptrs):
            if id(a) != i or a._version != v or a.data_ptr() != p:
                return False
        return True


#: id(first array) -> its matrix's plans. An entry leaves when any of its arrays dies, so while it is
#: here its ids name live tensors (no other tensor can have one); plans hold no array.
_ENTRIES: dict[int, _Entry] = {}


_TOTAL = [0]  # plans in _ENTRIES


def _drop(entry: _Entry) -> None:
    _TOTAL[0] -= len(entry.plans) + len(entry.ranged)
    entry.plans.clear()
    entry.ranged.clear()


def _forget(first: int, ref: weakref.ref) -> None:
    entry = ref()
    if entry is not None and _ENTRIES.get(first) is entry:
        del _ENTRIES[first]
        _drop(entry)


def _key(x: torch.Tensor, bias: Any) -> tuple | None:
    if not isinstance(x, torch.Tensor) or (bias is not None and not isinstance(bias, torch.Tensor)):
        return None
    dev = x.get_device()
    b = None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device(), bias.data_ptr() % 16)
    return (x.shape, x.stride(), x.dtype, dev, x.data_ptr() % 16, _current_device() if dev >= 0 else -1, b)


def _rows_key(x: torch.Tensor, bias: Any) -> tuple | None:
    # _key without x's shape and strides (a contiguous x of any M): a plan for a range of M
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_contiguous():
        return None
    key = _key(x, bias)
    return None if key is None else (x.dim(), x.shape[-1], *key[2:])


def _op(layout: str, shape, version: int) -> tuple:
    return (layout, tuple(shape), version)


def run(x: torch.Tensor, layout: str, shape, arrays, bias: torch.Tensor | None, version: int) -> torch.Tensor | None:
    """The product of ``glyd::linear``'s arguments through a kept plan, or None (no plan for them)."""
    plan = kept(layout, shape, arrays, version, _key(x, bias))
    if plan is None:
        plan = _kept_rows(layout, shape, arrays, version, x, bias)
    return None if plan is None else plan(x, bias, arrays)


def _kept_rows(layout: str, shape, arrays, version: int, x: torch.Tensor, bias: Any) -> Plan | None:
    entry = _ENTRIES.get(id(arrays[0])) if arrays else None
    if entry is None or not entry.ranged or not entry.holds(arrays, _op(layout, shape, version)):
        return None
    key = _rows_key(x, bias)
    if key is None:
        return None
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    for lo, hi, k, plan in entry.ranged:
        if k == key and lo <= m <= hi:
            return plan
    return None


def store(x: torch.Tensor, layout: str, shape, arrays, bias: torch.Tensor | None, version: int, plan: Plan,
          rows: tuple[int, int] | None = None) -> None:
    """Keep ``plan`` for calls with these arguments' key (see the module's docstring); with ``rows``
    (first M, last M) and a plan made with ``rows=True``, for every contiguous x of those M instead."""
    if rows is not None and plan.rows:
        key = _rows_key(x, bias)
        if key is not None:
            entry = _entry(arrays, _op(layout, shape, version))
            if _TOTAL[0] >= MAX_TOTAL:
                clear()
                _ENTRIES[id(arrays[0])] = entry
            if len(entry.ranged) >= MAX_RANGED:
                del entry.ranged[0]
                _TOTAL[0] -= 1
            entry.ranged.append((rows[0], rows[1], key, plan))
            _TOTAL[0] += 1
            return
    key = _key(x, bias)
    if key is not None:
        keep(layout, shape, arrays, version, key, plan)


def kept(layout: str, shape, arrays, version: int, key: Any) -> Any:
    """What :func:`keep` kept under ``key`` for these arrays (the same tensors, unchanged in place
    since) and op, or None. Other families' per-matrix host work (an experts product's launches, its
    prepared captures) is kept here too, under keys of their own: it goes with the matrix, ``clear``
    and ``registry.reset()`` as a plan does."""
    if not arrays:
        return None
    entry = _ENTRIES.get(id(arrays[0]))
    if entry is None or not entry.holds(arrays, _op(layout, shape, version)):
        return None
    return entry.plans.get(key)


def keep(layout: str, shape, arrays, version: int, key: Any, value: Any) -> None:
    """Keep ``value`` (which must hold none of ``arrays``) for ``kept`` with the same arguments."""
    if not arrays or key is None:
        return
    first = id(arrays[0])
    entry = _entry(arrays, _op(layout, shape, version))
    plans = entry.plans
    if key not in plans:
        if _TOTAL[0] >= MAX_TOTAL:
            clear()
            _ENTRIES[first] = entry
        if len(plans) >= MAX_PLANS:
            del plans[next(iter(plans))]
            _TOTAL[0] -= 1
        _TOTAL[0] += 1
    plans[key] = value


def _entry(arrays, op: tuple) -> _Entry:
    """The entry of these arrays and op: the one kept, or a new one (a changed matrix's plans dropped)."""
    first = id(arrays[0])
    entry = _ENTRIES.get(first)
    if entry is None or not entry.holds(arrays, op):
        new = _Entry(arrays, op)
        if entry is not None:
            _drop(entry)
        if entry is not None and entry.ids == new.ids:  # changed in place: the same tensors, watched already
            entry.ids, entry.versions, entry.ptrs, entry.op = new.ids, new.versions, new.ptrs, op
        else:
            entry = new
            ref = weakref.ref(entry)
            for a in arrays:
                weakref.finalize(a, _forget, first, ref)
            _ENTRIES[first] = entry
    return entry


def clear() -> None:
    """Forget every plan (``registry.reset()`` calls it: the kernel choices may change)."""
    for entry in list(_ENTRIES.values()):
        entry.plans.clear()
        entry.ranged.clear()
    _ENTRIES.clear()
    _TOTAL[0] = 0


def count() -> int:
    """Plans kept now (every matrix), those for a range of M included."""
    return sum(len(e.plans) + len(e.ranged) for e in _ENTRIES.values())
