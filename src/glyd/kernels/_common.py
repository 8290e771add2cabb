"""Shared launch helpers: split-K, the split-K finalize kernel and in-kernel fixup, argument checks,
per-matrix caches, the kernel configs' common fields.

Kernels never call ``.item()`` or copy to the host, so ``linear`` can be captured in a CUDA graph.
Host-side work that needs the data (exception row pointers) happens once per packed matrix in
``prepare`` and is cached on the matrix's tensors.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from glyd import _env
from glyd.errors import FormatError
from glyd.kernels import _plan
from glyd.kernels._fields import check_int
from glyd.kernels._interp import isolated


def _pdl_default() -> str:
    return _env.settings().pdl


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Fields every fused-kernel config has. ``pdl``: programmatic dependent launch (Hopper and
    later, CUDA): "all" launches the kernel and its split-K reduce so that each may start while
    the kernel before it ends (waiting before it reads what that kernel writes), "reduce" the
    reduce only, "tiles" the tile kernel only, "" off (the default, from ``GLYD_PDL``: "all"
    measured slower at M = 2-8). ``split``: K splits (0: from ``waves`` programs an SM)."""

    split: int = 0
    waves: int = 2
    warps: int = 4
    pdl: str = dataclasses.field(default_factory=_pdl_default)

    def __post_init__(self) -> None:
        if self.pdl not in _env.PDL_MODES:
            raise ValueError(f"pdl must be one of {_env.PDL_MODES}, got {self.pdl!r}")
        check_int(f"{type(self).__name__}.split", self.split, 0)
        check_int(f"{type(self).__name__}.waves", self.waves, 1)
        if isinstance(self.warps, bool) or not isinstance(self.warps, int) or self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{type(self).__name__}.warps must be 1, 2, 4, 8 or 16, got {self.warps!r}")
        self.validate()

    def validate(self) -> None:
        """The family's own rules (subclasses)."""

    def replace(self, **changes):
        """A copy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes)


#: The largest tile side a config names (Triton refuses tensors over 2**20 elements; a side past this
#: would fail there without naming the field).
MAX_TILE = 1 << 16


def pow2(cfg, *names: str) -> None:
    """Raise ValueError unless every named field of ``cfg`` is a power of two (an int, not a bool)
    up to ``MAX_TILE``."""
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1) or v > MAX_TILE:
            raise ValueError(f"{type(cfg).__name__}.{name} must be a power of two up to {MAX_TILE}, got {v!r}")


def interpreting() -> bool:
    """True when Triton runs kernels through its interpreter."""
    return _env.interpreting()


def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: any small number keeps the split-K code paths exercised


def gluon_launch_checks(x2: torch.Tensor, p, kernel: str, k_step: int):
    """The checks every Gluon launcher makes before it runs (``can_implement`` has checked the
    device): K (= Kp, no padded columns) a multiple of ``k_step``. Returns (M, K, N, arrays, Kp)."""
    m, k = x2.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    if x2.device.type != "cuda" or interpreting():
        raise RuntimeError(f"the {kernel} kernel runs only on a CUDA GPU (Gluon has no interpreter)")
    if k != kp or kp % k_step:
        raise ValueError(f"the {kernel} kernel needs K a multiple of {k_step} (no padded columns), got K = {k}")
    return m, k, p.shape[0], a, kp


def choose_split(tiles: int, kp: int, bk: int, device: torch.device, split: int = 0,
                 waves: int = 2) -> tuple[int, int]:
    """(splits, K per split) so that the grid covers about ``waves`` programs per SM."""
    steps = (kp + bk - 1) // bk
    if split <= 0:
        split = 1
        target = waves * sm_count(device)
        while tiles * split < target and steps // (split * 2) >= 2:
            split *= 2
    split = max(1, min(split, steps))
    per = (steps + split - 1) // split * bk
    return (kp + per - 1) // per, per


def pdl_flags(device: torch.device, mode: str, kernel: str = "tile") -> int:
    """Programmatic-dependent-launch flags of a launch on ``device`` for ``mode`` (a config's
    ``pdl``): bit 1, launched early and waits for the previous kernel; bit 2 (fused kernels),
    lets the next kernel launch early."""
    if mode not in _env.PDL_MODES:
        raise ValueError(f"pdl must be one of {_env.PDL_MODES}, got {mode!r}")
    if (not mode or device.type != "cuda" or interpreting()
            or torch.cuda.get_device_capability(device)[0] < 9):
        return 0
    if kernel == "reduce":
        return int(mode in ("all", "reduce"))
    return int(mode in ("all", "tiles")) | 2 * (mode in ("all", "reduce"))


@triton.jit
def gdc_wait():
    # griddepcontrol.wait: the kernel before this one has finished and its writes are visible
    # (a no-op without programmatic dependent launch)
    tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gdc_launch_dependents():
    # let the next kernel launch once every program of this one has started (a hint)
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def pdl_begin(PDL: tl.constexpr):
    # at a kernel's top, by its PDL flags (pdl_flags): bit 1 wait for the kernel before (launched early), bit 2 let
    # the next kernel launch (it waits for this one's writes before it reads them)
    if PDL & 1:
        gdc_wait()
    if PDL & 2:
        gdc_launch_dependents()


@isolated
@triton.jit
def _finalize_kernel(part_ptr, bias_ptr, out_ptr, MN, N, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    if PDL & 1:  # launched early: wait for the tile kernel's partials
        gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):  # fixed order: deterministic sums
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(tl.bfloat16), mask=mask)


#: int32 slots between two tiles' split-K counters: one counter per 128-byte L2 line, so that
#: the last split programs' polls of one tile do not queue behind the other tiles' atomics
COUNTER_SLOTS = 32
COUNTER_STRIDE = tl.constexpr(COUNTER_SLOTS)


@triton.jit
def wait_count(cnt_ptr, n):
    # spin until the counter at cnt_ptr reaches n. Relaxed reads at L2, not acquire loads: on
    # sm_90 an acquire at GPU scope invalidates the SM's whole L1, which the other programs on
    # the SM read x from (with acquire spins the Gluon tiles ran 20-45% slower on the H200).
    # The partials are then read from L2 (.cg) after this loop: the branch on the count orders
    # those reads after it, and each partner released its partial before counting in.
    c = tl.atomic_add(cnt_ptr, 0, sem="relaxed", scope="gpu")
    while c < n:
        c = tl.atomic_add(cnt_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def split_fixup(acc, part_ptr, fin_ptr, cnt_ptr, bias_ptr, optr, omask, boff, tile, pid_k, SPLIT, MN,
                HAS_BIAS: tl.constexpr):
    # Split-K without a second kernel. Split programs 0..SPLIT-2 of a tile store their fp32
    # partials and count themselves in (the barrier orders every thread's stores before the
    # releasing atomic) and exit without waiting. The tile's last split program keeps its partial
    # in registers, waits for the count (its partners have lower block indices, so they were
    # scheduled before it and never wait: no deadlock), adds their partials in split order and its
    # own last, which is ``finalize``'s order (the same bits), adds the bias, writes bf16 and
    # resets the counter for the next launch. The partials are read from L2 (.cg), where the
    # other SMs wrote them.
    if pid_k < SPLIT - 1:
        tl.store(part_ptr + pid_k * MN + optr, acc, mask=omask)
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + tile * COUNTER_STRIDE, 1, sem="release", scope="gpu")
    else:
        wait_count(cnt_ptr + tile * COUNTER_STRIDE, SPLIT - 1)
        tl.atomic_xchg(cnt_ptr + tile * COUNTER_STRIDE, 0, sem="relaxed", scope="gpu")
        tot = tl.load(part_ptr + optr, mask=omask, other=0.0, cache_modifier=".cg")
        for s in range(1, SPLIT - 1):
            tot += tl.load(part_ptr + s * MN + optr, mask=omask, other=0.0, cache_modifier=".cg")
        tot += acc
        if HAS_BIAS:
            tot += tl.load(bias_ptr + boff, mask=omask, other=0.0).to(tl.float32)
        tl.store(fin_ptr + optr, tot.to(tl.bfloat16), mask=omask)


@triton.jit
def store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, optr, omask, boff, tile, pid_k, SPLIT, MN,
              PARTIAL: tl.constexpr, FIXUP: tl.constexpr, HAS_BIAS: tl.constexpr):
    # The fused kernels' epilogue: fp32 ``acc`` at output offsets ``optr`` (bias offsets ``boff``).
    # Not split: bias, round to bf16, store to out_ptr. Split: store the partial (out_ptr is then
    # the fp32 [SPLIT, M, N] buffer) for ``finalize``, or sum in place with ``split_fixup``.
    if PARTIAL and FIXUP:
        split_fixup(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, optr, omask, boff, tile, pid_k, SPLIT, MN, HAS_BIAS)
    elif PARTIAL:
        tl.store(out_ptr + pid_k * MN + optr, acc, mask=omask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + boff, mask=omask, other=0.0).to(tl.float32)
        tl.store(out_ptr + optr, acc.to(tl.bfloat16), mask=omask)


# --- Per-device and per-matrix state that outlives a call ------------------------------------------
#
# Under ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees) a compiled function's first call,
# its warm-up, runs eagerly with every allocation of the calling thread routed into the graphs' private
# pool (torch/_inductor/cudagraph_trees.py ``_use_cuda_memory_pool_manager``:
# ``torch._C._cuda_beginAllocateCurrentThreadToPool``, a filter on the thread, not the stream), and
# ``check_memory_pool`` then raises on any live block of that pool that is not a graph output. A tensor
# glyd keeps (an exception index, a scratch buffer) made there would also be overwritten by later
# replays. Allocations of another thread are not routed (``torch.cuda.use_mem_pool``'s note), so state
# that outlives the call is made on a helper thread, on the caller's device and stream (the same order).

_LOCAL = threading.local()


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _off_thread(device: torch.device) -> bool:
    """True where ``persistent`` runs ``make`` on a helper thread: a real CUDA device, not already on
    one, not while a graph is captured (routed by the capturing stream: a thread does not escape it,
    and kernels are recorded, not run), not under a fake mode (torch.compile's tracing)."""
    if device.type != "cuda" or interpreting() or getattr(_LOCAL, "inside", False) or _capturing(device):
        return False
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None


def _in_thread(make, device: torch.device):
    """``make()`` on a new thread (on ``device`` and the caller's current stream when CUDA), waited for;
    its exception is raised here."""
    box: dict = {}
    stream = None
    if device.type == "cuda":  # "cuda" alone is the caller's current device (a new thread's is 0)
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        stream = torch.cuda.current_stream(device)

    def work() -> None:
        _LOCAL.inside = True
        try:
            with torch.no_grad():
                if stream is None:
                    box["value"] = make()
                else:
                    with torch.cuda.device(device), torch.cuda.stream(stream):
                        box["value"] = make()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=work, name="glyd-persistent", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def persistent(device: torch.device, make):
    """``make()``, whose CUDA tensors outlive the call (caches, reused buffers), made outside any CUDA
    graph pool the calling thread's allocations are routed to (CUDA graph trees' warm-up, a
    ``torch.cuda.use_mem_pool`` block). Inline on the CPU, under Triton's interpreter, while a graph
    is captured and during tracing."""
    return _in_thread(make, device) if _off_thread(device) else make()


_COUNTERS: dict[tuple[str, int | None], list[torch.Tensor]] = {}


def counters(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 buffer for ``n`` per-tile counters (``COUNTER_SLOTS`` apart) on ``device``
    for ``split_fixup`` (every launch leaves it zeroed again). Buffers are never freed, so CUDA graphs that captured
    an older one stay valid; like ``scratch``, use one stream per device."""
    key = (device.type, device.index)
    n = n * COUNTER_SLOTS
    bufs = _COUNTERS.setdefault(key, [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(persistent(device, lambda: torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device)))
    return bufs[-1]


# part: fp32 [split, M, N]; bias: [N] or None; out: bf16 [M, N]
#: The split-K reduce's elements a program and warps; 0 = by output size (on the H200: one-warp
#: programs of 128 outputs up to 2^18 outputs, where they cut q/o at M = 1 from 1.145x to 1.005x
#: bf16; 512 outputs and 4 warps above, where small programs lost 1-2%).
FINALIZE_BLOCK, FINALIZE_WARPS = 0, 0


def finalize(part: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, pdl: str = "") -> None:
    """out = bf16(sum of the split-K partials in split order + bias)."""
    split, m, n = part.shape
    finalize_launch(split, m, n, bias is not None, part.device, pdl)(part, bias if bias is not None else part, out)


# -> launch(part, bias or part, out): finalize of fp32 [split, M, N] partials into bf16 [M, N]
def finalize_launch(split: int, m: int, n: int, has_bias: bool, device: torch.device, pdl: str = ""):
    """``finalize`` as a ``glyd.kernels._plan.Launch`` (for a plan)."""
    mn = m * n
    small = mn <= 1 << 18
    block = FINALIZE_BLOCK or (128 if small else 512)
    warps = FINALIZE_WARPS or (1 if small else 4)
    flags = pdl_flags(device, pdl, "reduce")
    part, bias, out = _plan.slots(3)
    return _plan.Launch(_finalize_kernel, (triton.cdiv(mn, block),), (part, bias, out, mn, n),
                        dict(SPLIT=split, HAS_BIAS=has_bias, BLOCK=block, PDL=flags, num_warps=warps,
                             **({"launch_pdl": True} if flags & 1 else {})))


def check_x(x: torch.Tensor, k: int) -> torch.Tensor:
    """x as a bf16 [M, K] matrix with unit stride along K (a view when possible)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be bfloat16 for the fused kernels, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x has shape {tuple(x.shape)}; its last dimension must be K = {k}")
    x2 = x.reshape(-1, k) if k else x.reshape(math.prod(x.shape[:-1]), 0)
    if k and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2


def check_launch_shapes(kernel: str, x2: torch.Tensor, shape: tuple[int, int], out: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None) -> None:
    """ValueError unless a direct ``launch`` of ``kernel`` can run ``x2 [M, K]`` against a packed matrix of
    ``shape`` ``(N, K)``: x 2-D bf16 with the matrix's K and unit stride along it, and M, N, K at least 1 (an
    empty product has no program to run; ``glyd.kernels.linear`` returns it, or the bias for K = 0, without a
    launch); ``out`` (when given) a contiguous bf16 ``[M, N]`` on x's device, as the kernels store it; ``bias``
    (when given) a contiguous floating ``[N]`` there, as they read it. Before any launch.

    >>> check_launch_shapes("dense11_v2_gemv", torch.zeros(1, 0), (4, 0))
    Traceback (most recent call last):
    ValueError: dense11_v2_gemv launch: x has shape (1, 0) and the packed matrix [4, 0]: K = 0 is an empty ...
    """
    n, k = shape
    if not isinstance(x2, torch.Tensor) or x2.dim() != 2 or x2.shape[1] != k:
        got = tuple(x2.shape) if isinstance(x2, torch.Tensor) else type(x2).__name__
        raise ValueError(f"{kernel} launch: x has shape {got}; the packed matrix is [{n}, {k}]: x must be [M, {k}]")
    m = x2.shape[0]
    for dim, size, what in (("K", k, "an empty sum"), ("M", m, "no x rows"), ("N", n, "no weight rows")):
        if size == 0:
            raise ValueError(f"{kernel} launch: x has shape {tuple(x2.shape)} and the packed matrix [{n}, {k}]: "
                             f"{dim} = 0 is {what}, which a launch cannot run (glyd.kernels.linear returns an empty "
                             f"product without one: zeros plus the bias for K = 0)")
    if x2.dtype != torch.bfloat16 or (k > 1 and x2.stride(1) != 1):
        raise ValueError(f"{kernel} launch: x must be bf16 with unit stride along K, got {x2.dtype}, "
                         f"strides {x2.stride()}")
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, n)
                            or out.dtype != torch.bfloat16 or not out.is_contiguous() or out.device != x2.device):
        got = (f"{out.dtype} {tuple(out.shape)} strides {out.stride()} on {out.device}"
               if isinstance(out, torch.Tensor) else type(out).__name__)
        raise ValueError(f"{kernel} launch: out must be a contiguous bf16 [{m}, {n}] on {x2.device}, got {got}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,) or not bias.is_contiguous()
                             or bias.dtype not in (torch.bfloat16, torch.float16, torch.float32)
                             or bias.device != x2.device):
        got = (f"{bias.dtype} {tuple(bias.shape)} strides {bias.stride()} on {bias.device}"
               if isinstance(bias, torch.Tensor) else type(bias).__name__)
        raise ValueError(f"{kernel} launch: bias must be a contiguous floating [{n}] on {x2.device}, got {got}")


