"""Shared launch helpers: block configs per M bucket, split-K, the split-K finalize kernel, caches.

Kernels never call ``.item()`` or copy to the host, so ``linear`` can be captured in a CUDA graph.
Host-side work that needs the data (exception row pointers) happens once per packed matrix in
``prepare`` and is cached on the matrix's tensors.
"""

from __future__ import annotations

import dataclasses
import math
import os
import weakref

import torch
import triton
import triton.language as tl

from glyd.errors import FormatError
from glyd.kernels._interp import isolated


@dataclasses.dataclass(frozen=True)
class Config:
    """Block shape of one fused-linear launch.

    ``dot``: tensor-core path (``tl.dot``, x padded to ``bm`` >= 16 rows); else the FMA path for
    one activation row per program (decode once, multiply on the CUDA cores). ``split``: K splits
    (0 = choose from the SM count). ``long``: unpack to a scratch buffer then cuBLAS instead;
    ``chunk`` (with ``long``, fixed12): unpack and multiply that many weight rows at a time, so
    the bf16 scratch is small enough to stay in L2 between the unpack and cuBLAS (0: whole).
    ``group_major`` (fixed12 FMA path): tile order [groups, rows, words] so x loads are shared by
    a thread's rows; with it, ``bm`` = 2 or 4 multiplies the decoded tile by that many x rows
    (one accumulator each; the GEMV default at M = 2-8, timed in
    benchmarks/history/2026-11-30-kernels-h200.md).
    ``byte`` (fixed12, any M): byte-tile GEMV, one activation row a program, ``g`` 64-weight
    groups a step on [bn, g, 32] tiles in column order (contiguous x shared by the rows).
    ``mma`` (fixed12, dot path): plane tiles go to shared memory by async copy, then straight into
    the tensor-core operand registers, decoded there (no decoded tile in shared memory); ``g``
    64-weight groups a step. ``waves``: split K until the grid has ``waves`` programs an SM.
    ``fixup``: split-K partials are summed in the kernel by the last split program of each tile
    (``split_fixup``) instead of a second kernel (``finalize``); fixed12 FMA, GEMV, byte, mma,
    tc and gluon kernels (gluon: with the exceptions in the tile or none; a launch with one split
    always writes bf16 directly). Same bits as ``finalize``.
    ``gemv`` (fixed12, ``group_major`` with ``stages`` 1): the dedicated group-major GEMV kernel
    (one decoded tile for ``bm`` <= 16 x rows, unmasked loads on whole shapes, x read as bf16
    pairs, ``prmt`` decode on the GPU); False keeps the general masked FMA loop (``bm`` 1, 2, 4),
    for comparison. ``prefetch`` (that GEMV): load the next step's plane words into registers
    before decoding this step's (also ``tc``). ``tc`` (fixed12, dot path): tensor cores fed from
    the GEMV's register loads (plane words decoded to bf16 in registers, then through shared
    memory into the MMA operand); ``stages`` > 1 there pipelines the plane loads by async copy.
    ``gluon`` (fixed12, CUDA only): the same product with explicit layouts (``fixed12_gluon``):
    the decoded tile is the MMA operand in registers, ``prefetch`` loads the next step's words and
    x rows first, ``warps`` 1, 2 or 4 side by side along N; exceptions in a pass of their own.
    ``exc_pass`` (GEMV, tc): exceptions in that separate pass over fp32 partials instead of a serial
    loop in each tile's first split program; on CUDA the pass runs beside the tile kernel on a side
    stream (``fixed12.CONCURRENT_EXC``) unless ``exc_after`` puts it after (each measured per shape).
    ``ring`` (gluon with prefetch): > 1 brings the plane words by 16-byte async copies through a
    shared-memory ring of that many K steps instead of registers; ``ring_x`` puts the x rows in
    the same ring (copied once a program instead of once a warp; at bm 32 and 64 it also keeps
    the 2 or 4 x tiles out of registers). ``exc_tile`` (gluon): the exceptions of each tile's rows
    are added by its first split program after the K loop, instead of in the separate pass.
    ``x_ahead`` (gluon with prefetch, x not in the ring): False loads each step's x rows in that
    step (they hit L1/L2) instead of one step ahead, which frees the registers of a second x tile
    (bm 16 bn 64 4 warps: 100 registers instead of 141). ``x_rows8`` (gluon, bm 16): at M <= 8
    only x rows 0-7 are loaded, the MMA's rows 8-15 are zeros. ``maxnreg`` (gluon): a register
    cap a thread (0: the compiler's choice), for more programs an SM. ``wg`` (gluon, Hopper): the
    weights as the register A operand of warpgroup MMA and the x rows (``bm`` of them: wgmma's N)
    from shared memory (``fixed12_wg``); ``bm`` 8-64, ``bk`` 128, 4 or 8 warps, ``bn`` 16 or 32
    rows a warp, K a multiple of 256; ``exc_tile`` adds the exceptions in the tile there too. ``pipe`` (wg): keep
    one MMA in flight across K steps instead of waiting for each at its step's end. ``ws`` (wg): the
    warp-specialized variant (``fixed12_ws``): one warp brings the plane words and x tiles of
    ``stages`` K steps (2-8) by TMA into a shared-memory ring, the warpgroup decodes and multiplies;
    x is permuted to the MMA's k order by a copy before the kernel; K a multiple of 128, 4 warps (or
    8 with ``bn`` 128: two warpgroups decoding the same ring slot, 64 rows each); ``bm`` up to 256
    (long prompts: measured slower than unpack + cuBLAS,
    benchmarks/history/2026-12-01-kernels-h200.md, run 86); ``pipe``
    there keeps one step's MMAs in flight while the next step decodes (correct on the H200, slower
    everywhere: run 87). ``consumers`` (ws) 2: two consumer warpgroups, each a partition of its
    own with 64 rows of every 128-row tile (``bn`` 128, 4 warps, a ``maxnreg`` cap needed), so one
    decodes while the other's MMAs run.
    The grid is persistent (``waves`` programs an SM, or ``split`` programs in all) over equal
    ranges of all tiles' K steps (stream-K); exceptions always in the tile (``exc_tile``).
    """

    bm: int = 16
    bn: int = 64
    bk: int = 256
    dot: bool = True
    split: int = 0
    warps: int = 4
    stages: int = 3
    long: bool = False
    chunk: int = 0
    group_major: bool = False
    byte: bool = False
    g: int = 4
    mma: bool = False
    waves: int = 2
    fixup: bool = False
    prefetch: bool = False
    gemv: bool = True
    tc: bool = False
    gluon: bool = False
    exc_pass: bool = False
    exc_after: bool = False
    ring: int = 1
    ring_x: bool = False
    exc_tile: bool = False
    x_ahead: bool = True
    x_rows8: bool = False
    maxnreg: int = 0
    wg: bool = False
    pipe: bool = False
    ws: bool = False
    consumers: int = 1

    def __post_init__(self) -> None:
        for name in ("bm", "bn", "bk"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"Config.{name} must be a power of two, got {v}")
        if self.dot and (self.bm < (8 if self.wg else 16) or self.bn < 16):
            raise ValueError("the tl.dot path needs bm >= 16 and bn >= 16")
        if self.byte and (self.dot or self.group_major or self.g < 1 or self.g & (self.g - 1)):
            raise ValueError("byte is an FMA-path tile (dot=False, group_major=False) with a power-of-two g")
        if self.mma and (not self.dot or self.byte or self.group_major or self.g < 1 or self.g & (self.g - 1)):
            raise ValueError("mma is a tensor-core tile (dot=True, not byte or group_major) with a power-of-two g")
        if self.tc and (not self.dot or self.mma or self.byte or self.group_major or self.bk < 64):
            raise ValueError("tc is a tensor-core tile (dot=True, not mma, byte or group_major) with bk >= 64")
        if self.gluon and (not self.dot or self.mma or self.byte or self.group_major or self.tc
                           or self.bm not in ((8, 16, 32, 64, 128, 256) if self.ws else (8, 16, 32, 64) if self.wg
                                              else (16, 32, 64))
                           or self.warps not in ((4, 8) if self.wg else (1, 2, 4))
                           or self.bn < max(16, 8 * self.warps) or self.bk < 64):
            raise ValueError("gluon is a tensor-core tile (dot=True, not tc, mma, byte or group_major) with bm 16, "
                             "32 or 64, 1, 2 or 4 warps, bn >= 16 and >= 8 a warp, bk >= 64")
        if self.wg and (not self.gluon or self.bk != 128 or self.bn not in (16 * self.warps, 32 * self.warps)
                        or self.ring > 1 or self.fixup or self.x_rows8 or not self.x_ahead):
            raise ValueError("wg is a gluon tile with bk 128 and bn 16 or 32 rows a warp, without ring, fixup or "
                             "the x_ahead / x_rows8 settings")
        if self.ws and not (self.wg and (self.warps == 4 or (self.warps, self.bn) == (8, 128))
                            and 2 <= self.stages <= 8 and self.exc_tile):
            raise ValueError("ws is a wg tile with 4 warps (or 8 with bn 128), a ring of 2-8 stages and exc_tile")
        if self.consumers != 1 and not (self.consumers == 2 and self.ws and self.warps == 4 and self.bn == 128
                                        and not self.pipe and self.maxnreg >= 40):
            raise ValueError("Config.consumers 2 is a ws tile with 4 warps, bn 128, no pipe and a maxnreg cap")
        if self.pipe and not self.wg:
            raise ValueError("Config.pipe (an MMA in flight across K steps) applies to wg")
        if self.ring < 1 or (self.ring > 1 and not (self.gluon and self.prefetch)):
            raise ValueError(f"Config.ring > 1 (async-copy ring) needs gluon with prefetch, got ring = {self.ring}")
        if self.ring_x and self.ring < 2:
            raise ValueError("Config.ring_x puts x rows in the async ring: it needs ring > 1")
        if self.exc_tile and (not self.gluon or self.exc_pass or self.exc_after):
            raise ValueError("exc_tile (exceptions inside the tile kernel) applies to gluon, without exc_pass or exc_after")
        if (not self.x_ahead or self.x_rows8) and not (self.gluon and self.prefetch and not self.ring_x):
            raise ValueError("x_ahead=False and x_rows8 apply to gluon with prefetch and x outside the ring")
        if self.x_rows8 and self.bm != 16:
            raise ValueError("x_rows8 loads 8 of one 16-row x tile: it needs bm 16")
        if self.maxnreg and not (self.gluon and 32 <= self.maxnreg <= 255):
            raise ValueError(f"Config.maxnreg applies to gluon and must be 32-255 (0: none), got {self.maxnreg}")
        if self.exc_after and not (self.exc_pass or self.gluon):
            raise ValueError("exc_after applies to a separate exception pass (exc_pass or gluon)")
        if self.exc_pass and not (self.tc or (self.group_major and self.stages == 1 and self.gemv)):
            raise ValueError("exc_pass applies to the group-major GEMV and tc (gluon always runs its own pass)")
        if self.chunk < 0 or self.chunk % 64:
            raise ValueError(f"Config.chunk must be a multiple of 64 rows (0: whole matrix), got {self.chunk}")
        if self.waves < 1:
            raise ValueError(f"Config.waves must be >= 1, got {self.waves}")
        if self.prefetch and not (self.group_major and self.stages == 1 and self.gemv) and not (self.tc or self.gluon):
            raise ValueError("prefetch applies to the group-major GEMV (group_major, stages = 1, gemv), tc and gluon")
        if self.tc and self.prefetch and self.stages > 1:
            raise ValueError("tc takes prefetch (register double buffer) or stages > 1 (pipelining), not both")
        if self.group_major and self.dot:
            raise ValueError("group_major applies to the FMA path (dot=False) only")
        if self.split < 0 or self.warps not in (1, 2, 4, 8, 16) or self.stages < 1:
            raise ValueError(f"bad split/warps/stages in {self}")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: any small number keeps the split-K code paths exercised


