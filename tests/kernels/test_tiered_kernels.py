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
    from glyd.kernels import tiered as kt

    w = random_weights(7, 1600, "wide")
    out = kt.unpack(glyd.pack(w, "tiered").to(device), None, bb, warps)
    assert torch.equal(out.cpu().view(torch.int16), w.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("kind", ["normal", "deep"])
def test_tiered_fused_gemv_every_m(device, m, kind):
    from glyd import kernels
    from glyd.kernels._common import Config

    n, k = (11, 1100) if m % 2 else (6, 2048)
    w = random_weights(n, k, "normal") if kind == "normal" else _tier_weights(n, k, "deep")
    p = glyd.pack(w, "tiered").to(device)
    x = torch.randn(m, k).to(torch.bfloat16).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device)
    for cfg in (None, Config(bm=2, bn=4, bk=1024, dot=False, g=2, warps=2)):
        _check(kernels.linear(x, p, bias, cfg), x, w, bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reg_bytes", [0, 252])
def test_tiered_area_paths(device, reg_bytes, monkeypatch):
    """Both ways of reading a block's escape digits: area words preloaded in registers (areas up to
    REG_AREA_BYTES) and windows loaded from memory (larger areas; forced here with 0)."""
    from glyd import kernels
    from glyd.kernels import tiered as kt

    monkeypatch.setattr(kt, "REG_AREA_BYTES", reg_bytes)
    w = random_weights(6, 2048, "normal")
    w[3] = _tier_weights(1, 2048, "deep")[0]  # some blocks with large areas, some small
    p = glyd.pack(w, "tiered").to(device)
    assert torch.equal(kernels.unpack(p).cpu().view(torch.int16), w.view(torch.int16))
    x = torch.randn(3, 2048).to(torch.bfloat16).to(device)
    _check(kernels.linear(x, p), x, w, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["plain", "normal", "runs", "deep"])
def test_tiered_fast_deep_path(device, kind, monkeypatch):
    """FAST_DEEP (tier-5 exponents placed once a unit when every unit holds at most two): taken on
    normal weights, refused (general path) where units hold many tier-5 or raw escapes."""
    from glyd import kernels
    from glyd.kernels import tiered as kt

    monkeypatch.setattr(kt, "FAST_DEEP", True)
    if kind == "plain":  # no raw escapes: almost every block takes the fast path
        w = (torch.randn(5, 2048) * 0.02).to(torch.bfloat16)
    else:
        w = random_weights(5, 2048, "normal") if kind == "normal" else _tier_weights(5, 2048, kind)
    p = glyd.pack(w, "tiered").to(device)
    assert torch.equal(kernels.unpack(p).cpu().view(torch.int16), w.view(torch.int16))
    x = torch.randn(2, 2048).to(torch.bfloat16).to(device)
    _check(kernels.linear(x, p), x, w, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["plain", "normal", "deep", "raw"])
def test_tiered_sparse_deep(device, kind, monkeypatch):
    """SPARSE_DEEP: ranks >= 8 decoded with a placeholder exponent, then corrected from the derived
    list (unpack: scattered back, bit-exact; GEMV: a correction term)."""
    from glyd import kernels
    from glyd.kernels import tiered as kt
    from glyd.kernels._common import Config

    monkeypatch.setattr(kt, "SPARSE_DEEP", True)
    if kind == "plain":
        w = (torch.randn(7, 1100) * 0.02).to(torch.bfloat16)
    else:
        w = random_weights(7, 1100, "normal") if kind == "normal" else _tier_weights(7, 1100, kind)
    p = glyd.pack(w, "tiered").to(device)
    deep = kt.prepare(p)
    assert deep is kt.prepare(p)  # cached
    ranks8 = set(p.arrays["table"][:8].tolist())
    exps = ((w.view(torch.int16).to(torch.int32) >> 7) & 0xFF).reshape(-1).tolist()
    assert deep.flat.numel() == sum(e not in ranks8 for e in exps) > 0
    assert torch.equal(kernels.unpack(p).cpu().view(torch.int16), w.view(torch.int16))
    for m, cfg in ((1, None), (3, Config(bm=1, bn=4, bk=1024, dot=False, g=4)), (2, Config(bm=2, bn=2, bk=1024, dot=False, g=1))):
        x = torch.randn(m, 1100).to(torch.bfloat16).to(device)
        _check(kernels.linear(x, p, None, cfg), x, w, None)


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
