"""Tiered kernels on adversarial inputs: every tier and the raw escapes dense, units whose 16
weights all escape, blocks that straddle rows, K not a multiple of 64, and every M the fused GEMV
serves (1..16, several activation rows a program). Unpack is compared bit for bit; the fused
GEMV against float64 F.linear with test_linear's tolerance."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import DEVICES, needs_triton, random_weights
from .test_linear import _check

pytestmark = needs_triton


def _tier_weights(n: int, k: int, kind: str) -> torch.Tensor:
    """``deep``: exponents spread evenly over 40 values (tiers 4, 5 and raw on most weights);
    ``runs``: rows alternate between all-common and all-deep stretches of 16 (whole units that
    escape, next to units with none); ``raw``: a third of the weights below every table entry."""
    g = torch.Generator().manual_seed(torch.seed() % 2**63)
    sign = torch.where(torch.rand(n, k, generator=g) < 0.5, -1.0, 1.0)
    mant = 1 + torch.rand(n, k, generator=g)
    if kind == "deep":
        e = torch.randint(-40, 0, (n, k), generator=g)
    elif kind == "runs":
        deep = (torch.arange(k) // 16 % 2 == 1)[None, :] ^ (torch.arange(n) % 2 == 1)[:, None]
        e = torch.where(deep, torch.randint(-35, -8, (n, k), generator=g), torch.randint(-7, -4, (n, k), generator=g))
    else:
        e = torch.where(torch.rand(n, k, generator=g) < 0.33, torch.randint(-120, -60, (n, k), generator=g),
                        torch.randint(-10, -2, (n, k), generator=g))
    return (sign * mant * torch.exp2(e.float())).to(torch.bfloat16)


@pytest.mark.gpu_sample(every=3)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["deep", "runs", "raw"])
@pytest.mark.parametrize("shape", [(5, 1100), (3, 1024), (9, 200), (2, 3000)])
def test_tiered_unpack_dense_tiers(device, kind, shape):
    from glyd import kernels

    w = _tier_weights(*shape, kind)
    p = glyd.pack(w, "tiered")
    out = kernels.unpack(p.to(device))
    assert torch.equal(out.cpu().view(torch.int16), w.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bb,warps", [(1, 1), (2, 2), (4, 4)])
def test_tiered_unpack_tile_shapes(device, bb, warps):
    from glyd.kernels import TieredUnpackConfig
    from glyd.kernels.tiered import unpack as kt

    w = random_weights(7, 1600, "wide")
    out = kt.unpack(glyd.pack(w, "tiered").to(device), None, TieredUnpackConfig(blocks=bb, warps=warps))
    assert torch.equal(out.cpu().view(torch.int16), w.view(torch.int16))


@pytest.mark.cpu_sample(every=3)
@pytest.mark.gpu_sample(every=3)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("kind", ["normal", "deep"])
def test_tiered_fused_gemv_every_m(device, m, kind):
    from glyd import kernels
    from glyd.kernels import TieredGemvConfig, TieredLongConfig

    n, k = (11, 1100) if m % 2 else (6, 2048)
    w = random_weights(n, k, "normal") if kind == "normal" else _tier_weights(n, k, "deep")
    p = glyd.pack(w, "tiered").to(device)
    x = torch.randn(m, k).to(torch.bfloat16).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device)
    chosen = kernels.choose(x, p)[1]
    for cfg in (None, TieredGemvConfig(bb=2, bn=4, mb=2, warps=2), TieredLongConfig()):
        if cfg is not None and cfg == chosen:
            continue  # the default (None) just ran this kernel with this config on the same inputs
        _check(kernels.linear(x, p, bias, cfg), x, w, bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reg_bytes", [0, 252])
def test_tiered_area_paths(device, reg_bytes):
    """Both ways of reading a block's escape digits: area words preloaded in registers (areas up to
    area_reg_bytes) and windows loaded from memory (larger areas; forced here with 0)."""
    from glyd import kernels
    from glyd.kernels import TieredGemvConfig, TieredUnpackConfig

    w = random_weights(6, 2048, "normal")
    w[3] = _tier_weights(1, 2048, "deep")[0]  # some blocks with large areas, some small
    p = glyd.pack(w, "tiered").to(device)
    got = kernels.unpack(p, None, TieredUnpackConfig(area_reg_bytes=reg_bytes))
    assert torch.equal(got.cpu().view(torch.int16), w.view(torch.int16))
    x = torch.randn(3, 2048).to(torch.bfloat16).to(device)
    _check(kernels.linear(x, p, None, TieredGemvConfig(area_reg_bytes=reg_bytes)), x, w, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("damage", ["area_longer", "area_shorter", "base_negative", "offsets_decrease"])
def test_tiered_kernels_refuse_crafted_offsets(device, damage):
    # The kernels read each block's escape area from esc_base/esc_off: offsets from a damaged or
    # crafted file are refused before any kernel reads (they could lead the reads out of 'area').
    from glyd.codec.packed import Packed
    from glyd.errors import CorruptError

    w = _tier_weights(64, 1024, "deep")
    p = glyd.pack(w, "tiered")
    a = {name: t.clone() for name, t in p.arrays.items()}
    if damage == "area_longer":  # the last block claims bytes past the area's end
        a["esc_base"][-1] += 4096
    elif damage == "area_shorter":
        a["esc_base"][-1] -= 1
    elif damage == "base_negative":
        a["esc_base"][0] = -(1 << 20)
    else:
        a["esc_off"][5] = int(a["esc_off"][6]) + 1000
    q = Packed("tiered", p.shape, {name: t.to(device) for name, t in a.items()})
    with pytest.raises(CorruptError, match="esc_base"):
        glyd.kernels.unpack(q)
    x = torch.randn(3, 1024).to(torch.bfloat16).to(device)
    with pytest.raises(CorruptError, match="esc_base"):
        glyd.kernels.linear(x, q)
    with pytest.raises(CorruptError):  # and the CPU reference refuses it too
        glyd.unpack(Packed("tiered", p.shape, a))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bn", [1, 2])
def test_tiered_gemv_an_inf_weight_stays_in_its_row(device, bn):
    # A block's weights of rows outside the program's (and its padding) multiply x's masked zeros, and
    # a row's sum was the block's total minus the other row's: a +inf weight of one row made 0 * inf
    # or inf - inf NaN in the row after it, and a matrix whose commonest exponent is 255 (table[0], the
    # padding's) made every row NaN, while the codec's products were finite there (a packed file as
    # glyd writes it). Rows finite in float64 must be finite and close; inf rows stay inf.
    from glyd import kernels
    from glyd.kernels import TieredGemvConfig

    g = torch.Generator().manual_seed(5)
    w = torch.randn(8, 1100, generator=g).to(torch.bfloat16)  # Kp 1152: blocks straddle rows
    w[1, 1000] = w[4, 1050] = float("inf")  # row 1: in the first row of block 2; row 4: of block 5 (rows 4 and 5)
    nan_rows = torch.full((4, 1000), float("nan")).to(torch.bfloat16)
    nan_rows[0] = 1.0  # table[0] = 255: the padding decodes to +inf
    for w in (w, nan_rows):
        p = glyd.pack(w, "tiered").to(device)
        x = torch.randn(1, w.shape[1], generator=g).to(torch.bfloat16)
        y = kernels.linear(x.to(device), p, None, TieredGemvConfig(bn=bn)).cpu().double()
        ref = x.double() @ w.double().T
        assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf())
        fin = ref.isfinite()
        assert torch.allclose(y[fin], ref[fin], rtol=2e-2, atol=1e-2 * float(ref[fin].abs().max()))


def test_a_direct_gemv_launch_on_rows_shorter_than_an_escape_block_is_named():
    # can_implement refuses rows under one escape block (Kp < 1024): linear never launches it there, but a direct
    # Kernel.launch did, and gave a product 0.47 off at K 64 (the program walks whole blocks of its own rows)
    from glyd.kernels.tiered.gemv import TieredGemvConfig, TieredGemvKernel

    w = (torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    out = torch.full((3, 8), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^tiered_gemv launch: needs rows of at least one escape block \(Kp >= 1024"):
        TieredGemvKernel.launch(torch.ones(3, 64, dtype=torch.bfloat16), glyd.pack(w, "tiered"), None,
                                TieredGemvConfig(), out)
    assert bool((out == 7.0).all())
