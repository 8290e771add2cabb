"""The H200 table picks the paths docs/kernels.md's table says it picks, for every M bucket and
matrix kind of a 7B model (the docs and the table must not drift apart)."""

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


def _path(kernel) -> str:
    # the docs' names of the families (docs/kernels.md)
    return {"fixed12_unpack_cublas": "unpack+cuBLAS", "fixed12_gemv": "GEMV", "fixed12_byte_dot": "dot tile",
            "fixed12_word_dot": "tc", "fixed12_operand_dot": "mma", "fixed12_mma_v2": "gluon", "fixed12_wgmma": "wg",
            "fixed12_wgmma_warpspec": "ws"}[kernel.name]


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
    if m > 64:
        return "unpack+cuBLAS"
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


def _choose(m, n, k, gluon, wg, ws):
    from glyd.kernels import registry as R

    from .test_registry import h200

    return R.choose(R.Problem("fixed12", m, n, k, k), h200(gluon, wg, ws))


@pytest.mark.parametrize("gluon,wg,ws", [(False, False, False), (True, False, False), (True, True, False),
                                         (True, True, True)])
@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 255, 256, 2048])
def test_table_paths_match_the_docs(kind, m, gluon, wg, ws):
    n, k = SHAPES[kind]
    kernel, cfg = _choose(m, n, k, gluon, wg, ws)
    path = _path(kernel)
    assert path == _expected(m, kind, gluon, wg, ws), cfg
    merged = kind
    kind = CLASS.get(kind, kind)  # the rest as for the matrix of the same class
    get = lambda name, default=False: getattr(cfg, name, default)  # noqa: E731
    # exceptions in a pass of their own: k/v on the GEMV and tc (beside up to M = 8, after from
    # M = 17), down at M = 1; the Gluon kernel runs one beside it unless exc_tile puts them inside
    kv_pass = m == 1 or (not gluon and (m <= 8 or 16 < m <= 64))
    assert get("exc_pass") == ((kind == "k/v" and kv_pass) or (kind == "down" and m == 1)), cfg
    assert get("exc_after") == (kind == "k/v" and 16 < m <= 64 and not gluon), cfg
    assert (get("exc_tile") or path == "ws") == (path in ("gluon", "wg", "ws")), cfg  # every Gluon entry
    if path == "ws":  # ring 2, three programs an SM under an 80-register cap
        assert cfg.bm == (8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64) and cfg.bn == 64, cfg
        assert (cfg.stages, cfg.waves, cfg.maxnreg) == (2, 3, 80), cfg
    elif path == "wg":  # one MMA in flight but on gate/up and lm_heads at M <= 16; bm 8 on down at M <= 8
        bm = 8 if kind == "down" and m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64
        assert cfg.pipe == (kind == "down" or m > 16) and cfg.bm == bm, cfg
        assert cfg.waves == (4 if kind in ("down", "gate/up") and m <= 16 else 2), cfg
    # the async-copy ring with x in it: k/v at M = 2-16, every Gluon tile from M = 17
    ring = m > 16 or (kind == "k/v" and m > 1)
    if path == "gluon" and ring:
        assert cfg.ring in (2, 3) and cfg.ring_x, cfg
    else:
        assert (get("ring", 1), get("ring_x")) == (1, False), cfg
    if path == "gluon":  # whole K steps of 128 (no padded columns); never off a GPU
        assert k % cfg.bk == 0 and cfg.prefetch
        # down's long K: half the split-K programs; the merged qkv a quarter where it takes the
        # bn 64 tile (M = 1, 3-16)
        qkv = merged == "qkv" and (m == 1 or 3 <= m <= 16)
        assert cfg.waves == (4 if kind == "down" else 2 if qkv else 8), cfg
        # x rows 0-7 only where M <= 8 and the x tile is in registers: gate/up at M = 2-8 (loaded in
        # their step), down at M = 2 (in their step) and 5-8
        rows8 = (kind == "gate/up" and 2 <= m <= 8) or (kind in ("down", "q/o") and m == 2) or (
            kind == "down" and 4 < m <= 8)
        assert cfg.x_rows8 == rows8, cfg
        assert cfg.x_ahead == (not rows8 or (kind == "down" and m > 2)), cfg
    # split-K summed in the kernel: only gate/up's Gluon tile at M = 9-16
    assert get("fixup") == (path == "gluon" and kind == "gate/up" and 8 < m <= 16), cfg
    if path == "tc":  # whole K steps on these shapes: the unmasked path
        assert k % cfg.bk == 0
    if path == "GEMV":  # one decoded tile for 1, 2 or 4 x rows (docs/kernels.md)
        assert cfg.bm == (m if m <= 2 else 4)


def test_table_without_gluon_where_k_is_not_whole_steps():
    assert _choose(8, 3584, 3584 + 64, True, False, False)[0].name == "fixed12_word_dot"
    assert _choose(8, 3584, 3584, True, False, False)[0].name == "fixed12_mma_v2"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU answer")
def test_gluon_not_available_off_a_gpu():
    import torch

    from glyd.kernels import registry as R

    assert "gluon" not in R.Device.of(torch.device("cpu")).features
