"""`default_config` picks the paths docs/kernels.md's table says it picks, for every M bucket and
matrix kind of a 7B model (the table and the code must not drift apart)."""

from __future__ import annotations

import pytest

from .conftest import needs_triton

pytestmark = needs_triton

# kind: (N, K) of Qwen2.5-7B's matrices ("k/v" is at most 2^22 weights, "small" at most 2^24,
# "tall" K >= 8192 and K > N, "wide" N >= 65536, "big" at least 2^27 weights and not tall), and
# its merged ones: qkv (q/o's class) and gate_up (gate/up's, but big)
SHAPES = {"k/v": (512, 3584), "q/o": (3584, 3584), "gate/up": (18944, 3584), "down": (3584, 18944),
          "lm_head": (152064, 3584), "qkv": (4608, 3584), "gate_up": (37888, 3584)}
CLASS = {"qkv": "q/o", "gate_up": "gate/up"}  # the merged shapes' classes


def _path(cfg) -> str:
    if cfg.long:
        return "unpack+cuBLAS"
    if cfg.ws:
        return "ws"
    if cfg.wg:
        return "wg"
    if cfg.gluon:
        return "gluon"
    if cfg.tc:
        return "tc"
    if cfg.mma:
        return "mma"
    if cfg.group_major and cfg.stages == 1 and cfg.gemv and not cfg.dot:
        return "GEMV"
    return "dot tile"


def _expected(m: int, kind: str, gluon: bool, wg: bool = False, ws: bool = False) -> str:
    if gluon and wg and ws and ((3 <= m <= 64 and kind in ("lm_head", "gate_up")) or (32 < m <= 64 and kind == "gate/up")
                                or (m == 2 and kind == "lm_head")):
        return "ws"
    kind = CLASS.get(kind, kind)
    if gluon and wg and ((3 <= m <= 16 and kind in ("lm_head", "down")) or (4 <= m <= 16 and kind == "gate/up")
                         or (m == 2 and kind == "down")
                         or (16 < m <= 32 and kind in ("gate/up", "lm_head"))
                         or (32 < m <= 64 and kind in ("lm_head", "down", "q/o"))):
        return "wg"
    if gluon and ((m == 2 and kind != "lm_head") or (m == 1 and kind == "q/o") or 3 <= m <= 32
                  or (33 <= m <= 64 and kind in ("k/v", "q/o", "down"))):
        return "gluon"
    if m >= 256:
        return "unpack+cuBLAS"
    if m > 64:
        return "dot tile"
    if m <= 2:
        return "GEMV"
    if m <= 4:
        return "GEMV" if kind in ("k/v", "q/o", "down") else "tc"
    if m <= 8:
        return "GEMV" if kind == "k/v" else "tc"
    if m <= 16:
        return "tc"
    if m <= 32:
        return "mma" if kind == "lm_head" else "tc"
    return "tc"


@pytest.mark.parametrize("gluon,wg,ws", [(False, False, False), (True, False, False), (True, True, False),
                                         (True, True, True)])
@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 255, 256, 2048])
def test_default_config_paths_match_the_docs(kind, m, gluon, wg, ws, monkeypatch):
    from glyd.kernels import fixed12

    monkeypatch.setattr(fixed12, "gluon_available", lambda: gluon)  # as on a GPU with or without Gluon
    monkeypatch.setattr(fixed12, "wg_available", lambda: wg)  # ... and a Hopper GPU (wgmma) or not
    monkeypatch.setattr(fixed12, "ws_available", lambda: ws)  # ... with Gluon's TMA and warp specialization
    n, k = SHAPES[kind]
    cfg = fixed12.default_config(m, n, k)
    assert _path(cfg) == _expected(m, kind, gluon, wg, ws), cfg
    merged = kind
    kind = CLASS.get(kind, kind)  # the rest as for the matrix of the same class
    # exceptions in a pass of their own: k/v on the GEMV and tc (beside up to M = 8, after from
    # M = 17), down at M = 1; the Gluon kernel runs one beside it unless exc_tile puts them inside
    kv_pass = m == 1 or (not gluon and (m <= 8 or 16 < m <= 64))
    assert cfg.exc_pass == ((kind == "k/v" and kv_pass) or (kind == "down" and m == 1)), cfg
    assert cfg.exc_after == (kind == "k/v" and 16 < m <= 64 and not gluon), cfg
    assert cfg.exc_tile == (_path(cfg) in ("gluon", "wg", "ws")), cfg  # every Gluon default since sweep round 18
    if cfg.ws:  # ring 2, three programs an SM under an 80-register cap (sweep rounds 28-29)
        assert cfg.bm == (8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64) and cfg.bn == 64, cfg
        assert (cfg.stages, cfg.waves, cfg.maxnreg) == (2, 3, 80), cfg
    elif cfg.wg:  # one MMA in flight but on gate/up and lm_heads at M <= 16 (sweep round 27)
        # bm 8 on down at M <= 8 (round 27, run 80)
        bm = 8 if kind == "down" and m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64
        assert cfg.pipe == (kind == "down" or m > 16) and cfg.bm == bm, cfg
        assert cfg.waves == (4 if kind in ("down", "gate/up") and m <= 16 else 2), cfg
    # the async-copy ring with x in it: k/v at M = 2-16 (rounds 14, 18 and 22), every Gluon tile
    # from M = 17 (rounds 15 and 17)
    ring = m > 16 or (kind == "k/v" and m > 1)
    if _path(cfg) == "gluon" and ring:
        assert cfg.ring in (2, 3) and cfg.ring_x, cfg
    else:
        assert (cfg.ring, cfg.ring_x) == (1, False), cfg
    if cfg.gluon and not cfg.wg:  # whole K steps of 128 (no padded columns); never off a GPU
        assert k % cfg.bk == 0 and cfg.prefetch
        # down's long K: half the split-K programs (sweep round 20); the merged qkv a quarter
        # where it takes the bn 64 tile (M = 1, 3-16; round 37)
        qkv = merged == "qkv" and (m == 1 or 3 <= m <= 16)
        assert cfg.waves == (4 if kind == "down" else 2 if qkv else 8), cfg
        # x rows 0-7 only where M <= 8 and the x tile is in registers: gate/up at M = 2-8 (loaded in
        # their step), down at M = 2 (in their step) and 5-8 (round 21)
        rows8 = (kind == "gate/up" and 2 <= m <= 8) or (kind in ("down", "q/o") and m == 2) or (
            kind == "down" and 4 < m <= 8)
        assert cfg.x_rows8 == rows8, cfg
        assert cfg.x_ahead == (not rows8 or (kind == "down" and m > 2)), cfg
    # split-K summed in the kernel: only gate/up's Gluon tile at M = 9-16 (sweep rounds 24-26)
    assert cfg.fixup == (cfg.gluon and not cfg.wg and kind == "gate/up" and 8 < m <= 16), cfg
    if cfg.tc:  # whole K steps on these shapes: the unmasked path
        assert k % cfg.bk == 0
    if _path(cfg) == "GEMV":  # one decoded tile for 1, 2 or 4 x rows (docs/kernels.md)
        assert cfg.bm == (m if m <= 2 else 4)


def test_default_config_without_gluon_where_k_is_not_whole_steps(monkeypatch):
    from glyd.kernels import fixed12

    monkeypatch.setattr(fixed12, "gluon_available", lambda: True)
    assert fixed12.default_config(8, 3584, 3584 + 64).tc
    assert fixed12.default_config(8, 3584, 3584).gluon


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU answer")
def test_gluon_not_available_off_a_gpu():
    from glyd.kernels import fixed12

    assert not fixed12.gluon_available()
