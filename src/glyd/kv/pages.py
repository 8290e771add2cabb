"""KV pages: the lossless page code for keys and values (torch ops only: runs on the CPU or the GPU).

A *block* is one page of one sequence and one KV head: ``P`` tokens x ``D`` channels of bf16,
value ``i = t * D + c`` in token-major order. A bf16 word is ``sign | exponent (8) | mantissa (7)``.

* ``sm``   (uint8, P*D): ``sign << 7 | mantissa``, raw.
* ``top``  (uint8, D): per channel, the exponent the digits count down from.
* ``dig``  (uint8, P*D/4): tier-1 digit of value i in bits ``2*(i%4)`` of byte ``i//4``.
  ``off = top[c] - exponent``; digit ``off`` if ``0 <= off < 3``, else 3 (escape).
* the block's *tail* (variable length, in the layer's ``tail`` byte stream at ``meta[0]``, a
  multiple of 4): the column directory (see below), then tier 2 (2-bit digits of the ``n2`` values
  that escaped tier 1, ``4 * ceil(n2/16)`` bytes): digit ``off - 3`` if ``0 <= off - 3 < 3``, else 3;
  then tier 3 (``4 * ceil(n3/16)`` bytes): digit ``off - 6`` if ``0 <= off - 6 < 3``, else 3; then
  tier 4: the raw exponent byte of each of the ``n4`` values that escaped tier 3 (``4 * ceil(n4/4)``
  bytes). Every part starts on a 4-byte boundary, so a reader can take any 16 consecutive digits
  of a tier with two aligned 32-bit loads.
* ``meta`` (int32, 4): tail offset, n2, n3, n4.

Groups, columns, stream order (layout version 2): the 16 values of one 32-bit word of ``dig`` are
a group; a row holds ``W = D/16`` groups (``W = 1`` when ``D % 16``). The tiers list values column
by column (each column's groups top to bottom, each group's values in order: :func:`stream_order`),
and the tail opens with a directory of 3 uint16 a column (the escapes to tiers 2, 3, 4 in the
columns before it). So a group's escapes are consecutive in each tier, from its column's
directory entry plus the escapes of the groups above it in that column: a decoder that holds a
column of groups needs no count from any other column. That is what the kernel does
(:func:`unpack_blocks_grouped` in torch): one 32-bit window of each tier per group, and each
value's place in the window is a count over the values before it in its group.

Why this code (measured on SmolLM2-135M keys and values, 2048 tokens of tinyshakespeare, see
docs/kv.md): exponents of one channel inside one page are narrow (order-0 entropy 2.1 bits for
keys, 2.4 for values, against 2.7 for a per-head table), so a per-(page, head, channel) ``top``
and 2-bit tiers reach 10.68 bits a key and 10.97 a value, 0.667 and 0.685 of bf16.
``top`` is chosen per channel from ``max, max-1, ..., max-4`` to minimise the block's bits.

Every function here works on whole batches of blocks at once with tensor ops, so the GPU packs
pages itself. The one host sync per :func:`pack_blocks` call is reading the total tail size to
grow the stream.
"""

from __future__ import annotations

import torch

from glyd.codec.packed import u16_to_bf16
from glyd.errors import FormatError
from glyd.kv import _swar as swar
from glyd.kv.store import PageStoreBase

#: Tier-1..3 digits cover ``off`` in [0, 3), [3, 6), [6, 9); the rest is a raw exponent byte.
TIER = 3
ESC = 3
#: Candidate ``top`` values tried per channel: ``max_exponent - s`` for s in range(TOP_SEARCH).
TOP_SEARCH = 5
#: Bytes a tail stream keeps readable past its used length (the kernel's two-word window loads).
TAIL_SLACK = 16
#: In-memory page layout version (docs/format.md, "KV cache pages"); pages are never written to disk.
LAYOUT_VERSION = 2


def _cdiv4(n: torch.Tensor) -> torch.Tensor:
    return (n + 3) // 4


def columns(d: int) -> int:
    """Group columns of a block with head dim ``d``: ``d // 16`` (16-value groups tile each row), else 1."""
    return d // 16 if d % 16 == 0 else 1


