"""GlydLinear / GlydEmbedding / merged parts / tied output projection, on the CPU reference path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import glyd
from glyd.nn import (
    GlydEmbedding,
    GlydLinear,
    GlydLinearPart,
    GlydTiedEmbedding,
    GlydTiedLinear,
    PackedWeight,
    set_exact,
    unpack_rows,
)
from glyd.store import key_for

LAYOUTS = ("fixed12", "tiered")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def weights(n: int, k: int, seed: int = 0, adversarial: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    if adversarial:
        v = w.view(-1)
        v[::97] = float("nan")
        v[5::89] = float("-inf")
        v[::53] = (torch.randn(len(v[::53]), generator=g) * 1e30).to(torch.bfloat16)
        v[::71] = (torch.randn(len(v[::71]), generator=g) * 1e-39).to(torch.bfloat16)  # subnormals
        v[3::31] = (torch.randn(len(v[3::31]), generator=g) * 1e4).to(torch.bfloat16)
        v[7::43] = -0.0
    return w


def x_like(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (96, 64), (33, 600), (130, 1100)])
@pytest.mark.parametrize("adversarial", [False, True])
def test_unpack_rows_matches_the_reference_codec(layout, shape, adversarial):
    w = weights(*shape, seed=shape[0], adversarial=adversarial)
    p = glyd.pack(w, layout)
    n = shape[0]
    rows = torch.randint(0, n, (3, 5), generator=torch.Generator().manual_seed(2))
    rows[0, 1] = rows[0, 0]  # a row asked for twice
    rows[2, 4] = n - 1
    got = unpack_rows(p, rows)
    assert got.shape == (3, 5, shape[1]) and got.dtype == torch.bfloat16
    assert torch.equal(bits(got), bits(glyd.unpack(p)[rows]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unpack_rows_every_row_of_an_all_exceptions_matrix(layout):
    # Each row a different exponent range: fixed12's window cannot cover them, tiered escapes deep.
    w = torch.stack([torch.full((70,), 2.0**e) for e in range(-120, 120, 4)]).to(torch.bfloat16)
    w[::2] *= -1
    p = glyd.pack(w, layout)
    rows = torch.arange(w.shape[0]).flip(0)
    assert torch.equal(bits(unpack_rows(p, rows)), bits(w[rows]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_embedding_lookup_is_bit_exact(layout):
    table = weights(300, 72, adversarial=True)
    emb = GlydEmbedding(glyd.pack(table, layout), padding_idx=0)
    ids = torch.tensor([[0, 5, 5, 299], [17, 1, 2, 3]])
    out = emb(ids)
    assert out.shape == (2, 4, 72)
    assert torch.equal(bits(out), bits(F.embedding(ids, table)))
    assert (emb.num_embeddings, emb.embedding_dim, emb.padding_idx) == (300, 72, 0)


def test_scaled_embedding_matches_bf16_scaling():
    table = weights(50, 16)
    scale = torch.tensor(16**0.5)
    emb = GlydEmbedding(glyd.pack(table), scale=scale)
    ids = torch.tensor([1, 2, 49])
    ref = F.embedding(ids, table) * scale.to(torch.bfloat16)
    assert torch.equal(bits(emb(ids)), bits(ref))


def test_a_float_scale_multiplies_as_a_float():
    # BART's family: super().forward(ids) * sqrt(d_model), a Python float; not rounded to bf16 first.
    table, scale = weights(50, 16), 48**0.5
    ids = torch.tensor([1, 2, 49])
    packed = GlydEmbedding(glyd.pack(table))
    for emb in (GlydEmbedding(glyd.pack(table), scale=scale), GlydTiedEmbedding(packed, scale=scale)):
        assert emb.embed_scale == scale
        assert torch.equal(bits(emb(ids)), bits(F.embedding(ids, table) * scale))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_exact_is_bf16_bit_for_bit(layout, with_bias):
    w = weights(48, 80, adversarial=False)
    b = weights(1, 48, seed=5)[0] if with_bias else None
    lin = GlydLinear(glyd.pack(w, layout), b, exact=True)
    x = x_like(3, 80)
    assert torch.equal(bits(lin(x)), bits(F.linear(x, w, b)))
    x3 = x_like(6, 80).view(2, 3, 80)
    assert torch.equal(bits(lin(x3)), bits(F.linear(x3, w, b)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_linear_default_path_is_close_to_fp32(layout):
    w = weights(64, 96)
    lin = GlydLinear(glyd.pack(w, layout))
    x = x_like(5, 96)
    ref = F.linear(x.float(), w.float())
    got = lin(x).float()
    # bf16 output rounding: 2^-8 relative, plus accumulation-order differences of the kernel.
    assert torch.allclose(got, ref, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_merged_parts_agree_with_separate_products(exact, with_bias):
    ws = [weights(32, 64, seed=1), weights(16, 64, seed=2), weights(16, 64, seed=3)]
    bs = [weights(1, n.shape[0], seed=9 + i)[0] for i, n in enumerate(ws)] if with_bias else [None] * 3
    merged = GlydLinear(
        glyd.pack(torch.cat(ws)), torch.cat(bs) if with_bias else None, exact=exact, splits=[32, 16, 16]
    )
    q, k, v = merged.parts()
    assert isinstance(q, GlydLinearPart) and (q.out_features, k.out_features, v.in_features) == (32, 16, 64)
    x = x_like(4, 64)
    outs = [q(x), k(x), v(x)]  # one merged product, read three times
    assert merged._pending is None
    for out, w, b in zip(outs, ws, bs):
        ref = F.linear(x, w, b)
        if exact:
            assert torch.equal(bits(out), bits(ref))
        else:
            assert torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-3)
    # A new input while parts are pending recomputes: never a stale product.
    y = x_like(4, 64, seed=7)
    first = q(x)
    assert torch.equal(bits(k(y)), bits(GlydLinear(glyd.pack(ws[1]), bs[1], exact=exact)(y)))
    assert torch.equal(bits(first), bits(outs[0]))


def test_merged_part_weight_and_bias_are_the_rows():
    ws = [weights(8, 16, seed=1), weights(4, 16, seed=2)]
    merged = GlydLinear(glyd.pack(torch.cat(ws)), torch.arange(12.0).to(torch.bfloat16), splits=[8, 4])
    gate, up = merged.parts()
    assert torch.equal(bits(up.weight.materialize()), bits(ws[1]))
    assert up.bias.tolist() == list(range(8, 12))


def test_splits_must_cover_the_rows():
    with pytest.raises(ValueError, match="splits"):
        GlydLinear(glyd.pack(weights(8, 8)), splits=[4, 3])


def test_state_dict_keys_are_the_store_keys():
    p = glyd.pack(weights(8, 8), "tiered")
    lin = GlydLinear(p, torch.zeros(8, dtype=torch.bfloat16))
    keys = set(torch.nn.ModuleDict({"fc": lin}).state_dict())
    assert keys == {key_for("fc.weight", a) for a in p.arrays} | {"fc.bias"}


def test_packed_weight_metadata_does_not_unpack(monkeypatch):
    w = weights(12, 20)
    lin = GlydLinear(glyd.pack(w))
    calls = []
    real = lin._unpack
    monkeypatch.setattr(lin, "_unpack", lambda: calls.append(1) or real())
    pw = lin.weight
    assert isinstance(pw, PackedWeight)
    assert (pw.dtype, pw.device, tuple(pw.shape), pw.ndim, pw.size(0), pw.numel()) == (
        torch.bfloat16, torch.device("cpu"), (12, 20), 2, 12, 240)
    assert calls == []
    # Used as a tensor, it is the weight bit for bit.
    assert torch.equal(bits(torch.clone(pw)), bits(w))
    assert torch.equal(bits(F.linear(x_like(2, 20), pw)), bits(F.linear(x_like(2, 20), w)))
    assert len(calls) == 2


def test_tied_linear_shares_the_embedding_arrays():
    table = weights(40, 16)
    emb = GlydEmbedding(glyd.pack(table))
    head = GlydTiedLinear(emb, exact=True)
    assert list(head.buffers()) == [] and list(head.parameters()) == []
    x = x_like(3, 16)
    assert torch.equal(bits(head(x)), bits(F.linear(x, table)))
    assert torch.equal(bits(head.weight.materialize()), bits(table))


def test_set_exact_switches_every_product():
    m = torch.nn.Sequential(GlydLinear(glyd.pack(weights(4, 4))), GlydLinear(glyd.pack(weights(4, 4))))
    set_exact(m, True)
    assert all(x.exact for x in m)
    set_exact(m, False)
    assert not any(x.exact for x in m)


def test_packed_is_rebuilt_when_buffers_change():
    lin = GlydLinear(glyd.pack(weights(8, 8)))
    p1 = lin.packed
    assert lin.packed is p1  # cached
    w2 = weights(8, 8, seed=4)
    for a, t in glyd.pack(w2).arrays.items():
        setattr(lin, "weight_glyd_" + a, t)
    assert torch.equal(bits(glyd.unpack(lin.packed)), bits(w2))


def test_rejects_what_is_not_packed():
    with pytest.raises(TypeError, match="Packed"):
        GlydLinear(weights(4, 4))
    with pytest.raises(ValueError, match="bias"):
        GlydLinear(glyd.pack(weights(4, 4)), torch.zeros(3, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_modules(layout):
    w = weights(256, 512, adversarial=True)
    w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))  # finite products to compare
    p = glyd.pack(w, layout).to("cuda")
    x = x_like(4, 512).cuda()
    exact = GlydLinear(p, exact=True)
    assert torch.equal(bits(exact(x)), bits(F.linear(x, w.cuda())))
    fast = GlydLinear(p)
    assert torch.allclose(fast(x).float(), F.linear(x.float(), w.cuda().float()), rtol=2e-2, atol=2e-3)
    emb = GlydEmbedding(p)
    ids = torch.tensor([[0, 3, 3, 255]], device="cuda")
    assert torch.equal(bits(emb(ids)), bits(w.cuda()[ids]))



def test_a_packed_weight_is_indexed_as_its_matrix():
    w = weights(6, 4)
    lin = GlydLinear(glyd.pack(w))
    assert torch.equal(bits(lin.weight[1]), bits(w[1])) and torch.equal(bits(lin.weight[2:4, 1:]), bits(w[2:4, 1:]))