def gluon_launch_checks(x2: torch.Tensor, p, flag: str, k_step: int, k_name: str = "", hopper: str = ""):
    """The checks every Gluon launcher makes before it runs: a CUDA GPU (Gluon has no interpreter),
    a Hopper GPU where ``hopper`` names what it needs there, and K (= Kp, no padded columns) a
    multiple of ``k_step`` (named ``k_name`` in the message, if given). Returns (M, K, N, arrays, Kp)."""
    m, k = x2.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    if interpreting() or x2.device.type != "cuda":
        raise RuntimeError(f"Config({flag}=True) runs only on a CUDA GPU (Gluon has no interpreter): use tc there")
    if hopper and torch.cuda.get_device_capability(x2.device)[0] != 9:
        raise RuntimeError(f"Config({flag}=True) needs a Hopper GPU ({hopper}, sm_90)")
    if k != kp or kp % k_step:
        what = f"{k_name} = {k_step}" if k_name else f"{k_step}"
        raise ValueError(f"Config({flag}=True) needs K a multiple of {what} (no padded columns), got K = {k}")
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


#: Programmatic dependent launch (Hopper and later, CUDA), from ``GLYD_PDL`` at import: "all"
#: (or "1") launches the fused kernels and the split-K reduce so that they may start while the
#: kernel before them ends, each waiting (``griddepcontrol.wait``) before it reads anything that
#: kernel may write (x, the partials), and has the fused kernels let the reduce launch as soon as
#: all their programs run; "reduce" does that for the reduce only, "tiles" for the fused kernels
#: only; "" or "0": off (the default: "all" measured slower at M = 2-8,
#: benchmarks/history/2026-12-01-kernels-h200.md, run 54).
PDL = {"1": "all", "0": ""}.get(os.environ.get("GLYD_PDL", ""), os.environ.get("GLYD_PDL", ""))
PDL_MODES = ("", "all", "reduce", "tiles")