def check_bias(bias: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor | None:
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != n:
        raise ValueError(f"bias must be a 1-D tensor of N = {n} elements, got {getattr(bias, 'shape', bias)}")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device}, x on {device}")
    if bias.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"bias must be a floating tensor, got {bias.dtype}")
    return bias.contiguous()


def check_device(packed, x: torch.Tensor) -> None:
    dev = packed.device
    if dev != x.device:
        raise ValueError(f"packed matrix is on {dev}, x on {x.device}")
    if dev.type != "cuda" and not interpreting():
        raise ValueError(f"glyd.kernels needs CUDA tensors (or TRITON_INTERPRET=1), got {dev}")


def check_size(what: str, numel: int) -> None:
    if numel >= 2**31:
        raise FormatError(f"{what} has {numel} elements; the kernels index with 32-bit offsets (< 2**31)")


_CACHE: dict[int, tuple[weakref.ref, tuple, object, set]] = {}


def packed_tag(p) -> tuple:
    """What a packed matrix says beside its arrays (layout, shape, format version): ``cached``'s ``tag``
    for data derived from a ``Packed`` or ``PackedExperts``."""
    return (p.layout, tuple(p.shape), p.version)


def cached(key_tensor: torch.Tensor, make, sources=(), tag: tuple = ()):
    """``make()``, computed once per live ``key_tensor`` and made again after it or any tensor of
    ``sources`` (what ``make`` reads) is replaced or changed in place (``load_state_dict`` copies into
    existing buffers, one array at a time), or when ``tag`` differs (what else ``make`` reads: a
    packed matrix's layout, shape and format version, which another ``Packed`` over the very same
    tensors may say otherwise); entries die with ``key_tensor`` or any of ``sources``."""
    k = id(key_tensor)
    stamp = (tag, key_tensor._version, *((id(t), t._version) for t in sources))
    hit = _CACHE.get(k)
    if hit is not None and hit[0]() is key_tensor and hit[1] == stamp:
        return hit[2]
    value = persistent(key_tensor.device, make)
    fresh = hit is None or hit[0]() is not key_tensor
    watched = set() if fresh else hit[3]  # ids of the sources whose death drops the entry
    _CACHE[k] = (weakref.ref(key_tensor), stamp, value, watched)
    if fresh:
        weakref.finalize(key_tensor, _CACHE.pop, k, None)
    # a source's death drops the entry too: CPython gives its id to the next tensor made (version 0),
    # which would match the stamp (no per-call check of the objects: the hits stay cheap)
    for t in sources:
        if t is not key_tensor and id(t) not in watched:
            watched.add(id(t))
            weakref.finalize(t, _CACHE.pop, k, None)
    return value


