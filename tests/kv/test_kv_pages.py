"""The page code: every bf16 bit pattern back exactly, the tiers, the byte accounting, bad input."""

from __future__ import annotations

import pytest
import torch

from glyd.errors import FormatError
from glyd.kv.pages import PageStore, dir_bytes, pack_blocks, unpack_blocks, unpack_blocks_grouped, unpack_blocks_swar

from .conftest import all_bf16_patterns, bits_equal


def roundtrip(x: torch.Tensor) -> dict:
    b = pack_blocks(x)
    y = unpack_blocks(b["sm"], b["dig"], b["top"], b["meta"], b["tail"])
    assert bits_equal(y, x)
    if x.shape[2] % 16 == 0:  # the decode kernels' group-wise algorithms, in torch
        assert bits_equal(unpack_blocks_grouped(b["sm"], b["dig"], b["top"], b["meta"], b["tail"]), x)
        assert bits_equal(unpack_blocks_swar(b["sm"], b["dig"], b["top"], b["meta"], b["tail"]), x)
    return b


def test_swar_decode_at_the_gluon_shape():
    # The Gluon kernel's decode step for step (its twin) at the shape it takes: pages of 64 x 128. Every
    # bit pattern in order (whole groups of raw exponents: ranks up to 15, the kernel's wide path) and
    # shuffled; Gaussian pages with some values scaled far off their channel and some zeroed.
    gen = torch.Generator().manual_seed(7)
    roundtrip(all_bf16_patterns().reshape(8, 64, 128))
    roundtrip(all_bf16_patterns()[torch.randperm(65536, generator=gen)].reshape(8, 64, 128))
    x = torch.randn(4, 64, 128, generator=gen) * torch.exp(2 * torch.randn(1, 1, 128, generator=gen))
    f = torch.rand(x.shape, generator=gen)
    x = x * torch.where(f < 0.02, 2.0**40, torch.where(f < 0.04, 2.0**-40, 1.0))
    x[:, 5] *= 2.0**30
    x[:, 7:9, 16:32] = 0
    b = roundtrip(x.to(torch.bfloat16))
    assert int(b["meta"][:, 3].min()) > 0  # every page has raw exponents


def test_every_bit_pattern():
    gen = torch.Generator().manual_seed(1)
    x = all_bf16_patterns()[torch.randperm(65536, generator=gen)].reshape(16, 64, 64)
    b = roundtrip(x)
    assert int(b["meta"][:, 3].sum()) > 0  # this input reaches the raw-exponent tier
    roundtrip(all_bf16_patterns().reshape(32, 32, 64))  # sorted: whole blocks of one exponent


@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 1e4, 1e30])
def test_random_scales(scale):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 32, 24, generator=gen) * scale).to(torch.bfloat16)
    roundtrip(x)


def test_special_blocks():
    n = torch.full((1, 16, 8), float("nan")).to(torch.bfloat16)
    inf = torch.full((1, 16, 8), float("-inf")).to(torch.bfloat16)
    z = torch.zeros(1, 16, 8, dtype=torch.bfloat16)
    negz = -z
    sub = torch.full((1, 16, 8), 1e-40).to(torch.bfloat16)
    one = torch.ones(1, 16, 8, dtype=torch.bfloat16)
    for x in (n, inf, z, negz, sub, one, torch.cat([n, inf, z, negz, sub, one])):
        b = roundtrip(x)
    # one exponent per channel: everything on tier 1; the tail holds only the column directory (zeros)
    b = roundtrip(one)
    assert b["tail"].tolist() == [0] * dir_bytes(8) and int(b["meta"][0, 1]) == 0


def test_tiers_follow_offsets():
    # channel 0 holds exponents top, top-1, ..., top-11: tiers 1, 2, 3 and the raw tier.
    e = torch.arange(127 + 3, 127 + 3 - 16, -1)
    x = torch.ldexp(torch.ones(16), e - 127).reshape(1, 16, 1).repeat(1, 1, 4).to(torch.bfloat16)
    b = roundtrip(x)
    top = int(b["top"][0, 0])
    assert 130 - 4 <= top <= 130 and torch.all(b["top"] == top)
    off = top - e
    want = [4 * int(((off < 0) | (off >= k)).sum()) for k in (3, 6, 9)]
    assert [int(v) for v in b["meta"][0, 1:]] == want
    assert want[2] > 0  # the raw tier is used


def test_real_like_ratio():
    # Gaussian values with a per-channel scale, as keys have: well under 12 bits a value.
    gen = torch.Generator().manual_seed(3)
    scales = torch.exp(torch.randn(64, generator=gen))
    x = (torch.randn(32, 64, 64, generator=gen) * scales).to(torch.bfloat16)
    st = PageStore(1, 1, 64, page=64)
    st.append(x.reshape(1, 1, 32 * 64, 64))
    assert bits_equal(st.to_bf16(), x.reshape(1, 1, -1, 64))
    assert st.nbytes * 8 / x.numel() < 11.3


