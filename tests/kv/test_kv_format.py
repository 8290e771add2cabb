"""The KV page layout of docs/format.md, re-derived with plain Python loops and compared byte for byte."""

from __future__ import annotations

import torch

from glyd.kv.pages import pack_blocks

from .conftest import all_bf16_patterns


def spec_pack(block: list[list[int]]) -> dict:
    """docs/format.md "KV cache pages", one block of raw 16-bit words, written out naively."""
    p, d = len(block), len(block[0])
    words = [block[t][c] for t in range(p) for c in range(d)]
    exps = [(w >> 7) & 0xFF for w in words]
    sm = [((w >> 8) & 0x80) | (w & 0x7F) for w in words]

    def cost(off: int) -> int:
        return 2 + 2 * (not 0 <= off < 3) + 2 * (not 0 <= off < 6) + 8 * (not 0 <= off < 9)

    top = []
    for c in range(d):
        col = [exps[t * d + c] for t in range(p)]
        best = None
        for s in range(5):
            cand = max(max(col) - s, 0)
            bits = sum(cost(cand - e) for e in col)
            if best is None or bits < best[0]:
                best = (bits, cand)
        top.append(best[1])
    d1 = []
    for i, e in enumerate(exps):
        off = top[i % d] - e
        d1.append(off if 0 <= off < 3 else 3)
    # The tiers list values in stream order: W = d // 16 columns of 16-value groups (1 when d % 16),
    # column by column, each column's groups top to bottom, each group's 16 values in order.
    w = d // 16 if d % 16 == 0 else 1
    rows = p * d // (16 * w)
    order = [(r * w + c) * 16 + j for c in range(w) for r in range(rows) for j in range(16)]
    tier2, tier3, tier4 = [], [], []
    cols = []  # per column: values in tiers 2, 3, 4 before it
    for k, i in enumerate(order):
        if k % (rows * 16) == 0:
            cols.append((len(tier2), len(tier3), len(tier4)))
        e = exps[i]
        off = top[i % d] - e
        if 0 <= off < 3:
            continue
        if 0 <= off - 3 < 3:
            tier2.append(off - 3)
            continue
        tier2.append(3)
        if 0 <= off - 6 < 3:
            tier3.append(off - 6)
            continue
        tier3.append(3)
        tier4.append(e)
    directory = [b for c in cols for n in c for b in (n & 0xFF, n >> 8)]
    directory += [0] * ((-len(directory)) % 4)

    def digits_to_bytes(ds: list[int], words: bool) -> list[int]:
        n = 4 * ((len(ds) + 15) // 16) if words else (len(ds) + 3) // 4  # tail tiers: whole 32-bit words
        out = [0] * n
        for k, v in enumerate(ds):
            out[k // 4] |= v << (2 * (k % 4))
        return out

    raw = tier4 + [0] * ((-len(tier4)) % 4)  # padded to a multiple of 4 bytes
    return {
        "sm": sm, "dig": digits_to_bytes(d1, False), "top": top,
        "n": (len(tier2), len(tier3), len(tier4)),
        "tail": directory + digits_to_bytes(tier2, True) + digits_to_bytes(tier3, True) + raw,
    }


def test_layout_matches_spec():
    gen = torch.Generator().manual_seed(11)
    pats = all_bf16_patterns()
    blocks = [
        pats[torch.randint(0, 65536, (16 * 8,), generator=gen)].reshape(16, 8),
        (torch.randn(16, 8, generator=gen) * torch.exp(2 * torch.randn(8, generator=gen))).to(torch.bfloat16),
        torch.randn(16, 8, generator=gen).mul(1e-3).to(torch.bfloat16),
    ]
    blocks32 = [  # head dim 32: two columns of groups, so the stream order differs from the natural one
        pats[torch.randint(0, 65536, (8 * 32,), generator=gen)].reshape(8, 32),
        (torch.randn(8, 32, generator=gen) * torch.exp(2 * torch.randn(32, generator=gen))).to(torch.bfloat16),
    ]
    check(blocks)
    check(blocks32)


def check(blocks):
    x = torch.stack(blocks)
    got = pack_blocks(x)
    offset = 0
    for j, blk in enumerate(blocks):
        words = (blk.view(torch.int16).to(torch.int32) & 0xFFFF).tolist()
        want = spec_pack(words)
        assert got["sm"][j].reshape(-1).tolist() == want["sm"]
        assert got["dig"][j].tolist() == want["dig"]
        assert got["top"][j].tolist() == want["top"]
        assert got["meta"][j].tolist() == [offset, *want["n"]]
        n = len(want["tail"])
        assert got["tail"][offset : offset + n].tolist() == want["tail"]
        offset += n
    assert got["tail"].numel() == offset