#: Exceptions a step of ``patch_exceptions`` writes (their loads overlap).
PATCH_CHUNK = 16


@triton.jit
def patch_exceptions(out_ptr, tile_ptr, pos_ptr, val_ptr, tile, pos0, lim, E: tl.constexpr):
    # The exceptions of one program's output tile written over the placeholders it has just stored
    # (an unpack's exceptions inside its own launch: no second scatter kernel). ``tile_ptr`` is a
    # CSR over output tiles (``exception_tiles``): their true 16-bit words at flat offsets
    # pos - pos0 of out, below ``lim`` (a row range's last tile may reach past it). Other threads
    # of the program stored the placeholders: the barrier orders their stores before these (a CTA
    # barrier makes a thread's global writes visible to the whole CTA).
    e0 = tl.load(tile_ptr + tile)
    e1 = tl.load(tile_ptr + tile + 1)
    if e1 > e0:
        tl.debug_barrier()
        for eb in range(e0, e1, E):
            e = eb + tl.arange(0, E)
            m = e < e1
            pos = tl.load(pos_ptr + e, mask=m, other=0).to(tl.int64) - pos0
            v = tl.load(val_ptr + e, mask=m, other=0)
            tl.store(out_ptr + pos, v, mask=m & (pos < lim))


def exception_tiles(owner, key, pos: torch.Tensor, vals: torch.Tensor, tile: torch.Tensor, ntiles: int):
    """The exceptions grouped by the output tile that writes them, for ``patch_exceptions``: (tile
    pointers int32 [ntiles + 1], flat positions int32, true words int16), kept on ``owner`` (a
    per-matrix prepared object, made again when the matrix changes) under ``key`` (the tiling).
    ``tile``: each exception's tile (int64, as ``pos``); built once a matrix and tiling (host work)."""
    kept = owner.__dict__.setdefault("_exception_tiles", {})
    hit = kept.get(key)
    if hit is None:
        def make():
            order = torch.sort(tile, stable=True).indices  # positions ascend: already in tile order for a flat tiling
            counts = torch.bincount(tile, minlength=ntiles)
            ptr = torch.zeros(ntiles + 1, dtype=torch.int64, device=pos.device)
            ptr[1:] = torch.cumsum(counts, 0)
            # int32 positions: the kernels index a matrix of < 2**31 weights (check_size on its planes)
            return ptr.to(torch.int32), pos[order].to(torch.int32), vals[order].contiguous()

        hit = kept[key] = persistent(pos.device, make)
    return hit


