"""The fixed-rate KV page code kvf12 (glyd.kv.fixed): layout against docs/format.md, golden bytes,
every bf16 pattern, adversarial and crafted pages, the page store."""

from __future__ import annotations

import pytest
import torch

from glyd.errors import CorruptError, FormatError
from glyd.kv.attention import padded_bf16
from glyd.kv.fixed import NAME, VERSION, FixedPageStore, block_bytes, pack_blocks, unpack_blocks

from .conftest import all_bf16_patterns, bits_equal

PLANES = ("lo", "code", "base", "meta", "exc")


def unpack(b: dict) -> torch.Tensor:
    return unpack_blocks(*(b[k] for k in PLANES))


def spec_pack(block: list[list[int]]) -> dict:
    """docs/format.md "KV cache pages, fixed-rate code", one block of raw 16-bit words, written out naively."""
    p, d = len(block), len(block[0])
    hi7 = [[(w >> 8) & 0x7F for w in row] for row in block]
    base = []
    for g in range((d + 15) // 16):
        vals = [hi7[t][c] for t in range(p) for c in range(16 * g, min(16 * g + 16, d))]
        cover = [sum(b <= v < b + 8 for v in vals) for b in range(121)]
        base.append(cover.index(max(cover)))
    codes, exc = [], []
    for t in range(p):
        row = []
        for c in range(d):
            w, off = block[t][c], hi7[t][c] - base[c // 16]
            inside = 0 <= off < 8
            row.append((w >> 15) << 3 | (off if inside else 0))
            if not inside:
                exc.append((t * d + c) | (w << 16))
        codes.append(row)
    return {
        "lo": [w & 0xFF for row in block for w in row],
        "code": [codes[t][j] | codes[t][j + d // 2] << 4 for t in range(p) for j in range(d // 2)],
        "base": base,
        "exc": [e - (1 << 32) if e >= 1 << 31 else e for e in exc],  # as int32
    }


def words(x: torch.Tensor) -> list[list[int]]:
    return (x.view(torch.int16).to(torch.int32) & 0xFFFF).tolist()


def test_layout_matches_spec():
    gen = torch.Generator().manual_seed(3)
    pats = all_bf16_patterns()
    blocks = [
        pats[torch.randint(0, 65536, (8 * 24,), generator=gen)].reshape(8, 24),  # two groups, the last short
        (torch.randn(8, 24, generator=gen) * torch.exp(3 * torch.randn(24, generator=gen))).to(torch.bfloat16),
        torch.randn(8, 24, generator=gen).mul(1e-3).to(torch.bfloat16),
    ]
    got = pack_blocks(torch.stack(blocks))
    start = 0
    for j, blk in enumerate(blocks):
        want = spec_pack(words(blk))
        assert got["lo"][j].reshape(-1).tolist() == want["lo"]
        assert got["code"][j].reshape(-1).tolist() == want["code"]
        assert got["base"][j].tolist() == want["base"]
        assert got["meta"][j].tolist() == [start, len(want["exc"])]
        assert got["exc"][start : start + len(want["exc"])].tolist() == want["exc"]
        start += len(want["exc"])
    assert got["exc"].numel() == start


def golden_block() -> torch.Tensor:
    """4 tokens x 8 channels: ones, halves, -2, a tiny value, +-0, inf, NaN and a denormal."""
    vals = [[1.0, -1.0, 0.5, 2.0, -0.25, 3.0, 1.5, -8.0],
            [0.0, -0.0, float("inf"), float("nan"), 1e-40, 1.0, 1.0, 1.0],
            [1e-20, 4.0, -4.0, 0.125, 1.0, 1.0, 1.0, 1.0],
            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 65504.0]]
    return torch.tensor(vals, dtype=torch.float32).to(torch.bfloat16)


def test_golden_bytes():
    # kvf12 version 1, pinned: a change here is a new layout version (docs/format.md).
    assert (NAME, VERSION) == ("kvf12", 1)
    b = pack_blocks(golden_block()[None])
    assert bytes(b["lo"].reshape(-1).tolist()).hex() == (
        "808000008040c000000080ff018080803d808000808080808080808080808080")
    assert bytes(b["code"].reshape(-1).tolist()).hex() == "c56d55f60058505850565e5455555505"
    assert b["base"].tolist() == [[58]]  # exponent>>1 of 58..65 (0.125 .. 15.9): the lowest of the best windows
    assert b["meta"].tolist() == [[0, 7]]
    assert [hex(e & 0xFFFFFFFF) for e in b["exc"].tolist()] == [  # index | word << 16
        "0x8", "0x80000009", "0x7f80000a", "0xffff000b", "0x1000c", "0x1e3d0010", "0x4780001f"]
    assert bits_equal(unpack(b)[0], golden_block())


@pytest.mark.parametrize("p,d", [(64, 64), (16, 128), (4, 8), (32, 24)])
def test_every_bf16_pattern(p, d):
    x = all_bf16_patterns()
    x = torch.cat([x, x[: (-x.numel()) % (p * d)]]).reshape(-1, p, d)
    b = pack_blocks(x)
    assert bits_equal(unpack(b), x)
    # shuffled so that windows see mixed exponents, then grouped by exponent so most values fit
    g = torch.Generator().manual_seed(p * d)
    xs = x.reshape(-1)[torch.randperm(x.numel(), generator=g)].reshape(x.shape)
    assert bits_equal(unpack(pack_blocks(xs)), xs)


def test_adversarial_values():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 64, 16, generator=gen).to(torch.bfloat16)
    x[0] = float("nan")
    x[1] = -0.0
    x[2, ::2] = float("inf")
    x[2, 1::2] = float("-inf")
    x[3] = (torch.randint(1, 128, (64, 16), generator=gen, dtype=torch.int16)).view(torch.bfloat16)  # denormals
    x[4].view(torch.int16)[:] = torch.arange(1024, dtype=torch.int16).reshape(64, 16) * 64 - 32768  # every exponent
    b = pack_blocks(x)
    assert bits_equal(unpack(b), x)
    assert b["meta"][4, 1] > 900  # about 15 in 16 values of block 4 are exceptions


def test_a_page_where_every_value_is_an_exception():
    # No writer makes it (the best window holds some values), but it is a valid page: read exactly.
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 16, 32, generator=gen).to(torch.bfloat16)
    b = pack_blocks(x)
    w = x.view(torch.int16).to(torch.int32).reshape(-1) & 0xFFFF
    b["code"] = (b["code"] & 0x88)  # every code: its sign, offset 0
    b["exc"] = (torch.arange(16 * 32, dtype=torch.int32) | (w << 16)).to(torch.int32)
    b["meta"] = torch.tensor([[0, 16 * 32]], dtype=torch.int32)
    assert bits_equal(unpack(b), x)


def crafted():
    x = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    x[1, 3, 5] = 0.0
    x[1, 9, 2] = 1e-30
    return pack_blocks(x)


@pytest.mark.parametrize("damage, match", [
    (lambda b: b["base"].fill_(121), "base"),
    (lambda b: b["meta"].__setitem__((1, 0), 5), "outside the exception stream"),
    (lambda b: b["meta"].__setitem__((1, 1), -1), "outside the exception stream"),
    (lambda b: b["meta"].__setitem__((0, 1), 16 * 16 + 1), "exception"),
    (lambda b: b["meta"].__setitem__((1, 0), -2), "outside the exception stream"),
    (lambda b: b["exc"].__setitem__(0, 256), "outside a 16x16 block"),
    (lambda b: b["exc"].__setitem__(1, int(b["exc"][0])), "strictly increasing"),
    (lambda b: b.__setitem__("code", b["code"][:, :, :4]), "code has shape"),
    (lambda b: b.__setitem__("meta", b["meta"].to(torch.int64)), "dtypes"),
    (lambda b: b.__setitem__("exc", b["exc"][None]), "1-D"),
])
def test_crafted_pages_raise(damage, match):
    b = crafted()
    assert b["meta"][:, 1].tolist() == [0, 2]
    damage(b)
    with pytest.raises(CorruptError, match=match):
        unpack(b)


def test_store_across_pages_and_unequal_lengths():
    gen = torch.Generator().manual_seed(8)
    x = (torch.randn(2, 3, 150, 32, generator=gen) * torch.exp(torch.randn(1, 3, 1, 32, generator=gen))).to(torch.bfloat16)
    st = FixedPageStore(2, 3, 32, page=16)
    for a, z in ((0, 1), (1, 17), (17, 40), (40, 41), (41, 150)):  # steps that end on, before and past a page
        st.append(x[:, :, a:z])
        assert bits_equal(st.to_bf16(), x[:, :, :z])
    assert st.n_pages == 9 and st.n_raw == 6
    assert st.nbytes == 2 * 3 * 9 * block_bytes(16, 32) + 4 * st.exc_len + 2 * 3 * 6 * 32 * 2
    lens = torch.tensor([150, 37])
    sl = FixedPageStore.from_bf16(x, lens, page=16)
    pd = padded_bf16(sl, lens)
    for b, n in enumerate(lens.tolist()):
        assert bits_equal(pd[b, :, :n], x[b, :, :n])
    with pytest.raises(FormatError, match="different lengths"):
        sl.to_bf16()
    with pytest.raises(FormatError, match="multiple of 4"):
        FixedPageStore(1, 1, 10)
    with pytest.raises(FormatError, match="65,536"):
        FixedPageStore(1, 1, 1024, page=128)
