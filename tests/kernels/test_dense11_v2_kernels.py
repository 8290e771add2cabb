"""dense11 format version 2 kernels (``glyd.kernels.dense11.unpack_v2`` / ``gemv_v2``): the unpack bit for
bit against the codec (every pattern, odd shapes, runs of 0-32 escapes, real-like matrices with
exceptions), the GEMV for M = 1-100 against float64 with test_linear's tolerance (FMA and ``tl.dot``
paths, 16, 32 and 64 x rows a decode, bias, K splits), the registry's choice by format version and
M, configs, hostile arrays refused before a kernel reads them. CPU: Triton's interpreter; the
gpu-marked twins run the inline PTX."""

from __future__ import annotations

import functools

import pytest
import torch

import glyd
from glyd.codec import dense11_v2 as V
from glyd.codec.dense11 import pack_v1, pack_v2, pack_v3
from glyd.errors import CorruptError

from .conftest import DEVICES, cpu_sampled, needs_triton
from .test_linear import _check

pytestmark = needs_triton


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int16)


def _weights(n: int, k: int, seed: int, kind: str = "normal") -> torch.Tensor:
    """``normal``: std 0.02 with 20 far exponents (exceptions); ``wide``: exponents over ~20 values
    (many escapes, crowded runs, table digits and exceptions); ``crowded``: normal rows with runs of
    8, 9, 12, 20 and 32 escapes (ranks 8 and up: exceptions)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    if kind == "wide":
        w = w * torch.exp2(torch.randn(n, k, generator=g) * 3)
    if n * k:
        pick = torch.randint(0, n * k, (20,), generator=g)
        w.view(-1)[pick] = torch.exp2(-torch.arange(60, 80, dtype=torch.float32))
    if kind == "crowded":
        for r, c in zip(range(n), (8, 9, 12, 20, 32)):
            w[r, :c] = 3.0 + torch.rand(c, generator=g)  # escapes of a table exponent: a run of c
    return w.to(torch.bfloat16)


def _unpack(p, device):
    from glyd.kernels.dense11 import unpack_v2

    return unpack_v2.unpack(p.to(device))


@pytest.mark.parametrize("device", DEVICES)
def test_unpack_every_pattern(device):
    w = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(32, 2048)
    p = pack_v2(w)
    assert p.version == 2 and p.arrays["exc_idx"].numel() > 0
    assert torch.equal(_bits(_unpack(p, device)), _bits(w))


@pytest.mark.parametrize("device", DEVICES)
# interpreter time: half the shapes in the default CPU run, but for (2, 1) (K 1); the default run leaves out shapes 1,
# 4, 7 and 8 (odd K is shape 2 and 6's, whole tiles shape 9's, ragged rows shape 0 and 3's, blocks past one 2 and 5's)
@pytest.mark.parametrize("shape,kind", cpu_sampled([
    ((5, 70), "normal"), ((3, 1100), "wide"), ((1, 2049), "wide"), ((17, 64), "normal"), ((9, 33), "wide"),
    ((6, 1030), "crowded"), ((2, 1), "normal"), ((40, 96), "crowded"), ((16, 1024), "crowded"), ((8, 512), "wide"),
], 2, keep={6}))
def test_unpack_shapes(device, shape, kind):
    w = _weights(*shape, seed=sum(shape), kind=kind)
    p = pack_v2(w)
    assert torch.equal(_bits(_unpack(p, device)), _bits(w))
    if kind == "crowded":
        assert p.arrays["exc_idx"].numel() >= (9 - 8) + (12 - 8) + (20 - 8) + (32 - 8)


@pytest.mark.parametrize("device", DEVICES)
def test_unpack_through_the_layout_and_configs(device):
    from glyd import kernels
    from glyd.kernels.dense11.unpack import Dense11UnpackConfig
    from glyd.kernels.dense11.versions import unpack as layout_unpack
    from glyd.kernels.dense11.unpack_v2 import Dense11V2UnpackConfig

    w = _weights(9, 1030, seed=1, kind="wide")
    p = pack_v2(w).to(device)
    assert torch.equal(_bits(kernels.unpack(p)), _bits(w))
    out = torch.empty(9, 1030, dtype=torch.bfloat16, device=device)
    assert layout_unpack(p, out, Dense11UnpackConfig(rows=4, bk=1024, warps=2)) is out
    assert torch.equal(_bits(out), _bits(w))
    assert torch.equal(_bits(layout_unpack(p, None, Dense11V2UnpackConfig(rows=16, bk=64, warps=4))), _bits(w))
    with pytest.raises(ValueError, match="out must be"):
        layout_unpack(p, torch.empty(9, 1029, dtype=torch.bfloat16, device=device))
    assert torch.equal(_bits(kernels.unpack(pack_v1(w).to(device))), _bits(w))  # version 1: its own kernel


@pytest.mark.parametrize("device", DEVICES)
# interpreter time: half the cases in the default CPU run, but for cfg 1 (split 1), 6 (mb 8) and 9 (M 1's unmasked
# path); the default run leaves out cfg 4 (cfg 11's shape with the tile dot, as cfg 2 and 10) and 13 (the lanes dot
# on whole tiles: the lanes dot is cfg 11 and 12's, whole tiles cfg 9 and 10's)
@pytest.mark.parametrize("m,n,k,kind,cfg", cpu_sampled([
    (1, 24, 70, "normal", {}), (1, 40, 1100, "crowded", {"split": 1}), (2, 20, 1100, "wide", {"split": 2}),
    (5, 16, 256, "normal", {"bk": 64}), (16, 33, 200, "crowded", {}), (3, 7, 2100, "wide", {"bk": 512}),
    (19, 5, 130, "normal", {"mb": 8}), (4, 1, 97, "wide", {"mb": 1}), (8, 18, 1024, "wide", {"bn": 32, "warps": 8}),
    (1, 32, 1024, "crowded", {}), (2, 32, 512, "wide", {}),  # whole tiles: the unmasked path
    (16, 33, 200, "crowded", {"dot": "lanes"}), (2, 20, 1100, "wide", {"split": 2, "dot": "lanes"}),
    (5, 32, 1024, "wide", {"dot": "lanes"}),
], 2, keep={1, 6, 9}))
# (K 1100 at split 1: two blocks in one split, the last ragged, as 3000's three at half the interpreter's steps)
def test_gemv(device, m, n, k, kind, cfg):
    from glyd import kernels
    from glyd.kernels.dense11.gemv_v2 import Dense11V2GemvConfig

    w = _weights(n, k, seed=m + n + k, kind=kind)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16) if m % 2 else None
    p = pack_v2(w).to(device)
    y = kernels.linear(x.to(device), p, None if bias is None else bias.to(device), config=Dense11V2GemvConfig(**cfg))
    _check(y, x, w, bias)


@pytest.mark.parametrize("device", DEVICES)
# interpreter time (78 s of a 2-core run, 2026-12-07): a quarter of the cases in the default CPU run, and cfg 2 (M 1,
# ragged N and K in one block: 1.5 s); the default run leaves out cfg 0, 3, 4 and 6 (two blocks in one split with the
# last step past Kp: cfg 5's at M 33, cfg 0's at M 1; M 1's prefetch cfg 1 and 2's; K splits of 2, bk 512 and a last
# split of one column run in the default test_gemv and test_gemv_mid_m, prefetch off)
@pytest.mark.parametrize("m,n,k,kind,cfg", cpu_sampled([
    (1, 40, 1100, "crowded", {"split": 1}), (1, 32, 1024, "crowded", {}), (1, 24, 70, "normal", {}),
    (2, 20, 1100, "wide", {"split": 2}), (3, 7, 2100, "wide", {"bk": 512, "split": 1}),
    (33, 20, 1060, "wide", {"bn": 32, "bk": 128, "split": 1}), (63, 17, 1025, "wide", {"split": 2, "bk": 128}),
], 4, keep={2}))  # (K 1100 / 1060 are two blocks in one split, ragged, the last step past Kp, as 3000 / 2100 were; 1025
# split 2 a last split of one column, as 2049 split 3; N 17 two row tiles, the last ragged, as 24: fewer exceptions)
def test_gemv_prefetch_gives_the_same_bits(device, m, n, k, kind, cfg):
    # the next step's words loaded before a step decodes: one loop over a split's blocks (a block's
    # first rank taken at its first step), the last step re-reading its own words; the same sums
    from glyd import kernels
    from glyd.kernels.dense11.gemv_v2 import Dense11V2GemvConfig

    w = _weights(n, k, seed=m + n + k + 1, kind=kind)
    g = torch.Generator().manual_seed(m + 1)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
    bias = torch.randn(n, generator=g).to(torch.bfloat16).to(device) if m % 2 else None
    p = pack_v2(w).to(device)
    got = kernels.linear(x, p, bias, config=Dense11V2GemvConfig(prefetch=True, **cfg))
    _check(got, x.cpu(), w, None if bias is None else bias.cpu())
    assert torch.equal(_bits(got), _bits(kernels.linear(x, p, bias, config=Dense11V2GemvConfig(**cfg))))


#: M = 17-100 with 32 or 64 x rows a decode (``x_rows``): ragged M, N and K, whole tiles (the unmasked
#: path), K splits, the three product forms, M past one program's rows; bias on the odd M
MID = [
    (17, 24, 300, "wide", {}), (24, 33, 1100, "crowded", {"split": 2}), (32, 32, 512, "wide", {}),
    (33, 20, 1060, "wide", {"bn": 32, "bk": 128}), (48, 16, 256, "crowded", {}),  # (1060: as 2100, 2 blocks)
    (64, 32, 1024, "wide", {"bn": 32, "bk": 128}), (64, 40, 1030, "crowded", {"dot": "tile_wx"}),
    (33, 18, 200, "normal", {"mb": 32}), (40, 16, 600, "wide", {"dot": "lanes"}), (100, 8, 130, "wide", {}),
    # (K 1025 split 2: a last split of one column, as 2049 split 3; N 17: two row tiles, the last ragged, as 24)
    (17, 16, 1024, "crowded", {"dot": "tile_wx", "split": 1}), (63, 17, 1025, "wide", {"split": 2, "bk": 128}),
]


@pytest.mark.parametrize("device", DEVICES)
# interpreter time (71 s of a 2-core run, 2026-12-07): a third of the cases in the default CPU run, and cfg 2 (whole
# tiles), 8 (the lanes dot) and 9 (M past one program's rows); the default run leaves out cfg 0, 1, 3, 4, 5, 7 and 10
# (ragged M, N and K, a K split and bias on an odd M are cfg 11's, tile_wx cfg 6's, 32 x rows a decode cfg 2's, 64
# cfg 6, 9 and 11's, whole tiles cfg 2's)
@pytest.mark.parametrize("m,n,k,kind,cfg", cpu_sampled(MID, 3, keep={2, 8, 9}))
def test_gemv_mid_m(device, m, n, k, kind, cfg):
    from glyd import kernels
    from glyd.kernels.dense11.gemv_v2 import Dense11V2GemvConfig

    w = _weights(n, k, seed=m + n + k, kind=kind)
    p = pack_v2(w)
    assert p.arrays["exc_idx"].numel() > 0  # the exception pass runs for every x row
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16) if m % 2 else None
    y = kernels.linear(x.to(device), p.to(device), None if bias is None else bias.to(device),
                       config=Dense11V2GemvConfig(**cfg))
    _check(y, x, w, bias)


def test_x_rows_a_program():
    from glyd.kernels.dense11.gemv_v2 import x_rows

    got = {(m, mb): x_rows(m, mb) for m in (1, 2, 16, 17, 32, 33, 64, 65) for mb in (1, 8, 16, 32, 64)}
    assert {k: v for k, v in got.items() if v == 1} == {(1, mb): 1 for mb in (1, 8, 16, 32, 64)} | {
        (m, 1): 1 for m in (2, 16, 17, 32, 33, 64, 65)}
    assert [got[m, 64] for m in (2, 16, 17, 32, 33, 64, 65)] == [16, 16, 32, 32, 64, 64, 64]
    assert [got[m, 32] for m in (2, 17, 33, 65)] == [16, 32, 32, 32]
    assert [got[m, mb] for m in (17, 64) for mb in (8, 16)] == [16, 16, 16, 16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,k", [(1, 256), (3, 1100), (33, 300)])
def test_gemv_x_rows_at_odd_strides(device, m, k):
    # x rows that are not bf16 pairs at even offsets: read bf16 by bf16
    from glyd import kernels

    w = _weights(16, k, seed=k, kind="wide")
    x = torch.randn(m, k + 1).to(torch.bfloat16)[:, 1:]
    _check(kernels.linear(x.to(device), pack_v2(w).to(device)), x, w, None)


@pytest.mark.parametrize("device", DEVICES)
def test_registry_picks_by_format_version(device):
    from glyd import kernels

    w = _weights(8, 128, seed=2, kind="wide")
    for p, small in ((pack_v3(w), "dense11_v3_gemv"), (pack_v2(w), "dense11_v2_gemv"), (pack_v1(w), "dense11_gemv")):
        p = p.to(device)
        mid = "dense11_unpack_cublas" if small == "dense11_gemv" else small
        for m, name in ((1, small), (16, small), (40, mid), (64, mid), (65, "dense11_unpack_cublas")):
            x = torch.randn(m, 128).to(torch.bfloat16).to(device)
            assert kernels.choose(x, p)[0].name == name
            _check(kernels.linear(x, p), x.cpu(), w, None)


def test_the_h200_table_decodes_once_for_m_17_to_64():
    # every shape class: the fused GEMV with one program's x rows holding M (one decode of each tile)
    # for version 2, unpack + cuBLAS for version 1 and past M = 64
    from glyd.codec import LAYOUTS
    from glyd.kernels import registry as R
    from glyd.kernels.dense11.gemv_v2 import x_rows

    from .test_registry import h200
    from .test_tables import SHAPES

    for dev in (h200(True, True, True), h200(False, False, False)):
        for cls, shapes in SHAPES.items():
            for n, k in shapes:
                kp = LAYOUTS["dense11"].padded_cols(k)
                for m in (17, 24, 32, 33, 48, 64):
                    kc, cfg = R.choose(R.Problem("dense11", m, n, k, kp, 2), dev)
                    assert kc.name == "dense11_v2_gemv" and x_rows(m, cfg.mb) >= m, (cls, n, k, m, cfg)
                    assert R.choose(R.Problem("dense11", m, n, k, kp, 1), dev)[0].name == "dense11_unpack_cublas"
                assert R.choose(R.Problem("dense11", 65, n, k, kp, 2), dev)[0].name == "dense11_unpack_cublas"


def test_can_implement_and_configs():
    from glyd.kernels.dense11.gemv import Dense11GemvConfig, Dense11GemvKernel
    from glyd.kernels.dense11.gemv_v2 import Dense11V2GemvConfig, Dense11V2GemvKernel
    from glyd.kernels.registry import Device, Problem

    cpu = Device("cpu", "cpu", interpreting=True)
    ok, why = Dense11V2GemvKernel.can_implement(Problem("dense11", 1, 8, 128, 128, 1), cpu, Dense11V2GemvConfig())
    assert not ok and "version 1" in why and "re-save" in why
    ok, why = Dense11GemvKernel.can_implement(Problem("dense11", 1, 8, 128, 128, 2), cpu, Dense11GemvConfig())
    assert not ok and "version 1, not 2" in why
    assert Dense11V2GemvKernel.can_implement(Problem("dense11", 1, 8, 128, 128, 2), cpu, Dense11V2GemvConfig())[0]
    for bad in ({"bn": 8}, {"bk": 32}, {"bk": 2048}, {"mb": 128}, {"mb": 48}, {"mb": 0}, {"split": -1},
                {"split": True}, {"warps": 3}, {"dot": "mma"}, {"dot": "wx"}, {"prefetch": 1}, {"prefetch": "yes"}):
        with pytest.raises(ValueError):
            Dense11V2GemvConfig(**bad)
    for good in ({"mb": 1}, {"mb": 16}, {"mb": 32}, {"mb": 64}, {"dot": "tile_wx"}):
        assert getattr(Dense11V2GemvConfig(**good), next(iter(good))) == next(iter(good.values()))
    assert Dense11V2GemvConfig().mb == 64  # the default decodes once for up to 64 x rows


@pytest.mark.parametrize("device", DEVICES)
def test_hostile_arrays_refused(device):
    from glyd import kernels

    p = pack_v2(_weights(6, 1100, seed=3, kind="crowded"))
    (n, kp), k = p.arrays["sm"].shape, p.shape[1]
    esc_mask = ((V.escape_masks(p.arrays["code"].view(n, kp // 32, 3))[..., None] >> torch.arange(32)) & 1).bool()
    i = int(torch.nonzero(V.ranks(esc_mask)[esc_mask] >= 8)[0])  # the stream's first escape of rank 8 or more
    pos = int(torch.nonzero(esc_mask.reshape(-1))[i])
    assert V.stream_digits(p.arrays["esc"], i + 1)[i] == 15
    esc = p.arrays["esc"].clone()
    esc.view(torch.uint8)[i // 2] &= 0xF0 if i % 2 == 0 else 0x0F  # a table digit (0), its exception dropped
    keep = p.arrays["exc_idx"] != (pos // kp) * k + pos % kp
    rank = dict(p.arrays, esc=esc, exc_idx=p.arrays["exc_idx"][keep].clone(), exc_exp=p.arrays["exc_exp"][keep].clone())
    off = dict(p.arrays, esc_off=p.arrays["esc_off"].clone())
    off["esc_off"][1] = int(off["esc_off"][1]) + 3
    short = dict(p.arrays, esc=p.arrays["esc"][:-1].clone())
    unsorted = dict(p.arrays, exc_idx=p.arrays["exc_idx"].flip(0).clone())
    for arrays, match in ((rank, "rank 8"), (off, "dense11"), (short, "dense11"), (unsorted, "exc_idx")):
        bad = glyd.Packed("dense11", p.shape, arrays, 2).to(device)
        with pytest.raises(CorruptError, match=match):
            kernels.unpack(bad)
        for m in (1, 40):  # the M = 1-16 and the M = 17-64 rows of the table
            with pytest.raises(CorruptError, match=match):
                kernels.linear(torch.zeros(m, 1100, dtype=torch.bfloat16, device=device), bad)


@functools.lru_cache(maxsize=3)
def _large(kind):
    # a 7B-shaped matrix (3584 x 3648, ragged K) and its version 2 pack on the GPU, once a kind for its M groups
    w = _weights(3584, 3584 + 64, seed=4, kind=kind)
    return w, pack_v2(w).to("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# M in groups, one test each (spread over the xdist workers): in one test its kernel builds took 46-82 s
@pytest.mark.parametrize("ms", [(1, 2, 7), (16, 17), (32, 33, 64)])
@pytest.mark.parametrize("kind", ["normal", "wide", "crowded"])
def test_large_on_the_gpu(kind, ms):
    # the inline-PTX paths (prmt, popc, shf) and bf16 dots (mma.sync at 16 and 32 x rows, wgmma at 64)
    # at a model's shape: unpack bit for bit, GEMV at M = 1-64 (the table's choice and the other forms)
    from glyd import kernels

    w, p = _large(kind)
    if ms[0] == 1:
        assert torch.equal(_bits(kernels.unpack(p)), _bits(w))
    from glyd.kernels.dense11.gemv_v2 import Dense11V2GemvConfig

    for m in ms:
        x = torch.randn(m, w.shape[1]).to(torch.bfloat16)
        if m > 16:
            assert kernels.choose(x.cuda(), p)[0].name == "dense11_v2_gemv"
        _check(kernels.linear(x.cuda(), p), x, w, None)
        for cfg in ({"dot": "lanes"}, {"dot": "tile_wx"}, {"bn": 32, "bk": 128}, {"bn": 64, "bk": 64}, {"prefetch": True},
                    {"prefetch": True, "bn": 32, "bk": 128}):
            _check(kernels.linear(x.cuda(), p, config=Dense11V2GemvConfig(**cfg)), x, w, None)


def _exception_list_hostiles(p):
    """(name, arrays) of a dense11 matrix whose exception list is sorted and inside the matrix but not
    its digit-15 escapes: a table digit made 15 with none listed, a window weight and a table-digit
    escape listed (the offsets, stream length and ranks stay valid)."""
    from glyd.codec.dense11 import ESCAPE, codes_of_packed

    a = p.arrays
    (n, kp), k = a["sm"].shape, p.shape[1]
    esc = torch.from_numpy(codes_of_packed(p) == ESCAPE).reshape(-1)
    pos = torch.nonzero(esc).squeeze(1)
    digit = V.stream_digits(a["esc"], pos.numel())
    i = int(torch.nonzero(digit != 15)[0])  # an escape with a table digit, rank 0 in its run
    words = a["esc"].clone()
    words.view(torch.uint8)[i // 2] |= 0x0F if i % 2 == 0 else 0xF0
    flat = lambda q: (q // kp) * k + q % kp  # noqa: E731
    window = int(torch.nonzero(~esc.view(n, kp)[:, :k].reshape(-1))[0])

    def listed(extra: int) -> dict:
        idx = torch.cat([a["exc_idx"].to(torch.int64), torch.tensor([extra])])
        order = idx.argsort()
        exp = torch.cat([a["exc_exp"], torch.tensor([200], dtype=torch.uint8)])
        return dict(a, exc_idx=idx[order].to(a["exc_idx"].dtype), exc_exp=exp[order])

    return [("digit 15 unlisted", dict(a, esc=words)), ("window weight listed", listed(window)),
            ("table digit listed", listed(int(flat(pos[i]))))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_exception_list_must_be_the_digit_15_escapes(device, version):
    # the kernels' preparation checked the list sorted and inside the matrix only: an escape whose digit
    # is 15 with no exception decoded as exponent 0, and a listed window weight was overwritten (unpack)
    # or counted twice (GEMV: its value plus x * (listed - placeholder)); the codec refuses both
    from glyd import kernels

    w = _weights(3, 1100, seed=5, kind="wide")
    p = {1: pack_v1, 2: pack_v2, 3: pack_v3}[version](w)
    x = torch.randn(1, 1100).to(torch.bfloat16).to(device)
    for what, arrays in _exception_list_hostiles(p):
        bad = glyd.Packed("dense11", p.shape, arrays, version)
        with pytest.raises(CorruptError, match="exc_idx"):
            glyd.unpack(bad)
        bad = bad.to(device)
        with pytest.raises(CorruptError, match="exc_idx"):
            kernels.unpack(bad)
        with pytest.raises(CorruptError, match="exc_idx"):
            kernels.linear(x, bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_base_past_the_window_refused(device, version):
    # base 250-255 puts base + 6 past exponent 255: the version-1 kernels added it into the sign bit
    # (no check), version 2's check raised AttributeError (C.CorruptError does not exist)
    from glyd import kernels

    w = _weights(2, 64, seed=6)
    p = {1: pack_v1, 2: pack_v2, 3: pack_v3}[version](w)
    for base in (250, 255):
        bad = glyd.Packed("dense11", p.shape, dict(p.arrays, base=torch.tensor([base], dtype=torch.uint8)), version)
        with pytest.raises(CorruptError, match=f"base {base}"):
            glyd.unpack(bad)
        bad = bad.to(device)
        with pytest.raises(CorruptError, match=f"base {base}"):
            kernels.unpack(bad)
        with pytest.raises(CorruptError, match=f"base {base}"):
            kernels.linear(torch.ones(1, 64, dtype=torch.bfloat16, device=device), bad)
    ok = glyd.Packed("dense11", p.shape, dict(p.arrays, base=torch.tensor([249], dtype=torch.uint8)), version)
    assert torch.equal(_bits(kernels.unpack(ok.to(device))), _bits(glyd.unpack(ok)))  # the window's top: exponent 255


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_strided_arrays_refused_by_name(device, version):
    # an array of the right shape and dtype as a strided view (a column slice of a wider tensor, every
    # other element): the codec reads it right, the kernels read it as one contiguous array (other
    # rows, other digits: wrong weights, no error) before this check
    from glyd import kernels
    from glyd.errors import FormatError

    w = _weights(5, 1100, seed=7, kind="wide")
    p = ({1: pack_v1, 2: pack_v2, 3: pack_v3}[version](w)).to(device)
    x = torch.randn(2, 1100).to(torch.bfloat16).to(device)
    for name in ("sm", "code", "esc", "esc_off", "exc_idx", "exc_exp"):
        t = p.arrays[name]
        big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=device)
        big[..., ::2] = t
        bad = glyd.Packed("dense11", p.shape, dict(p.arrays, **{name: big[..., ::2]}), version)
        assert torch.equal(_bits(glyd.unpack(bad.to("cpu"))), _bits(w))
        with pytest.raises(FormatError, match=f"'{name}' must be contiguous"):
            kernels.unpack(bad)
        with pytest.raises(FormatError, match=f"'{name}' must be contiguous"):
            kernels.linear(x, bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_sm_at_an_unaligned_address(device, version):
    # a contiguous 'sm' starting 1 or 2 bytes into its storage (a view of a byte buffer): the codec reads
    # it; versions 2 and 3's kernels read sm as 32-bit words and raised torch's RuntimeError (a Byte
    # tensor's storage_offset must be divisible by 4 to view it as Int) from inside their launchers
    from glyd import kernels
    from glyd.errors import FormatError

    w = _weights(3, 1100, seed=8, kind="wide")
    p = ({1: pack_v1, 2: pack_v2, 3: pack_v3}[version](w)).to(device)
    x = torch.randn(1, 1100).to(torch.bfloat16).to(device)
    sm = p.arrays["sm"]
    for off in (1, 2):
        buf = torch.zeros(sm.numel() + 4, dtype=torch.uint8, device=device)
        bad = glyd.Packed("dense11", p.shape, dict(p.arrays, sm=buf[off:off + sm.numel()].view(sm.shape).copy_(sm)),
                          version)
        assert torch.equal(_bits(glyd.unpack(bad.to("cpu"))), _bits(w))
        if version == 1:  # version 1's kernels read sm byte by byte
            assert torch.equal(_bits(kernels.unpack(bad)), _bits(w))
            continue
        with pytest.raises(FormatError, match="'sm' must start at a 4-byte aligned place"):
            kernels.unpack(bad)
        with pytest.raises(FormatError, match="'sm' must start at a 4-byte aligned place"):
            kernels.linear(x, bad)
    if device == "cpu":  # a storage at an odd address (a memory-mapped shard's tensor, as the store reads it on
        # the CPU): storage offset 0, so the int32 view is allowed, and the interpreter reads it
        raw = bytearray(sm.numel() + 1)
        mapped = torch.frombuffer(raw, dtype=torch.uint8, offset=1, count=sm.numel()).view(sm.shape)
        mapped.copy_(sm)
        assert mapped.data_ptr() % 4 and mapped.storage_offset() == 0
        odd = glyd.Packed("dense11", p.shape, dict(p.arrays, sm=mapped), version)
        assert torch.equal(_bits(kernels.unpack(odd)), _bits(w))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_matrices(device):
    # K = 0 with N a multiple of the unpack's rows made its tile width 0 (ZeroDivisionError building the launch)
    from glyd import kernels

    for n, k in ((0, 0), (8, 0), (16, 0), (0, 64), (3, 0)):
        p = pack_v2(torch.zeros(n, k, dtype=torch.bfloat16)).to(device)
        assert kernels.unpack(p).shape == (n, k)
        y = kernels.linear(torch.ones(2, k, dtype=torch.bfloat16, device=device), p)
        assert y.shape == (2, n) and not bool(y.any())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_unused_bits_of_the_last_escape_word_refused(device, version):
    # the kernels' preparation checked the stream's length only: bits set after its last digit were accepted
    # (no kernel reads them); the format says 0, so they are refused, before any launch, as the codec does
    from glyd import kernels

    w = _weights(3, 1100, seed=5, kind="wide")
    p = {1: pack_v1, 2: pack_v2, 3: pack_v3}[version](w)
    esc = p.arrays["esc"]
    total = int(p.arrays["esc_base"][-1])
    assert total % 8 and esc.numel() == (total + 7) // 8  # the last word has unused bits
    bad_esc = esc.clone()
    bad_esc[-1] = bad_esc[-1] | (1 << (4 * (total % 8)))
    bad = glyd.Packed("dense11", p.shape, dict(p.arrays, esc=bad_esc), version)
    why = "dense11 'esc' word .* has unused bits"
    with pytest.raises(CorruptError, match=why):
        glyd.unpack(bad)
    bad = bad.to(device)
    with pytest.raises(CorruptError, match=why):
        kernels.unpack(bad)
    with pytest.raises(CorruptError, match=why):
        kernels.linear(torch.ones(1, 1100, dtype=torch.bfloat16, device=device), bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("version", [1, 2])
def test_padding_codes_refused(device, version):
    # padding code 6 at base 249 is exponent 255: the codec dropped the padding and accepted it, and the
    # GEMV's 0 * inf made every product NaN; now refused everywhere
    from glyd import kernels
    from glyd.codec.dense11 import planes_of

    w = torch.full((4, 70), 2.0**100).to(torch.bfloat16)
    p = {1: pack_v1, 2: pack_v2, 3: pack_v3}[version](w)
    n, kp = p.arrays["sm"].shape
    codes = torch.zeros(n, kp, dtype=torch.int64)
    codes[:, 70:] = 6
    code = V.words_of(codes.view(n, kp // 32, 32)).view(n, -1) if version == 2 else \
        torch.from_numpy(planes_of(codes.numpy().astype("uint8")))
    bad = glyd.Packed("dense11", p.shape, dict(p.arrays, code=code, base=torch.tensor([249], dtype=torch.uint8)),
                      version)
    with pytest.raises(CorruptError, match="padding"):
        glyd.unpack(bad)
    bad = bad.to(device)
    with pytest.raises(CorruptError, match="padding"):
        kernels.unpack(bad)
    with pytest.raises(CorruptError, match="padding"):
        kernels.linear(torch.full((1, 70), 1e-30, dtype=torch.bfloat16, device=device), bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("w", [2, 8, 32])
def test_m1_row_sum_has_a_fixed_order(device, w):
    # the M = 1 GEMV's last reduction adds flat index 2i + 1 onto 2i, halving until one value is left, whatever
    # the layout (tl.sum's order follows the layout: version 2's and a block-wise order's kernels differed in
    # the last bit on the H200, 2026-12-05). Values over 2^-20 .. 2^20: another order gives other bits
    g = torch.Generator().manual_seed(w)
    x = torch.randn(16, w, 4, generator=g) * torch.exp2(torch.randint(-20, 20, (16, w, 4), generator=g).float())
    out = torch.empty(1, 16, device=device)
    from ._dense11_row_sum import row_sum_kernel

    row_sum_kernel[(1,)](x.to(device), out, BN=16, W=w)
    want = x.reshape(16, 4 * w)
    while want.shape[1] > 1:
        want = want[:, 0::2] + want[:, 1::2]
    assert torch.equal(out.cpu().view(torch.int32), want.reshape(1, 16).view(torch.int32))
    seq = x.reshape(16, 4 * w).double().cumsum(1)[:, -1].float()  # another order (exact, then rounded)
    assert not torch.equal(seq, want.reshape(16)), "the values do not tell orders apart"


def _launchers():
    from glyd.kernels.dense11.gemv import Dense11GemvConfig, Dense11GemvKernel
    from glyd.kernels.dense11.gemv_v2 import (Dense11V2GemvConfig, Dense11V2GemvKernel, Dense11V3GemvConfig,
                                              Dense11V3GemvKernel)
    from glyd.kernels.dense11.unpack_cublas import Dense11LongConfig, Dense11LongKernel

    return {1: (Dense11GemvKernel, Dense11GemvConfig(), pack_v1),
            2: (Dense11V2GemvKernel, Dense11V2GemvConfig(), pack_v2),
            3: (Dense11V3GemvKernel, Dense11V3GemvConfig(), pack_v3),
            "long": (Dense11LongKernel, Dense11LongConfig(), pack_v3)}


@pytest.mark.parametrize("which", [1, 2, 3, "long"])
@pytest.mark.parametrize("m, n, k, kx, why", [
    (1, 4, 0, 0, r"x has shape \(1, 0\) and the packed matrix \[4, 0\]: K = 0 is an empty sum"),
    (2, 4, 0, 0, r"x has shape \(2, 0\) and the packed matrix \[4, 0\]: K = 0 is an empty sum"),
    (0, 4, 64, 64, r"x has shape \(0, 64\) and the packed matrix \[4, 64\]: M = 0 is no x rows"),
    (1, 0, 64, 64, r"x has shape \(1, 64\) and the packed matrix \[0, 64\]: N = 0 is no weight rows"),
    (1, 4, 64, 32, r"x has shape \(1, 32\); the packed matrix is \[4, 64\]: x must be \[M, 64\]"),
    (1, 4, 64, 128, r"x has shape \(1, 128\); the packed matrix is \[4, 64\]: x must be \[M, 64\]"),
], ids=["K0", "K0-M2", "M0", "N0", "x-K-short", "x-K-long"])
def test_a_direct_launch_of_a_shape_it_cannot_run_is_named(which, m, n, k, kx, why):
    # K = 0 raised ZeroDivisionError choosing the K splits (versions 1-3; version 1 at M = 0 too), N = 0 a
    # RuntimeError from a view (version 2), and an x whose K is not the matrix's ran and returned a product of
    # the wrong columns; glyd.kernels.linear guards these, the launchers did not. Refused before any Triton call
    kernel, config, pack = _launchers()[which]
    p = pack(_weights(n, k, seed=7))
    out = torch.full((m, n), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^{kernel.name} launch: {why}"):
        kernel.launch(torch.ones(m, kx, dtype=torch.bfloat16), p, None, config, out)
    assert bool((out == 7.0).all())  # nothing written
    if k == kx:  # what linear gives for the same product: empty, or zeros for K = 0
        from glyd import kernels

        y = kernels.linear(torch.ones(m, kx, dtype=torch.bfloat16), p)
        assert torch.equal(y, torch.zeros(m, n, dtype=torch.bfloat16))


def test_a_direct_launch_still_runs_a_one_by_one_product():
    for which, (kernel, config, pack) in _launchers().items():
        w = torch.tensor([[3.0]], dtype=torch.bfloat16)
        out = kernel.launch(torch.full((1, 1), 2.0, dtype=torch.bfloat16), pack(w), None, config,
                            torch.empty(1, 1, dtype=torch.bfloat16))
        assert out.item() == 6.0, which