def pdl_flags(device: torch.device, kernel: str = "tile") -> int:
    """Programmatic-dependent-launch flags of a launch on ``device`` (see ``PDL``): bit 1, launched
    early and waits for the previous kernel; bit 2 (fused kernels), lets the next kernel launch early."""
    if PDL not in PDL_MODES:
        raise ValueError(f"GLYD_PDL must be one of 0, 1, all, reduce, tiles; got {PDL!r}")
    if (not PDL or device.type != "cuda" or interpreting()
            or torch.cuda.get_device_capability(device)[0] < 9):
        return 0
    if kernel == "reduce":
        return int(PDL in ("all", "reduce"))
    return int(PDL in ("all", "tiles")) | 2 * (PDL in ("all", "reduce"))


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
    # the SM read x from (with acquire spins the Gluon tiles ran 20-45% slower, sweep round 24).
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


_COUNTERS: dict[tuple[str, int | None], list[torch.Tensor]] = {}


def counters(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 buffer for ``n`` per-tile counters (``COUNTER_SLOTS`` apart) on ``device``
    for ``split_fixup`` (every launch leaves it zeroed again). Buffers are never freed, so CUDA graphs that captured
    an older one stay valid; like ``scratch``, use one stream per device."""
    key = (device.type, device.index)
    n = n * COUNTER_SLOTS
    bufs = _COUNTERS.setdefault(key, [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device))
    return bufs[-1]


# part: fp32 [split, M, N]; bias: [N] or None; out: bf16 [M, N]
#: The split-K reduce's elements a program and warps; 0 = by output size (sweep round 6 on the
#: H200: one-warp programs of 128 outputs up to 2^18 outputs, e.g. q/o at M = 1 1.145x -> 1.005x
#: bf16, k/v 1.22x -> 1.05x; 512 outputs and 4 warps above, where small programs lost 1-2%).
FINALIZE_BLOCK, FINALIZE_WARPS = 0, 0


def finalize(part: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    split, m, n = part.shape
    mn = m * n
    small = mn <= 1 << 18
    block = FINALIZE_BLOCK or (128 if small else 512)
    warps = FINALIZE_WARPS or (1 if small else 4)
    flags = pdl_flags(part.device, "reduce")
    _finalize_kernel[(triton.cdiv(mn, block),)](
        part, bias if bias is not None else part, out, mn, n, SPLIT=split, HAS_BIAS=bias is not None, BLOCK=block,
        PDL=flags, num_warps=warps, **({"launch_pdl": True} if flags & 1 else {}),
    )


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


_CACHE: dict[int, tuple[weakref.ref, int, object]] = {}


def cached(key_tensor: torch.Tensor, make):
    """``make()``, computed once per live ``key_tensor`` and made again after the tensor is changed
    in place (``load_state_dict`` copies into existing buffers); entries die with the tensor."""
    k = id(key_tensor)
    hit = _CACHE.get(k)
    if hit is not None and hit[0]() is key_tensor and hit[1] == key_tensor._version:
        return hit[2]
    value = make()
    fresh = hit is None or hit[0]() is not key_tensor
    _CACHE[k] = (weakref.ref(key_tensor), key_tensor._version, value)
    if fresh:
        weakref.finalize(key_tensor, _CACHE.pop, k, None)
    return value


_SCRATCH: dict[tuple[str, int | None], torch.Tensor] = {}


def scratch(device: torch.device, numel: int) -> torch.Tensor:
    """A reused bf16 buffer of at least ``numel`` elements on ``device`` (one per device: the
    long-prompt path unpacks into it then calls cuBLAS; use one stream per device)."""
    key = (device.type, device.index)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(max(numel, 1), dtype=torch.bfloat16, device=device)
        _SCRATCH[key] = buf
    return buf[:numel]
