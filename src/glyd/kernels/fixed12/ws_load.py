"""The ws tile's (``fixed12.wgmma_warpspec``) TMA warp and its K steps' tile index: a program's global K steps
into the shared-memory ring, each slot (or, with ``WsConfig.halves``, each half of it) once the consumers freed it."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def _ws_tile(g, S, TI, BN: gl.constexpr, BT: gl.constexpr, XO: gl.constexpr = False):
    # global K step g -> (tile, step in the tile, first weight row, first x row); TI tiles of the inner index:
    # x tiles inner (TI the x tiles), or with XO (WsConfig.x_outer) weight tiles inner (TI the weight tiles)
    t = g // S
    if XO:
        return t, g - t * S, (t % TI) * BN, (t // TI) * BT
    else:
        return t, g - t * S, (t // TI) * BN, (t % TI) * BT


@gluon.jit
def _ws_loader(lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0, g1, S, MT, BN: gl.constexpr,
               BT: gl.constexpr, NS: gl.constexpr, NBYTES: gl.constexpr, XO: gl.constexpr = False,
               HV: gl.constexpr = False):
    # the TMA warp: this program's K steps g0..g1 (across tiles) into the ring, each slot once the
    # consumer freed it; NBYTES: the bytes a slot's copies bring (lo, code, two x boxes). HV
    # (WsConfig.halves): mbarriers 2 b and 2 b + 1 guard the words and the first x box, and the second
    for i in range(g1 - g0):
        b = i % NS
        if HV:
            _ws_load_halves(lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0 + i, b, ((i // NS) & 1) ^ 1,
                            S, MT, BN, BT, NBYTES, XO)
        else:
            # a fresh mbarrier counts as having completed the phase before its first: the first
            # NS waits (parity 1) pass at once
            mbarrier.wait(empty.index(b), ((i // NS) & 1) ^ 1)
            _, st, n0, m0 = _ws_tile(g0 + i, S, MT, BN, BT, XO)
            bar = ready.index(b)
            mbarrier.expect(bar, NBYTES)
            tma.async_copy_global_to_shared(lo_desc, [n0, st * 32], bar, lo_s.index(b))
            tma.async_copy_global_to_shared(co_desc, [n0, st * 16], bar, co_s.index(b))
            tma.async_copy_global_to_shared(x_desc, [m0, st * 128], bar, x_s.index(2 * b))
            tma.async_copy_global_to_shared(x_desc, [m0, st * 128 + 64], bar, x_s.index(2 * b + 1))


@gluon.jit
def _ws_load_halves(lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g, b, ph, S, MT, BN: gl.constexpr,
                    BT: gl.constexpr, NBYTES: gl.constexpr, XO: gl.constexpr):
    # WsConfig.halves: global step g into slot b, the words and the first x box once the slot's last
    # first half is free (mbarriers 2 b), the second x box once its second half is (2 b + 1)
    _, st, n0, m0 = _ws_tile(g, S, MT, BN, BT, XO)
    mbarrier.wait(empty.index(2 * b), ph)
    bar = ready.index(2 * b)
    mbarrier.expect(bar, NBYTES - BT * 128)
    tma.async_copy_global_to_shared(lo_desc, [n0, st * 32], bar, lo_s.index(b))
    tma.async_copy_global_to_shared(co_desc, [n0, st * 16], bar, co_s.index(b))
    tma.async_copy_global_to_shared(x_desc, [m0, st * 128], bar, x_s.index(2 * b))
    mbarrier.wait(empty.index(2 * b + 1), ph)
    bar = ready.index(2 * b + 1)
    mbarrier.expect(bar, BT * 128)
    tma.async_copy_global_to_shared(x_desc, [m0, st * 128 + 64], bar, x_s.index(2 * b + 1))