def dir_bytes(d: int) -> int:
    """Bytes of a block's column directory: 3 uint16 a column, padded to a multiple of 4."""
    return (6 * columns(d) + 3) // 4 * 4


def stream_order(p: int, d: int, device=None) -> torch.Tensor:
    """Natural index ``i = t*D + c`` of each value in *stream order* (the order of the tail's tiers):
    column by column (``W = columns(d)`` columns of 16-value groups), row by row down each column,
    the 16 values of a group in order. With ``W = 1`` this is the natural order."""
    w = columns(d)
    i = torch.arange(p * d, device=device).reshape(p * d // (16 * w), w, 16)
    return i.permute(1, 0, 2).reshape(-1)


def _tier_bytes(n: torch.Tensor) -> torch.Tensor:
    """Bytes of a 2-bit digit tier of ``n`` digits: whole 32-bit words."""
    return 4 * ((n + 15) // 16)


def _bits_cost(off: torch.Tensor) -> torch.Tensor:
    """Bits of the exponent part of each value for a given ``off = top - exponent``."""
    out1 = (off < 0) | (off >= TIER)
    out2 = (off < 0) | (off >= 2 * TIER)
    out3 = (off < 0) | (off >= 3 * TIER)
    return 2 + 2 * out1.to(torch.int32) + 2 * out2.to(torch.int32) + 8 * out3.to(torch.int32)


def _bf16_bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def pack_blocks(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pack ``N`` blocks ``x[N, P, D]`` (bf16) into fixed planes plus one tail byte stream.

    Returns ``sm [N,P,D]``, ``dig [N,P*D/4]``, ``top [N,D]`` (uint8), ``meta [N,4]`` (int32, offsets
    relative to the start of the returned ``tail``) and ``tail`` (uint8, 1-D). All on ``x.device``.

    >>> x = torch.randn(2, 64, 8).to(torch.bfloat16)
    >>> b = pack_blocks(x)
    >>> torch.equal(unpack_blocks(b["sm"], b["dig"], b["top"], b["meta"], b["tail"]).view(torch.int16),
    ...             x.view(torch.int16))
    True
    """
    if x.dtype != torch.bfloat16 or x.dim() != 3:
        raise FormatError(f"KV blocks must be bf16 [N, P, D], got {x.dtype} {tuple(x.shape)}")
    n, p, d = x.shape
    if d % 4:
        raise FormatError(f"KV head dim {d} must be a multiple of 4")
    if p * d > 65535:
        raise FormatError(f"a KV page holds at most 65,535 values (page {p} x head dim {d} is more)")
    bits = _bf16_bits(x)
    e = (bits >> 7) & 0xFF
    sm = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)
    top = _choose_top(e)
    off = top[:, None, :] - e  # [N, P, D]
    d1, d2, d3 = _tier_digits(off), _tier_digits(off - TIER), _tier_digits(off - 2 * TIER)
    tail, meta = _pack_tails(d1, d2, d3, e)
    d1f = d1.reshape(n, p * d // 4, 4)
    dig = d1f[..., 0] | (d1f[..., 1] << 2) | (d1f[..., 2] << 4) | (d1f[..., 3] << 6)
    return {
        "sm": sm,
        "dig": dig.to(torch.uint8),
        "top": top.to(torch.uint8),
        "meta": meta,
        "tail": tail,
    }


def _choose_top(e: torch.Tensor) -> torch.Tensor:
    """``top [N, D]`` for exponents ``e [N, P, D]``: per channel, the one of ``max - s`` (s in
    ``range(TOP_SEARCH)``, clamped at 0) that codes the channel in the fewest bits (ties: the larger)."""
    mx = e.amax(dim=1)  # [N, D]
    best_cost = None
    top = mx
    for s in range(TOP_SEARCH):
        cand = (mx - s).clamp_min(0)
        cost = _bits_cost(cand[:, None, :] - e).sum(dim=1)
        if best_cost is None:
            best_cost, top = cost, cand
        else:
            better = cost < best_cost
            best_cost = torch.where(better, cost, best_cost)
            top = torch.where(better, cand, top)
    return top


def _tier_digits(o: torch.Tensor) -> torch.Tensor:
    """A tier's digit of each value from its offset ``o`` into that tier: ``o`` in [0, TIER), else ESC."""
    return torch.where((o >= 0) & (o < TIER), o, ESC)


def _pack_tails(
    d1: torch.Tensor, d2: torch.Tensor, d3: torch.Tensor, e: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every block's tail (column directory, tiers 2-4), one after the other, from the digits of
    tiers 1-3 and the exponents ``e [N, P, D]``. Returns the tail stream (uint8) and ``meta``."""
    n, p, d = e.shape
    dev = e.device
    # The tiers list their values in stream order (column by column, see stream_order).
    order = stream_order(p, d, dev)
    w = columns(d)
    m1 = (d1 == ESC).reshape(n, p * d)[:, order]
    m2 = m1 & (d2 == ESC).reshape(n, p * d)[:, order]
    m3 = m2 & (d3 == ESC).reshape(n, p * d)[:, order]
    d2s, d3s, es = (t.reshape(n, p * d)[:, order] for t in (d2, d3, e))
    n2, n3, n4 = m1.sum(1), m2.sum(1), m3.sum(1)  # int64 [N]
    # Column directory: for each column, the escapes to tiers 2, 3 and 4 in the columns before it.
    cols = torch.stack([m.reshape(n, w, -1).sum(-1) for m in (m1, m2, m3)], dim=-1)  # [N, W, 3]
    direc = (torch.cumsum(cols, 1) - cols).reshape(n, 3 * w)
    db = dir_bytes(d)
    b2, b3 = _tier_bytes(n2), _tier_bytes(n3)
    size = db + b2 + b3 + 4 * _cdiv4(n4)
    start = torch.cumsum(size, 0) - size  # exclusive prefix sum: each block's tail offset
    total = int(size.sum())  # the one host sync: the tail stream's length
    # One spare slot at the end takes the writes of values that do not belong to a tier.
    acc = torch.zeros(total + 1, dtype=torch.int32, device=dev)
    sink = torch.full_like(start, total)
    dir_b = torch.stack([direc & 0xFF, direc >> 8], dim=-1).reshape(n, 6 * w)  # uint16 little-endian
    acc.index_add_(0, (start[:, None] + torch.arange(6 * w, device=dev)).reshape(-1), dir_b.reshape(-1).to(torch.int32))
    _put_digits(acc, sink, m1, d2s, start + db)
    _put_digits(acc, sink, m2, d3s, start + db + b2)
    r = torch.cumsum(m3.to(torch.int32), 1) - 1
    idx = torch.where(m3, (start + db + b2 + b3)[:, None] + r, sink[:, None])
    acc.index_add_(0, idx.reshape(-1), torch.where(m3, es, 0).reshape(-1).to(torch.int32))
    meta = torch.stack([start, n2, n3, n4], dim=1).to(torch.int32)
    return acc[:total].to(torch.uint8), meta


def _put_digits(
    acc: torch.Tensor, sink: torch.Tensor, mask: torch.Tensor, digits: torch.Tensor, base: torch.Tensor
) -> None:
    """Add the 2-bit ``digits`` of the values in ``mask`` to ``acc``, 4 a byte from byte ``base`` on
    (every other value's write goes to the ``sink`` slot)."""
    r = torch.cumsum(mask.to(torch.int32), 1) - 1
    idx = torch.where(mask, base[:, None] + (r >> 2), sink[:, None])
    val = torch.where(mask, digits << ((r & 3) * 2), 0)
    acc.index_add_(0, idx.reshape(-1), val.reshape(-1).to(torch.int32))


def unpack_blocks(
    sm: torch.Tensor, dig: torch.Tensor, top: torch.Tensor, meta: torch.Tensor, tail: torch.Tensor
) -> torch.Tensor:
    """Decode ``N`` blocks back to bf16 ``[N, P, D]``, bit for bit (``meta[:, 0]`` indexes ``tail``)."""
    n, p, d = sm.shape
    if n == 0:
        return torch.empty(0, p, d, dtype=torch.bfloat16, device=sm.device)
    q = dig.to(torch.int32)
    d1n = torch.stack([q & 3, (q >> 2) & 3, (q >> 4) & 3, (q >> 6) & 3], dim=-1).reshape(n, p * d)
    order = stream_order(p, d, sm.device)
    d1 = d1n[:, order]  # stream order from here on
    mt = meta.to(torch.int64)
    start, n2, n3 = mt[:, 0] + dir_bytes(d), mt[:, 1], mt[:, 2]
    tl_ = tail.to(torch.int32)
    if tl_.numel() == 0:
        tl_ = torch.zeros(1, dtype=torch.int32, device=sm.device)
    last = tl_.numel() - 1

    def gather(mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, tl_[pos.clamp(0, last)], 0)

    m1 = d1 == ESC
    r1 = torch.cumsum(m1.to(torch.int64), 1) - 1
    d2 = (gather(m1, start[:, None] + (r1 >> 2)) >> ((r1 & 3) * 2).to(torch.int32)) & 3
    m2 = m1 & (d2 == ESC)
    r2 = torch.cumsum(m2.to(torch.int64), 1) - 1
    s3 = start + _tier_bytes(n2)
    d3 = (gather(m2, s3[:, None] + (r2 >> 2)) >> ((r2 & 3) * 2).to(torch.int32)) & 3
    m3 = m2 & (d3 == ESC)
    r3 = torch.cumsum(m3.to(torch.int64), 1) - 1
    s4 = s3 + _tier_bytes(n3)
    e4 = gather(m3, s4[:, None] + r3)
    t = top.to(torch.int32).repeat(1, p)[:, order]  # top of each value's channel, stream order
    es = torch.where(~m1, t - d1, torch.where(~m2, t - TIER - d2, torch.where(~m3, t - 2 * TIER - d3, e4)))
    e = torch.empty_like(es)
    e[:, order] = es  # back to the natural order
    s = sm.reshape(n, p * d).to(torch.int32)
    bits = ((s & 0x80) << 8) | ((e & 0xFF) << 7) | (s & 0x7F)
    return u16_to_bf16(bits).reshape(n, p, d)


def _tail_words(tail: torch.Tensor) -> torch.Tensor:
    """The tail byte stream as little-endian 32-bit words (int64), one zero word of slack at the end."""
    t = tail.to(torch.int64)
    pad = (-t.numel()) % 4 + 4
    t = torch.cat([t, torch.zeros(pad, dtype=torch.int64, device=t.device)]).reshape(-1, 4)
    return t[:, 0] | (t[:, 1] << 8) | (t[:, 2] << 16) | (t[:, 3] << 24)


def unpack_blocks_grouped(
    sm: torch.Tensor, dig: torch.Tensor, top: torch.Tensor, meta: torch.Tensor, tail: torch.Tensor
) -> torch.Tensor:
    """:func:`unpack_blocks` computed the way the decode kernel does it (``D`` a multiple of 16).

    Values go in groups of 16 (one 32-bit word of ``dig``), ``W = D/16`` groups a row. A group's
    escapes to tier ``k+1`` are consecutive there, from ``base``: the column directory's start for
    its column plus the escapes of the groups above it in that column. The group reads one 32-bit
    window of the tier (two aligned words, shifted), and value ``j`` takes digit number
    ``(escapes among values 0..j-1 of its group)`` of the window. Tier 4 likewise, byte-wise.
    """
    n, p, d = sm.shape
    if d % 16:
        raise FormatError(f"grouped decoding needs a head dim that is a multiple of 16, got {d}")
    if n == 0:
        return torch.empty(0, p, d, dtype=torch.bfloat16, device=sm.device)
    g = p * d // 16
    b = dig.reshape(n, g, 4).to(torch.int64)
    w = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)  # [n, g]
    sh = 2 * torch.arange(16, device=sm.device)
    words = _tail_words(tail)
    last_word = words.numel() - 1
    mt = meta.to(torch.int64)

    def excl(x: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.cumsum(x, dim) - x

    def window(sw: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        i = (sw[:, None] + (base >> 4)).clamp(0, last_word - 1)
        both = words[i] | (words[i + 1] << 32)
        return (both >> (2 * (base & 15))) & 0xFFFFFFFF

    d1 = (w[..., None] >> sh) & 3  # [n, g, 16]
    f1 = (d1 == ESC).to(torch.int64)
    cw = columns(d)
    rows = g // cw
    tb = tail.to(torch.int64)
    if tb.numel() == 0:
        tb = torch.zeros(1, dtype=torch.int64, device=sm.device)
    # the column directory: escapes to tiers 2/3/4 in the columns before each column
    di = (mt[:, :1] + torch.arange(3 * cw, device=sm.device) * 2).clamp_max(tb.numel() - 2)
    direc = (tb[di] | (tb[di + 1] << 8)).reshape(n, 1, cw, 3)

    def base(cnt: torch.Tensor, k: int) -> torch.Tensor:
        # [n, g]: the column's start plus the escapes in the rows above, in the group's column
        c = cnt.reshape(n, rows, cw)
        return (direc[..., k] + torch.cumsum(c, 1) - c).reshape(n, g)

    s2w = (mt[:, 0] + dir_bytes(d)) // 4
    win2 = window(s2w, base(f1.sum(-1), 0))
    d2 = (win2[..., None] >> (2 * excl(f1, 2))) & 3
    f2 = f1 & (d2 == ESC).to(torch.int64)
    s3w = s2w + (mt[:, 1] + 15) // 16
    win3 = window(s3w, base(f2.sum(-1), 1))
    d3 = (win3[..., None] >> (2 * excl(f2, 2))) & 3
    f3 = f2 & (d3 == ESC).to(torch.int64)
    s4 = 4 * (s3w + (mt[:, 2] + 15) // 16)
    pos = s4[:, None, None] + base(f3.sum(-1), 2)[..., None] + excl(f3, 2)
    e4 = torch.where(f3 == 1, tb[pos.clamp(0, tb.numel() - 1)], 0)
    off = d1 + torch.where(f1 == 1, d2 + torch.where(f2 == 1, d3, 0), 0)
    t = top.to(torch.int64).reshape(n, 1, d // 16, 16).expand(n, p, d // 16, 16).reshape(n, g, 16)
    e = torch.where(f3 == 1, e4, t - off)
    s = sm.reshape(n, g, 16).to(torch.int64)
    bits = ((s & 0x80) << 8) | ((e & 0xFF) << 7) | (s & 0x7F)
    return u16_to_bf16(bits.to(torch.int32)).reshape(n, p, d)


def unpack_blocks_swar(
    sm: torch.Tensor, dig: torch.Tensor, top: torch.Tensor, meta: torch.Tensor, tail: torch.Tensor
) -> torch.Tensor:
    """:func:`unpack_blocks` computed the way the Gluon decode kernel (``glyd.kv._gluon``) does it,
    step for step, in 32-bit words held in int64 tensors (``D`` a multiple of 16): the twin of its
    group decode.

    Per group of 16 values (one word ``w1`` of tier-1 digits, 2 bits a value): the escape flags ``m1``
    (bit ``2j``), each tier's digits put back at their values one escape a step (``w2``, ``w3``), the
    raw flags ``r``; the offsets ``top - exponent`` as nibble sums of the three digit words (even
    values in ``se``, odd in ``so``; 9 marks a raw value); each value's rank among the group's raw
    values as a nibble. Then 4 values at a time in byte lanes: the offsets gathered to bytes, the
    exponent bytes ``top - offset`` without borrows between lanes, raw bytes picked by rank from the
    group's 16-byte raw window and swapped in (``prmt``), and the bf16 words assembled.

    The steps are in ``glyd.kv._swar``, named after the kernel's: ``_dir`` is ``column_bases``,
    ``_stage1`` to ``_stage3`` are ``escape_tiers``, ``_stage4`` (with ``_raw_wide``, ``_quad``) is
    ``group_values``; the word helpers keep the kernel's names without the underscore.
    """
    n, p, d = sm.shape
    if d % 16:
        raise FormatError(f"group decoding needs a head dim that is a multiple of 16, got {d}")
    if n == 0:
        return torch.empty(0, p, d, dtype=torch.bfloat16, device=sm.device)
    dev = sm.device
    g = p * d // 16
    cw = columns(d)
    rows = g // cw
    w1 = swar.words(dig.reshape(n, g * 4))  # [n, g]
    smw = swar.words(sm.reshape(n, g, 16))  # [n, g, 4]: values 4k..4k+3 in word k
    tw = swar.words(top.reshape(n, cw, 16))[:, None].expand(n, rows, cw, 4).reshape(n, g, 4)
    tailw = torch.cat([_tail_words(tail), torch.zeros(8, dtype=torch.int64, device=dev)])  # reads past the end
    mt = meta.to(torch.int64)
    base = swar.column_bases(tail, mt, rows, cw, dev)
    w2, w3, r, b4 = swar.escape_tiers(w1, tailw, mt, base, dir_bytes(d))
    bits = swar.group_values(w1, w2, w3, r, b4, tailw, smw, tw)  # [n, g, 16]
    return u16_to_bf16(bits.to(torch.int32)).reshape(n, p, d)


class PageStore(PageStoreBase):
    """One layer's keys (or values) for ``B`` sequences and ``H`` KV heads, in pages of ``page`` tokens.

    Full pages are packed (``sm``, ``dig``, ``top``, ``meta`` planes indexed ``[b, h, page]`` plus the
    ``tail`` byte stream); the newest ``n_raw`` tokens stay raw bf16 in ``raw`` until a page fills.
    Every sequence holds the same number of tokens (padding included, as in transformers' caches),
    except when built with :meth:`from_bf16` and per-sequence ``lens`` for the decode kernel.
    The rest of the interface is :class:`glyd.kv.store.PageStoreBase`'s.

    >>> st = PageStore(batch=1, heads=2, head_dim=8, page=16, device="cpu")
    >>> x = torch.randn(1, 2, 40, 8).to(torch.bfloat16)
    >>> st.append(x)
    >>> torch.equal(st.to_bf16().view(torch.int16), x.view(torch.int16))
    True
    """

    code_name = "kvtiered"
    PLANES = ("sm", "dig", "top", "meta")
    STREAM_DTYPE = torch.uint8
    STREAM_SLACK = TAIL_SLACK
    STREAM_MIN = 1024
    STREAM_UNIT = "bytes"

    @classmethod
    def check_shape(cls, page: int, head_dim: int) -> None:
        if not isinstance(page, int) or page <= 0 or page % 4:
            raise FormatError(f"page size {page} must be a positive multiple of 4")
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 4:
            raise FormatError(f"head_dim {head_dim} must be a positive multiple of 4")
        if page * head_dim > 65535:  # the column directory counts in uint16 (docs/format.md)
            raise FormatError(f"a KV page holds at most 65,535 values (page {page} x head dim {head_dim} is more)")

    @classmethod
    def plane_specs(cls, head_dim: int, page: int):
        return [("sm", torch.uint8, (page, head_dim)), ("dig", torch.uint8, (page * head_dim // 4,)),
                ("top", torch.uint8, (head_dim,)), ("meta", torch.int32, (4,))]

    def block_nbytes(self) -> int:
        p, d = self.page, self.head_dim
        return p * d + p * d // 4 + d + 16

    def _pack(self, blocks: torch.Tensor) -> dict[str, torch.Tensor]:
        pk = pack_blocks(blocks)
        pk["stream"] = pk.pop("tail")
        return pk

    def _unpack(self, planes: list[torch.Tensor], stream: torch.Tensor) -> torch.Tensor:
        return unpack_blocks(*planes, stream)

    @property
    def tail(self) -> torch.Tensor:
        """The layer's tail byte stream (its first ``tail_len`` bytes are used, ``TAIL_SLACK`` zeros follow)."""
        return self._stream

    @property
    def tail_len(self) -> int:
        return self._stream_len
