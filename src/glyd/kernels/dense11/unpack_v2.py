"""The bit-exact unpack of a ``dense11`` format-version-2 or -3 matrix (decode: ``decode_v2.py``): a program
takes ``rows`` rows of one 1024-column escape block, step by step, and stores bf16 pairs (one
``prmt`` a pair from the lane words; an odd K stores 16-bit words instead); its exceptions (digit 15
and ranks 8 and up, decoded with exponent 0) are written over by the same program after a barrier.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec import dense11 as _codec
from glyd.codec.packed import Packed
from glyd.kernels import _common as C
from glyd.kernels import _plan
from glyd.kernels._interp import isolated
from glyd.kernels.dense11.decode_v2 import _prmt, block_start, decode_step, hw, prepare

BLOCK = _codec.BLOCK
BLOCK_C = tl.constexpr(BLOCK)  # what a jit function may read of a global


@triton.jit
def _pair(lo, hi, H: tl.constexpr, HW: tl.constexpr):
    # the bf16 pair word of byte lanes 2H, 2H + 1 (low byte from lo, high byte from hi)
    if H == 0:
        return _prmt(lo, hi, lo * 0 + 0x5140, HW)
    return _prmt(lo, hi, lo * 0 + 0x7362, HW)


@triton.jit
def _store_half(out_ptr, hi, lo, rn, nmask, kb, K, HALF: tl.constexpr, W: tl.constexpr, EVEN: tl.constexpr,
                HW: tl.constexpr, FULL: tl.constexpr):
    # one half (16 columns of each run) of lane words into out: int32 pairs (EVEN) or int16 words
    wi = tl.arange(0, W)[None, :, None]
    qq = tl.arange(0, 4)[None, None, :]
    col = kb + 32 * wi + 16 * HALF + 4 * qq  # [1, W, 4]: the lane word's first column
    rows = rn[:, None, None]
    m = nmask[:, None, None]
    if EVEN:
        po = rows * (K // 2) + col // 2
        for H in tl.static_range(2):
            v = _pair(lo, hi, H, HW).to(tl.int32, bitcast=True)
            if FULL:
                tl.store(out_ptr + po + H, v)
            else:
                tl.store(out_ptr + po + H, v, mask=m & (col + 2 * H < K))
    else:
        for t in tl.static_range(4):
            v = (((hi >> (8 * t)) & 0xFF) << 8) | ((lo >> (8 * t)) & 0xFF)
            tl.store(out_ptr + rows * K + col + t, v.to(tl.int16), mask=m & (col + t < K))


@isolated
@triton.jit(do_not_specialize=["NESCW", "TH0", "TH1", "TL0", "TL1", "HA0", "HA1", "HB0", "HB1", "LA0", "LA1", "LB0",
                               "LB1"])
def _unpack_v2_kernel(sm_ptr, code_ptr, esc_ptr, ebase_ptr, eoff_ptr, out_ptr, out16_ptr, tile_ptr, epos_ptr,
                      eval_ptr, N, K, KP, NBR, NESCW, TH0, TH1, TL0, TL1, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1,
                      BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr, HW: tl.constexpr,
                      HAS_EXC: tl.constexpr, E: tl.constexpr, FULL: tl.constexpr = False, V3: tl.constexpr = False):
    # rows [pid_n * BN, +BN) of block column pid_b (columns 1024 pid_b .. +1024), BK a step. V3: format
    # version 3's arrays (the exceptions' true words come from Prepared, which reads their sm bytes block-wise)
    W: tl.constexpr = BK // 32
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    tab = (HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1)
    lut = (TH0, TH1, TL0, TL1)
    run = block_start(ebase_ptr, eoff_ptr, rn * NBR + pid_b, nmask)
    for kb in range(pid_b * BLOCK_C, tl.minimum(pid_b * BLOCK_C + BLOCK_C, KP), BK):
        hia, loa, hib, lob, run = decode_step(code_ptr, sm_ptr, esc_ptr, rn, nmask, kb, KP, NESCW, run, tab, lut,
                                              BN, W, HW, FULL, V3)
        _store_half(out_ptr, hia, loa, rn, nmask, kb, K, 0, W, EVEN, HW, FULL)
        _store_half(out_ptr, hib, lob, rn, nmask, kb, K, 1, W, EVEN, HW, FULL)
    if HAS_EXC:  # this tile's exceptions over their placeholders (exponent 0)
        C.patch_exceptions(out16_ptr, tile_ptr, epos_ptr, eval_ptr, pid_n * NBR + pid_b, 0, N * K, E)


def _tables(prep) -> tuple[int, ...]:
    return (*prep.lut, *prep.tab)


@dataclasses.dataclass(frozen=True)
class Dense11V2UnpackConfig:
    """``rows`` rows a program (one 1024-column block each), ``bk`` columns a step (dividing 1024;
    one run of 32 a thread at ``rows * bk / 32`` = 32 x ``warps``), ``warps``."""

    rows: int = 8
    bk: int = 256
    warps: int = 2

    def __post_init__(self) -> None:
        C.pow2(self, "rows", "bk", "warps")
        if not 64 <= self.bk <= BLOCK:
            raise ValueError(f"bk must be 64-{BLOCK}, got {self.bk}")


# packed: dense11 v2 or v3 [N, K] -> launch(out, *arrays): out bf16 [N, K] (written, contiguous)
def unpack_launch(p: Packed, config: Dense11V2UnpackConfig | None = None) -> _plan.Launch:
    """The unpack of the version-2 or version-3 matrix ``p`` as one ``glyd.kernels._plan.Launch`` (``arrays``:
    dense11's, in its order), its exceptions patched in by the same launch."""
    from glyd.kernels.dense11.unpack import Dense11UnpackConfig

    if isinstance(config, Dense11UnpackConfig):  # the layout's unpack config: the same fields
        config = Dense11V2UnpackConfig(config.rows, config.bk, config.warps)
    if config is not None and not isinstance(config, Dense11V2UnpackConfig):
        raise TypeError(f"config must be a Dense11UnpackConfig or Dense11V2UnpackConfig (the dense11 unpack's), "
                        f"got {type(config).__name__}")
    cfg = config or Dense11V2UnpackConfig()
    prep = prepare(p)
    n, k = p.shape
    kp = p.arrays["sm"].shape[1]
    nbr = _codec.blocks_per_row(k)
    even = k % 2 == 0
    out = _plan.Slot(0).view(torch.int32 if even else torch.int16)
    out16 = _plan.Slot(0).view(torch.int16)
    has_exc = prep.nexc > 0
    if has_exc:
        pos, bn = prep.pos, cfg.rows
        tiles = C.exception_tiles(prep, ("rows", bn), pos, prep.vals, (pos // k // bn) * nbr + pos % k // BLOCK,
                                  triton.cdiv(n, bn) * nbr)
    else:
        tiles = (out16,) * 3
    bk = min(cfg.bk, triton.next_power_of_2(max(kp, 64)))  # K = 0: a width all the same (nothing launches)
    sm, code, esc, ebase, eoff = (_plan.Slot(1 + _codec.ARRAYS.index(a), fixed=True)
                                  for a in ("sm", "code", "esc", "esc_base", "esc_off"))
    return _plan.Launch(_unpack_v2_kernel, (triton.cdiv(n, cfg.rows), nbr),
                        (sm.view(torch.int32), code, esc, ebase, eoff, out, out16, *tiles, n, k, kp, nbr, prep.nescw,
                         *_tables(prep)),
                        dict(BN=cfg.rows, BK=bk, EVEN=even, HW=hw(), HAS_EXC=has_exc, E=C.PATCH_CHUNK,
                             FULL=n % cfg.rows == 0 and k == kp and kp % bk == 0, V3=p.version == 3,
                             num_warps=cfg.warps))


# packed: dense11 v2 or v3 [N, K] (sm [N, Kp], code int32 [N, 3 Kp/32], esc, offsets, exceptions) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, config: Dense11V2UnpackConfig | None = None) -> torch.Tensor:
    """The bf16 matrix of the version-2 or version-3 ``p`` on its device, bit for bit (into ``out`` when given)."""
    launch = unpack_launch(p, config)
    n, k = p.shape
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=p.device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    if n and k:
        launch(out, *(p.arrays[a] for a in _codec.ARRAYS))
    return out