_SCRATCH: dict[tuple[str, int | None], torch.Tensor] = {}
#: Scratch buffers a CUDA graph capture was handed, by address: kept for the process's life (its
#: replays write into them after ``scratch`` has moved on to a larger buffer; freed, they would be
#: another tensor's memory)
_CAPTURED_SCRATCH: dict[int, torch.Tensor] = {}


# x2: bf16 [M, K]; w: bf16 [N, K]; bias: [N] or None; out: bf16 [M, N] -> out
def mm_into(x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """``F.linear(x2, w, bias)`` written into ``out`` (the same cuBLAS call, bias in its epilogue):
    the long-prompt path needs no second [M, N] output."""
    if bias is None:
        return torch.mm(x2, w.t(), out=out)
    return torch.addmm(bias.to(out.dtype), x2, w.t(), out=out)


# parts: [(r0, r1, launch(w, *arrays) writing rows r0:r1 of W into w bf16 [r1 - r0, K])] covering N
def unpack_mm_plan(device: torch.device, k: int, parts: list) -> object:
    """``run(x2, bias, out, arrays)`` of an unpack + cuBLAS family's plan (``Kernel.plan``): per call,
    each part's unpack launch into the device's scratch buffer, then cuBLAS writing that part's
    columns of ``out`` in place (a row stride of N is a valid leading dimension), bias in its epilogue.
    A single part called with ``out=None`` (a kept plan's call) returns cuBLAS's own output: the same
    GEMM, one allocation and one op dispatch less on the host."""
    size = max(r1 - r0 for r0, r1, _ in parts) * k
    whole = len(parts) == 1

    def run(x2, bias, out, arrays):
        buf = scratch(device, size)  # looked up each call: another matrix may have grown it
        for r0, r1, launch in parts:
            w = buf[:(r1 - r0) * k].view(r1 - r0, k)
            launch(w, *arrays)
            if whole and out is None:  # a kept plan's call: cuBLAS allocates (one op less on the host)
                return F.linear(x2, w, None if bias is None else bias.to(x2.dtype))
            if whole:
                mm_into(x2, w, bias, out)
            else:
                mm_into(x2, w, None if bias is None else bias[r0:r1], out[:, r0:r1])
        return out

    run.makes_out = whole  # glyd.kernels._plan.Plan passes out=None: the same cuBLAS call makes it
    return run


def scratch(device: torch.device, numel: int) -> torch.Tensor:
    """A reused bf16 buffer of at least ``numel`` elements on ``device`` (one per device: the
    long-prompt path unpacks into it then calls cuBLAS; use one stream per device)."""
    index = device.index
    if index is None and device.type == "cuda":  # "cuda" and "cuda:0" are one device: one buffer
        index = torch.cuda.current_device()
    key = (device.type, index)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        buf = persistent(device, lambda: torch.empty(max(numel, 1), dtype=torch.bfloat16, device=device))
        _SCRATCH[key] = buf
    if _capturing(device):
        _CAPTURED_SCRATCH.setdefault(buf.data_ptr(), buf)
    return buf[:numel]
