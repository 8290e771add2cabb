"""Issue 35: Triton decode kernels for the dense-layout candidates of ``dense_candidates.py``, for
a decode-only timing (``probe_dense_decode.py``). Research code: not in ``src/``.

One kernel, specialised by ``LAYOUT`` (0 planes, 1 lanes, 2 nibswar, 3 niblut) and ``MODE``:

- ``UNPACK`` (0): bf16 [N, K] out, bit-exact after the exception scatter (as ``dense11``'s unpack);
- ``HOT`` (1): the hot path only (code 7 left at its placeholder), each program's decoded bf16
  pairs XOR-folded into one int32: the cost of turning code words into weights, no store;
- ``FOLD`` (2): ``HOT`` plus the escape pass: the whole decode but the exceptions, no store;
- ``GEMV`` (3): ``y = x @ W.T`` for one x row (fp32 sums, bf16 out), escapes and exceptions included;
- ``GEMV_HOT`` (4): ``GEMV`` with every code-7 weight left at its placeholder (wrong for escapes:
  the GEMV's cost were escapes free, checked against the placeholder matrix).

A step decodes a [BN, BK] tile as [BN, W, 8] lane words (W = BK / 32 runs of 32 columns, lane word
q = columns 4q .. 4q+3 of its run, one weight a byte) from the run's three code words ([BN, W] each)
and its 8 ``sm`` words (the bytes of columns 4q .. 4q+3): 4 weights an operation, ``fixed12``'s
shape, so the bytes join as ``fixed12``'s do (``prmt.b32`` on the GPU). The escape pass runs on the
[BN, W] escape masks only: each round takes the lowest escape left in every run (rank = the run's
first rank + round), reads its digit, and patches it (UNPACK: a store after a barrier; FOLD: XORs
the difference in; GEMV: adds ``x[col] * (true - placeholder)``). It takes as many rounds as the
tile's busiest run has escapes (``tl.max``): about 3-5 at 3-4% escapes, each round a few tens of
instructions a run. No per-weight rank work anywhere.

Assumes N % BN == 0, K == Kp (K % 64 == 0) and Kp % BK == 0 with BK dividing 1024 (the probe's
shapes); the launchers check it. Under ``TRITON_INTERPRET=1`` ``popc``/``ffs``/``prmt`` have
shift-and-mask twins (``HW=False``).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.words import f32_lane, prmt, x_lane

UNPACK, HOT, FOLD, GEMV, GEMV_HOT = 0, 1, 2, 3, 4
# the same as constexpr globals, which is all a @triton.jit function may read
_UNPACK, _HOT, _FOLD, _GEMV, _GEMV_HOT = (tl.constexpr(UNPACK), tl.constexpr(HOT), tl.constexpr(FOLD), tl.constexpr(GEMV),
                                         tl.constexpr(GEMV_HOT))
MODES = {"unpack": UNPACK, "hot": HOT, "fold": FOLD, "gemv1": GEMV, "gemv1hot": GEMV_HOT}
LAYOUT_IDS = {"planes": 0, "lanes": 1, "nibswar": 2, "niblut": 3}


@triton.jit
def _popc(x, HW: tl.constexpr):
    # set bits of each uint32
    if HW:
        return libdevice.popc(x.to(tl.int32, bitcast=True))
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _lowbit(low, HW: tl.constexpr):
    # index of the one set bit of low (a power of two; 0 gives garbage, masked by the caller)
    if HW:
        return libdevice.ffs(low.to(tl.int32, bitcast=True)) - 1
    return _popc(low - 1, HW)


@triton.jit
def _lookup(a, b, sel, HW: tl.constexpr):
    # prmt.b32 with a register selector: byte t = byte (nibble t of sel, 0..7) of (b:a)
    if HW:
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=tl.uint32,
                                         is_pure=True, pack=1)
    r = sel * 0
    for t in tl.static_range(4):
        s = (sel >> (4 * t)) & 7
        r |= (tl.where(s < 4, a, b) >> (8 * (s & 3)) & 0xFF) << (8 * t)
    return r


@triton.jit
def _pair(lo, hi, H: tl.constexpr, HW: tl.constexpr):
    # bf16 pair word of lanes 2H, 2H+1: lo byte, hi byte of each weight
    if HW:
        if H == 0:
            r = prmt(lo, hi, 0x5140)
        else:
            r = prmt(lo, hi, 0x7362)
    else:
        if H == 0:
            r = (lo & 0xFF) | ((hi & 0xFF) << 8) | ((lo & 0xFF00) << 8) | ((hi & 0xFF00) << 16)
        else:
            r = ((lo >> 16) & 0xFF) | ((hi >> 8) & 0xFF00) | ((lo >> 8) & 0xFF0000) | (hi & 0xFF000000)
    return r


@triton.jit
def _nib_esc(x):
    # bit 4i set where nibble i's low 3 bits are all ones (code 7)
    return x & (x >> 1) & (x >> 2) & 0x11111111


@triton.jit
def _perm(b, LAYOUT: tl.constexpr):
    # column in the run of escape-mask bit b (dense_candidates.perm)
    if LAYOUT == 0:
        j = b
    elif LAYOUT == 1:
        j = 4 * (b & 7) + (b >> 3)
    elif LAYOUT == 2:
        j = 8 * (b & 3) + 4 * ((b >> 2) & 1) + (b >> 3)
    else:
        j = 8 * (b & 3) + (b >> 2)
    return j


@triton.jit
def _decode(c0, c1, c2, s4, BL, BH, TH0, TH1, TL0, TL1, LAYOUT: tl.constexpr, HW: tl.constexpr):
    # (hi, lo) byte lanes [BN, W, 8] of 4 weights each and the runs' escape masks [BN, W], from
    # the code words c0, c1, c2 [BN, W] and the sm words s4 [BN, W, 8]
    q = tl.arange(0, 8)[None, None, :].to(tl.uint32)
    e0 = c0[:, :, None]
    e1 = c1[:, :, None]
    e2 = c2[:, :, None]
    if LAYOUT <= 1:
        m = c0 & c1 & c2
        if LAYOUT == 0:  # spread nibble q of each plane over 4 bytes (multiply: bit i -> bit 8i)
            sh = 4 * q
            t = (((e0 >> sh) & 0xF) * 0x00204081) & 0x01010101
            t |= (((e1 >> sh) & 0xF) * 0x00408102) & 0x02020202
            t |= (((e2 >> sh) & 0xF) * 0x00810204) & 0x04040404
        else:  # lane order: bits q, 8 + q, 16 + q, 24 + q are lane word q
            t = ((e0 >> q) & 0x01010101) | (((e1 >> q) << 1) & 0x02020202) | (((e2 >> q) << 2) & 0x04040404)
    else:
        d = ((c0 >> 3) & 0x11111111) | ((c1 >> 2) & 0x22222222) | ((c2 >> 1) & 0x44444444)
        m = _nib_esc(c0) | (_nib_esc(c1) << 1) | (_nib_esc(c2) << 2) | (_nib_esc(d) << 3)
        x = tl.where(q < 2, e0, tl.where(q < 4, e1, tl.where(q < 6, e2, d[:, :, None])))
        if LAYOUT == 2:
            t = (x >> (4 * (q & 1))) & 0x07070707
        else:
            sel = (x >> (16 * (q & 1))) & 0x7777
            hi = _lookup(TH0, TH1, sel, HW) | (s4 & 0x80808080)
            lo = _lookup(TL0, TL1, sel, HW) | (s4 & 0x7F7F7F7F)
    if LAYOUT != 3:
        e = (t + BL) ^ BH  # base + code in each byte, mod 256 (no carry between bytes)
        hi = ((e >> 1) & 0x7F7F7F7F) | (s4 & 0x80808080)
        lo = ((e << 7) & 0x80808080) | (s4 & 0x7F7F7F7F)
    return hi, lo, m


@triton.jit
def _f32(s, e):
    # fp32 bits of the bf16 with sign/mantissa byte s and exponent e
    return (((s & 0x80) << 24) | (e << 23) | ((s & 0x7F) << 16)).to(tl.float32, bitcast=True)


@triton.jit
def _escapes(m, run, kb, rn2, wi2, esc_ptr, etab_ptr, sm8_ptr, xh_ptr, out16_ptr, fold_e, acc_e, KP, NESC, PH,
             LAYOUT: tl.constexpr, MODE: tl.constexpr, HW: tl.constexpr):
    # The escape pass of one step on the runs' masks m [BN, W] (2-D: one run a thread, where the
    # decode's 3-D layout holds each run in 2 threads): rounds, the lowest escape left in every run
    # a round. run [BN, 1]: the rank of the step's first escape in each row. Returns (run after the
    # step, fold_e, acc_e).
    cnt = _popc(m, HW)
    pre = tl.cumsum(cnt, axis=1) - cnt + run
    if MODE == _UNPACK:
        tl.debug_barrier()  # every tile store before any escape store to the same words
    emax = tl.max(tl.max(cnt, axis=1), axis=0)
    for it in range(0, emax):
        rest = m & (m - 1)  # m without its lowest escape
        low = m ^ rest
        col = kb + 32 * wi2 + _perm(_lowbit(low, HW), LAYOUT)
        rank = pre + it
        ok = (low != 0) & (rank < NESC)
        dw = tl.load(esc_ptr + (rank >> 3), mask=ok, other=0).to(tl.uint32, bitcast=True)
        d = (dw >> ((rank & 7) * 4)) & 15
        e = tl.load(etab_ptr + d, mask=ok, other=0).to(tl.uint32, bitcast=True)
        s = tl.load(sm8_ptr + rn2 * KP + col, mask=ok, other=0).to(tl.uint32)
        if MODE == _UNPACK:
            v = ((s & 0x80) << 8) | (e << 7) | (s & 0x7F)
            tl.store(out16_ptr + rn2 * KP + col, v.to(tl.int16), mask=ok)
        elif MODE == _FOLD:  # the bits that change, in the weight's half of its pair word
            dv = ((e ^ PH) << 7) << (16 * (col & 1)).to(tl.uint32)
            fold_e ^= tl.where(ok, dv, 0)
        else:
            xv = tl.load(xh_ptr + col, mask=ok, other=0.0).to(tl.float32)
            acc_e += tl.where(ok, xv * _f32(s, e) - xv * _f32(s, PH), 0.0)
        m = rest
    return run + tl.sum(cnt, axis=1, keep_dims=True), fold_e, acc_e


@triton.jit
def _exceptions(y, rn, pid_n, rowptr_ptr, eidx_ptr, eexp_ptr, sm8_ptr, xh_ptr, KP, BN: tl.constexpr):
    # y [BN] plus x[col] * (true - placeholder) for the row tile's exceptions (digit 15), which the
    # tiles and the escape pass left at exponent 0
    e_0 = tl.load(rowptr_ptr + pid_n * BN)
    e_1 = tl.load(rowptr_ptr + pid_n * BN + BN)
    for ei in range(e_0, e_1):
        idx = tl.load(eidx_ptr + ei)
        r = idx // KP
        c = idx - r * KP
        s = tl.load(sm8_ptr + r * KP + c).to(tl.uint32)
        xv = tl.load(xh_ptr + c).to(tl.float32)
        tv = _f32(s, tl.load(eexp_ptr + ei).to(tl.uint32))
        y += tl.where(rn.to(tl.int64) == r, xv * tv - xv * _f32(s, s * 0), 0.0)
    return y


@isolated
@triton.jit(do_not_specialize=["NESC", "BL", "BH", "PH", "TH0", "TH1", "TL0", "TL1"])  # one compile for every matrix
def _dense_kernel(code_ptr, sm_ptr, sm8_ptr, esc_ptr, ebase_ptr, eoff_ptr, etab_ptr, x_ptr, xh_ptr, rowptr_ptr,
                  eidx_ptr, eexp_ptr, out_ptr, out16_ptr, KP, NBR, NESC, BL, BH, PH, TH0, TH1, TL0, TL1,
                  BN: tl.constexpr, BK: tl.constexpr, LAYOUT: tl.constexpr, MODE: tl.constexpr, HW: tl.constexpr):
    # UNPACK / HOT / FOLD: rows [pid_n * BN, +BN) of block pid_b (1024 columns); GEMV: every block.
    # x_ptr: x as int32 bf16 pairs, xh_ptr: x as bf16; out_ptr: int32 pair words of the bf16 out
    # (UNPACK), one int32 a program (HOT, FOLD) or bf16 [N] (GEMV); out16_ptr: the bf16 out as int16.
    W: tl.constexpr = BK // 32
    pid_n = tl.program_id(0)
    rn = pid_n * BN + tl.arange(0, BN)
    wi = tl.arange(0, W)
    q = tl.arange(0, 8)
    BLu = BL.to(tl.uint32, bitcast=True)
    BHu = BH.to(tl.uint32, bitcast=True)
    T0 = TH0.to(tl.uint32, bitcast=True)
    T1 = TH1.to(tl.uint32, bitcast=True)
    U0 = TL0.to(tl.uint32, bitcast=True)
    U1 = TL1.to(tl.uint32, bitcast=True)
    PHu = PH.to(tl.uint32, bitcast=True)
    IS_GEMV: tl.constexpr = MODE >= _GEMV
    if IS_GEMV:
        bl0 = 0
        bl1 = NBR
    else:
        bl0 = tl.program_id(1)
        bl1 = bl0 + 1
    # lane words [BN, W, 8]; the runs' code words and escapes [BN, W] (Triton converts the three
    # code-word tiles into the lane words' layout: the smallest conversion it can make here)
    rn2 = rn[:, None]
    wi2 = wi[None, :]
    rn3 = rn[:, None, None]
    wi3 = wi[None, :, None]
    fold = tl.zeros([BN, W, 8], dtype=tl.uint32)
    fold_e = tl.zeros([BN, W], dtype=tl.uint32)
    acc = tl.zeros([BN, W, 8], dtype=tl.float32)
    acc_e = tl.zeros([BN, W], dtype=tl.float32)
    cw0 = rn2 * (3 * (KP // 32)) + 3 * wi2
    so0 = rn3 * (KP // 4) + 8 * wi3 + q[None, None, :]
    for blk in range(bl0, bl1):
        b = rn * NBR + blk
        run = (tl.load(ebase_ptr + b // 16) + tl.load(eoff_ptr + b).to(tl.int32))[:, None]
        for kb in range(blk * 1024, tl.minimum(blk * 1024 + 1024, KP), BK):
            cw = cw0 + 3 * (kb // 32)
            c0 = tl.load(code_ptr + cw).to(tl.uint32, bitcast=True)
            c1 = tl.load(code_ptr + cw + 1).to(tl.uint32, bitcast=True)
            c2 = tl.load(code_ptr + cw + 2).to(tl.uint32, bitcast=True)
            s4 = tl.load(sm_ptr + so0 + kb // 4).to(tl.uint32, bitcast=True)
            hi, lo, m = _decode(c0, c1, c2, s4, BLu, BHu, T0, T1, U0, U1, LAYOUT, HW)
            if IS_GEMV:
                xo = kb // 2 + 16 * wi3 + 2 * q[None, None, :]
                xa = tl.load(x_ptr + xo).to(tl.uint32, bitcast=True)
                xb = tl.load(x_ptr + xo + 1).to(tl.uint32, bitcast=True)
                for t in tl.static_range(4):
                    acc += f32_lane(hi, lo, t, HW) * x_lane(xa, xb, t)
            else:
                p0 = _pair(lo, hi, 0, HW)
                p1 = _pair(lo, hi, 1, HW)
                if MODE == _UNPACK:
                    po = rn3 * (KP // 2) + kb // 2 + 16 * wi3 + 2 * q[None, None, :]
                    tl.store(out_ptr + po, p0.to(tl.int32, bitcast=True))
                    tl.store(out_ptr + po + 1, p1.to(tl.int32, bitcast=True))
                else:
                    fold ^= p0 ^ p1
            if MODE != _HOT and MODE != _GEMV_HOT:
                run, fold_e, acc_e = _escapes(m, run, kb, rn2, wi2, esc_ptr, etab_ptr, sm8_ptr, xh_ptr, out16_ptr,
                                              fold_e, acc_e, KP, NESC, PHu, LAYOUT, MODE, HW)
    if IS_GEMV:
        y = tl.sum(tl.sum(acc, axis=2), axis=1) + tl.sum(acc_e, axis=1)
        if MODE == _GEMV:  # (GEMV_HOT leaves the exceptions at their placeholder too)
            y = _exceptions(y, rn, pid_n, rowptr_ptr, eidx_ptr, eexp_ptr, sm8_ptr, xh_ptr, KP, BN)
        tl.store(out_ptr + rn, y.to(tl.bfloat16))
    elif MODE != _UNPACK:
        f = tl.xor_sum(tl.xor_sum(tl.xor_sum(fold, axis=2), axis=1), axis=0)
        f ^= tl.xor_sum(tl.xor_sum(fold_e, axis=1), axis=0)
        tl.store(out_ptr + pid_n * NBR + bl0, f.to(tl.int32, bitcast=True))


@dataclasses.dataclass(frozen=True)
class Cfg:
    """``bn`` rows a program, ``bk`` columns a step (dividing 1024), ``warps``."""

    bn: int = 8
    bk: int = 256
    warps: int = 4


# 8 x 256 with 2 warps: one run a thread in the escape pass (4 warps would hold each run twice)
DEFAULTS = {UNPACK: Cfg(8, 256, 2), HOT: Cfg(8, 256, 2), FOLD: Cfg(8, 256, 2), GEMV: Cfg(16, 256, 4),
            GEMV_HOT: Cfg(16, 256, 4)}
#: the second tile of each mode the probe times: a larger step, which the static SASS says halves
#: the per-weight cost of a step's escape bookkeeping (scan, max, conversions)
LARGE = {UNPACK: Cfg(16, 512, 4), HOT: Cfg(16, 512, 4), FOLD: Cfg(16, 512, 4), GEMV: Cfg(32, 256, 4),
         GEMV_HOT: Cfg(32, 256, 4)}


#: the config of every launch, in order (the probe checks a variant ran with the tile its name says)
LAUNCHED: list[Cfg] = []


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 2**32 if v >= 2**31 else v


class Prepared:
    """What a launch needs of one candidate matrix (host work once, as ``dense11``'s ``prepare``)."""

    def __init__(self, a: dict[str, torch.Tensor], shape: tuple[int, int], layout: str) -> None:
        n, k = shape
        kp = a["sm"].shape[1]
        if k != kp:
            raise ValueError(f"the probe kernels need K % 64 == 0, got K = {k}")
        self.a, self.shape, self.layout, self.kp = a, shape, layout, kp
        self.nbr = (kp + 1023) // 1024
        self.nesc = 8 * int(a["esc"].numel())  # slots; ranks never reach the padding (the codes say so)
        base = int(a["base"][0])
        dev = a["sm"].device
        self.sm32 = a["sm"].view(torch.int32)
        self.etab = torch.cat([a["etab"].to(torch.int32), torch.zeros(1, dtype=torch.int32, device=dev)])
        ph = (base + 7) & 0xFF
        lut_hi = [((base + c) & 0xFF) >> 1 for c in range(8)]
        lut_lo = [(((base + c) & 0xFF) & 1) << 7 for c in range(8)]
        word = lambda v: _i32(sum(b << (8 * i) for i, b in enumerate(v)))  # noqa: E731
        self.scalars = (_i32((base & 0x7F) * 0x01010101), _i32((base & 0x80) * 0x01010101), ph,
                        word(lut_hi[:4]), word(lut_hi[4:]), word(lut_lo[:4]), word(lut_lo[4:]))
        idx = a["exc_idx"].to(torch.int64)
        self.rowptr = torch.searchsorted(idx, torch.arange(n + 1, device=dev, dtype=torch.int64) * k).to(torch.int32)
        self.eidx = idx
        sm = a["sm"].reshape(-1)[idx].to(torch.int32)
        self.exc_vals = (((sm & 0x80) << 8) | (a["exc_exp"].to(torch.int32) << 7) | (sm & 0x7F)).to(torch.int16)


# unpack: arrays [N, K] -> out bf16 [N, K]; hot / fold: -> out int32 [N / bn, blocks]; gemv1: x bf16 [K] -> out bf16 [N]
def launch(prep: Prepared, mode: int, out: torch.Tensor, x: torch.Tensor | None = None, cfg: Cfg | None = None,
           hw: bool | None = None) -> torch.Tensor:
    cfg = cfg or DEFAULTS[mode]
    LAUNCHED.append(cfg)
    n, k = prep.shape
    a = prep.a
    if n % cfg.bn or prep.kp % cfg.bk or 1024 % cfg.bk:
        raise ValueError(f"probe shapes only: N % {cfg.bn} and Kp % {cfg.bk} must be 0 (got {n} x {prep.kp})")
    if mode == UNPACK:
        if out.shape != (n, k) or out.dtype != torch.bfloat16:
            raise ValueError(f"out must be bf16 [{n}, {k}], got {out.dtype} {tuple(out.shape)}")
        dst = out.view(torch.int32)
    elif mode >= GEMV:
        if x is None or x.shape != (k,) or x.dtype != torch.bfloat16 or out.shape != (n,):
            raise ValueError(f"gemv1 needs x bf16 [{k}] and out bf16 [{n}]")
        dst = out
    else:
        if out.shape != (n // cfg.bn, prep.nbr) or out.dtype != torch.int32:
            raise ValueError(f"out must be int32 [{n // cfg.bn}, {prep.nbr}], got {out.dtype} {tuple(out.shape)}")
        dst = out
    xh = x if x is not None else out  # unused unless GEMV
    out16 = out.view(torch.int16) if mode == UNPACK else prep.etab
    grid = (n // cfg.bn,) if mode >= GEMV else (n // cfg.bn, prep.nbr)
    hw = (not _interpreting()) if hw is None else hw
    _dense_kernel[grid](a["code"], prep.sm32, a["sm"], a["esc"], a["esc_base"], a["esc_off"], prep.etab,
                        xh.view(torch.int32) if x is not None else prep.sm32, xh, prep.rowptr, prep.eidx,
                        a["exc_exp"], dst, out16, prep.kp, prep.nbr, prep.nesc, *prep.scalars,
                        BN=cfg.bn, BK=cfg.bk, LAYOUT=LAYOUT_IDS[prep.layout], MODE=mode, HW=hw,
                        num_warps=cfg.warps)
    if mode == UNPACK and prep.eidx.numel():
        out.view(torch.int16).view(-1)[prep.eidx] = prep.exc_vals
    return out


def _interpreting() -> bool:
    from glyd.kernels import _common as C

    return C.interpreting()


# ---- references of the same run: fixed12's decode folded, a bf16 read folded -------------------------------


@isolated
@triton.jit
def _fixed12_fold_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, BG: tl.constexpr):
    # fixed12's flat unpack (glyd.kernels.fixed12.unpack) with the stores replaced by an XOR fold of
    # the bf16 pair words (exceptions left at their placeholder); K == Kp, whole programs
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG)[:, None]
    j = tl.arange(0, 32)[None, :]
    base = tl.load(base_ptr).to(tl.int32)
    c = tl.load(code_ptr + g * 32 + j).to(tl.int32)
    la = tl.load(lo_ptr + g * 64 + j).to(tl.int32)
    lb = tl.load(lo_ptr + g * 64 + 32 + j).to(tl.int32)
    na = c & 0xF
    nb = c >> 4
    va = ((((na & 8) << 4) | ((na & 7) + base)) << 8 | la) << (16 * (j & 1))
    vb = ((((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb) << (16 * (j & 1))
    f = tl.xor_sum(tl.xor_sum(va ^ vb, axis=1), axis=0)
    tl.store(out_ptr + tl.program_id(0), f)


@isolated
@triton.jit
def _bf16_fold_kernel(w_ptr, out_ptr, BW: tl.constexpr):
    # a bf16 matrix read as int32 pair words and XOR-folded: the read-only bandwidth reference
    o = tl.program_id(0).to(tl.int64) * BW + tl.arange(0, BW)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(tl.load(w_ptr + o), axis=0))


FIXED12_BG = 16
BF16_BW = 2048


# fixed12 Packed [N, K] (K % 64 == 0, N * K % (64 * BG) == 0) -> out int32 [N * K / (64 * BG)]
def fixed12_fold(p, out: torch.Tensor) -> torch.Tensor:
    a = p.arrays
    ng = p.shape[0] * a["lo"].shape[1] // 64
    if p.shape[1] % 64 or ng % FIXED12_BG or out.shape != (ng // FIXED12_BG,):
        raise ValueError(f"fixed12_fold: probe shapes only, out int32 [{ng // FIXED12_BG}]")
    _fixed12_fold_kernel[(ng // FIXED12_BG,)](a["code"], a["lo"], a["base"], out, BG=FIXED12_BG, num_warps=2)
    return out


# w bf16 [N, K] (N * K % (2 * BW) == 0) -> out int32 [N * K / (2 * BW)]
def bf16_fold(w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    nw = w.numel() // 2
    if w.numel() % (2 * BF16_BW) or out.shape != (nw // BF16_BW,):
        raise ValueError(f"bf16_fold: probe shapes only, out int32 [{nw // BF16_BW}]")
    _bf16_fold_kernel[(nw // BF16_BW,)](w.view(torch.int32), out, BW=BF16_BW, num_warps=4)
    return out