@pytest.mark.parametrize("chunks", [[100], [1] * 70, [63, 1, 1, 64, 2], [64, 64], [5, 200, 3]])
def test_store_append_chunks(chunks):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, sum(chunks), 16, generator=gen).to(torch.bfloat16)
    st = PageStore(2, 3, 16, page=64)
    pos = 0
    for c in chunks:
        st.append(x[:, :, pos : pos + c])
        pos += c
        assert st.n_tokens == pos
        assert bits_equal(st.to_bf16(), x[:, :, :pos])
    assert st.n_pages == pos // 64 and st.n_raw == pos % 64


def test_nbytes_counts_arrays():
    x = torch.randn(1, 2, 200, 32).to(torch.bfloat16)
    st = PageStore.from_bf16(x, page=64)
    held = sum(t[:, :, : st.n_pages].numel() * t.element_size() for t in (st.sm, st.dig, st.top, st.meta))
    assert st.nbytes == held + st.tail_len + 2 * 2 * st.n_raw * 32


def test_from_bf16_lens_and_errors():
    x = torch.randn(3, 2, 100, 8).to(torch.bfloat16)
    st = PageStore.from_bf16(x, torch.tensor([100, 1, 64]), page=32)
    assert st.max_len == 100 and st.n_pages == 3
    with pytest.raises(FormatError, match="different lengths"):
        st.to_bf16()
    with pytest.raises(FormatError):
        PageStore.from_bf16(x, torch.tensor([0, 1, 2]))
    with pytest.raises(FormatError, match="bf16"):
        PageStore(1, 1, 8).append(torch.randn(1, 1, 4, 8))
    with pytest.raises(FormatError, match="do not match"):
        PageStore(1, 2, 8).append(torch.randn(1, 1, 4, 8).to(torch.bfloat16))
    with pytest.raises(FormatError, match="multiple of 4"):
        PageStore(1, 1, 6)
    with pytest.raises(FormatError, match="multiple of 4"):
        PageStore(1, 1, 8, page=30)
    with pytest.raises(FormatError):
        pack_blocks(torch.randn(2, 4, 8))
    with pytest.raises(FormatError, match="65,535"):
        PageStore(1, 1, 1024, page=64)


def test_from_bf16_lens_keeps_nan_payloads_in_the_raw_tails():
    # torch.gather on bf16 (CPU) rewrote NaN payloads (0x7fc0 -> 0xffff): the tails are gathered as bits
    x = torch.randn(2, 1, 40, 8).to(torch.bfloat16)
    bits = x.view(torch.int16)
    bits[0, 0, 33, :4] = torch.tensor([0x7FC0, 0x7F81, -0x0040, 0x7F80], dtype=torch.int16)  # NaNs, -NaN, inf
    bits[1, 0, 5, 0] = 0x7FC1
    st = PageStore.from_bf16(x, torch.tensor([40, 9]), page=32)
    assert bits_equal(st.raw[0, :, : 40 - 32], x[0, :, 32:40])
    assert bits_equal(st.raw[1, :, :9], x[1, :, :9])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_pack_matches_cpu():
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([
        all_bf16_patterns()[torch.randperm(65536, generator=gen)].reshape(16, 64, 64),
        (torch.randn(64, 64, 64, generator=gen) * torch.exp(torch.randn(64, generator=gen))).to(torch.bfloat16),
    ])
    cpu = pack_blocks(x)
    gpu = pack_blocks(x.cuda())
    for name in cpu:
        assert torch.equal(cpu[name], gpu[name].cpu()), name
    y = unpack_blocks(*(gpu[n] for n in ("sm", "dig", "top", "meta", "tail")))
    assert bits_equal(y.cpu(), x)
    st = PageStore(2, 4, 64, page=64, device="cuda")
    xs = x[:64].reshape(2, 4, 8 * 64, 64).cuda()
    for i in range(0, xs.shape[2], 37):
        st.append(xs[:, :, i : i + 37])
    assert bits_equal(st.to_bf16().cpu(), xs.cpu())


def test_the_old_names_still_work_with_a_warning():
    # "dense" named three things; the KV names of before 2026-12-03 stay as deprecated aliases
    from glyd.kv import FixedPageStore
    from glyd.kv.attention import padded_bf16, padded_dense

    x = torch.randn(2, 1, 70, 16).to(torch.bfloat16)
    for cls in (PageStore, FixedPageStore):
        with pytest.warns(DeprecationWarning, match="from_bf16"):
            st = cls.from_dense(x, page=32)
        with pytest.warns(DeprecationWarning, match="to_bf16"):
            assert bits_equal(st.dense(), x)
        lens = torch.tensor([70, 33])
        st = cls.from_bf16(x, lens, page=32)
        with pytest.warns(DeprecationWarning, match="padded_bf16"):
            assert bits_equal(padded_dense(st, lens), padded_bf16(st, lens))
