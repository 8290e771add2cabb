"""The fixed-rate KV page code ``kvf12`` (version 1): 12 bits a value plus rare exceptions, for decode speed.

torch ops only (CPU or GPU). A *block* is one page of one sequence and one KV head: ``P`` tokens x
``D`` channels of bf16, value ``i = t * D + c``. A bf16 word is ``hi:lo`` with
``hi = sign << 7 | exponent >> 1`` and ``lo = (exponent & 1) << 7 | mantissa``.

* ``lo``   (uint8, ``[P, D]``): the low byte of every value, raw.
* ``code`` (uint8, ``[P, D/2]``): byte ``(t, j)`` holds the 4-bit code of value ``(t, j)`` in its low
  nibble and of value ``(t, j + D/2)`` in its high nibble. A code is ``sign << 3 | (hi7 - base)``
  (``hi7 = exponent >> 1``) when ``base <= hi7 < base + 8``; otherwise the value is an *exception*:
  its code is ``sign << 3`` and its whole word sits in the exception list.
* ``base`` (uint8, ``[ceil(D/16)]``): per 16 consecutive channels (the last group may be shorter), the window start (0..120) that covers
  the most values of those channels in the block.
* ``meta`` (int32, ``[2]``): the block's first entry in the layer's exception stream, and how many.
* the exception stream (int32, 1-D): one entry a exception, ``index | word << 16`` (``index = t*D + c``,
  ``word`` the bf16 bits), each block's entries consecutive and in increasing index.

Decoding a value is ``hi = (code & 8) << 4 | (base + (code & 7))``, ``word = hi << 8 | lo``: no
escape tiers. Exceptions are patched afterwards, off the hot path: on real SmolLM2 keys 0.048% of
values are exceptions (95% of them exact zeros) and 0.015% of values, 0.752 of bf16's bytes in all
(``benchmarks/history/2026-12-02-kv-fixed-rate-cpu.md``). A window of 16 channels rather than a whole
page keeps exceptions rarer where channels differ in scale (Gaussian keys with per-channel scales:
0.087% against 0.149%) for one byte per 1,024 values.

Byte for byte: ``docs/format.md`` ("KV cache pages, fixed-rate code").
"""

from __future__ import annotations

import torch

from glyd.codec.packed import u16_to_bf16
from glyd.errors import CorruptError, FormatError
from glyd.kv.store import PageStoreBase

#: The code's name and version (``docs/format.md``); pages are in memory only, never written to disk.
NAME = "kvf12"
VERSION = 1
#: Channels that share one window ``base``.
GROUP = 16
#: Exponent>>1 values a window covers (a 3-bit offset), and the largest base (so ``base + 7 <= 127``).
WINDOW = 8
MAX_BASE = 127 - (WINDOW - 1)


def block_bytes(p: int, d: int) -> int:
    """Fixed bytes of one block of ``p`` tokens x ``d`` channels: ``lo``, ``code``, ``base``, ``meta``."""
    return p * d + p * d // 2 + groups(d) + 8


def check_shape(p: int, d: int) -> None:
    """Raise :class:`FormatError` unless pages of ``p`` tokens x head dim ``d`` fit the code."""
    if p <= 0 or p % 4:
        raise FormatError(f"page size {p} must be a positive multiple of 4")
    if d <= 0 or d % 4:
        raise FormatError(f"KV head dim {d} must be a positive multiple of 4")
    if p * d > 65536:
        raise FormatError(f"a {NAME} KV page holds at most 65,536 values (page {p} x head dim {d} is more)")


def _words(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def groups(d: int) -> int:
    """Window groups of a row of ``d`` channels: channels ``16g .. 16g+15`` share ``base[g]`` (the last may be short)."""
    return (d + GROUP - 1) // GROUP


def choose_base(hi7: torch.Tensor) -> torch.Tensor:
    """``base [N, groups(D)]`` for ``hi7 [N, P, D]``: per block and group of 16 channels, the start
    (0..120) of the 8-value window of ``exponent >> 1`` that covers the most values (the lowest on ties)."""
    n, p, d = hi7.shape
    ng = groups(d)
    gid = (torch.arange(d, device=hi7.device) // GROUP) * 128  # [D]
    slot = (gid[None, None, :] + hi7).reshape(n, p * d).long()
    hist = torch.zeros(n, ng * 128, dtype=torch.int32, device=hi7.device)
    hist.scatter_add_(1, slot, torch.ones_like(slot, dtype=torch.int32))
    cum = hist.reshape(n * ng, 128).cumsum(1)
    win = torch.cat([cum[:, WINDOW - 1 : WINDOW], cum[:, WINDOW:] - cum[:, :-WINDOW]], dim=1)  # [N*G, 121]
    return win.argmax(1).to(torch.int32).reshape(n, ng)  # argmax: the first maximum


def channel_base(base: torch.Tensor, d: int) -> torch.Tensor:
    """``base [N, groups(d)]`` spread to every channel: ``[N, d]`` int32."""
    return base.to(torch.int32).repeat_interleave(GROUP, dim=1)[:, :d]


def pack_blocks(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pack ``N`` blocks ``x[N, P, D]`` (bf16): ``lo [N,P,D]``, ``code [N,P,D/2]``, ``base [N,D/16]``
    (uint8), ``meta [N,2]`` (int32, offsets into the returned ``exc``) and ``exc`` (int32, 1-D).

    >>> x = torch.randn(2, 64, 16).to(torch.bfloat16)
    >>> b = pack_blocks(x)
    >>> y = unpack_blocks(b["lo"], b["code"], b["base"], b["meta"], b["exc"])
    >>> torch.equal(y.view(torch.int16), x.view(torch.int16))
    True
    """
    if x.dtype != torch.bfloat16 or x.dim() != 3:
        raise FormatError(f"KV blocks must be bf16 [N, P, D], got {x.dtype} {tuple(x.shape)}")
    n, p, d = x.shape
    check_shape(p, d)
    w = _words(x)
    hi7 = (w >> 8) & 0x7F
    base = choose_base(hi7)
    off = hi7 - channel_base(base, d)[:, None, :]
    inside = (off >= 0) & (off < WINDOW)
    code = ((w >> 12) & 8) | torch.where(inside, off, 0)
    h = d // 2
    out = {
        "lo": (w & 0xFF).to(torch.uint8),
        "code": (code[..., :h] | (code[..., h:] << 4)).to(torch.uint8),
        "base": base.to(torch.uint8),
    }
    ex = ~inside.reshape(n, p * d)
    cnt = ex.sum(1)
    start = torch.cumsum(cnt, 0) - cnt
    blk, idx = ex.nonzero(as_tuple=True)  # row-major: by block, then increasing index
    word = w.reshape(n, p * d)[blk, idx]
    out["exc"] = (idx.to(torch.int32) | (word << 16)).to(torch.int32)
    out["meta"] = torch.stack([start, cnt], dim=1).to(torch.int32)
    return out


def _check(lo, code, base, meta, exc) -> None:
    """Bound-check a block set before reading it; every failure is a :class:`CorruptError`."""
    n, p, d = lo.shape
    if (lo.dtype, code.dtype, base.dtype) != (torch.uint8,) * 3 or meta.dtype != torch.int32 or exc.dtype != torch.int32:
        raise CorruptError(f"{NAME} planes have dtypes {lo.dtype}, {code.dtype}, {base.dtype}, {meta.dtype}, "
                           f"{exc.dtype}; want uint8 lo, code, base and int32 meta, exc")
    want = {"code": (n, p, d // 2), "base": (n, groups(d)), "meta": (n, 2)}
    for name, t in (("code", code), ("base", base), ("meta", meta)):
        if tuple(t.shape) != want[name]:
            raise CorruptError(f"{NAME} {name} has shape {tuple(t.shape)}, want {want[name]} for lo {tuple(lo.shape)}")
    if exc.dim() != 1:
        raise CorruptError(f"{NAME} exception stream must be 1-D, got {tuple(exc.shape)}")
    if n == 0:
        return
    if int(base.max()) > MAX_BASE:
        raise CorruptError(f"{NAME} base {int(base.max())} is out of range 0..{MAX_BASE}")
    start, cnt = meta[:, 0].to(torch.int64), meta[:, 1].to(torch.int64)
    if int(start.min()) < 0 or int(cnt.min()) < 0 or int(cnt.max()) > p * d or int((start + cnt).max()) > exc.numel():
        raise CorruptError(f"{NAME} meta points outside the exception stream of {exc.numel()} entries "
                           f"(or counts more than {p * d} exceptions in a block)")
    blk, pos = _entries(meta)
    if pos.numel():
        idx = exc[pos] & 0xFFFF
        if int(idx.max()) >= p * d:
            raise CorruptError(f"{NAME} exception index {int(idx.max())} is outside a {p}x{d} block")
        same = blk[1:] == blk[:-1]
        if bool((same & (idx[1:] <= idx[:-1])).any()):
            raise CorruptError(f"{NAME} a block's exception indices are not strictly increasing")


def _entries(meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, stream position) of every exception entry of the blocks, block by block."""
    cnt = meta[:, 1].to(torch.int64)
    blk = torch.repeat_interleave(torch.arange(meta.shape[0], device=meta.device), cnt)
    first = torch.cumsum(cnt, 0) - cnt
    pos = meta[:, 0].to(torch.int64)[blk] + torch.arange(blk.numel(), device=meta.device) - first[blk]
    return blk, pos


def unpack_blocks(lo: torch.Tensor, code: torch.Tensor, base: torch.Tensor, meta: torch.Tensor,
                  exc: torch.Tensor) -> torch.Tensor:
    """Decode ``N`` blocks back to bf16 ``[N, P, D]``, bit for bit, after bound-checking them
    (:class:`~glyd.errors.CorruptError` for pages no writer makes: nothing outside the planes is read)."""
    _check(lo, code, base, meta, exc)
    n, p, d = lo.shape
    c = code.to(torch.int32)
    c = torch.cat([c & 15, c >> 4], dim=2)  # [N, P, D]: channels in order
    b = channel_base(base, d)[:, None, :]
    hi = ((c & 8) << 4) | (b + (c & 7))
    w = (hi << 8) | lo.to(torch.int32)
    if exc.numel() and n:
        blk, pos = _entries(meta)
        e = exc[pos]
        w = w.reshape(n, p * d)
        w[blk, (e & 0xFFFF).to(torch.int64)] = (e >> 16) & 0xFFFF
    return u16_to_bf16(w).reshape(n, p, d)


class FixedPageStore(PageStoreBase):
    """One layer's keys (or values) for ``B`` sequences and ``H`` KV heads in ``kvf12`` pages of ``page`` tokens.

    The interface of :class:`glyd.kv.store.PageStoreBase` (``append``, ``to_bf16``, ``pages``,
    ``from_bf16``, ``nbytes``, ``n_tokens``, ``lens``): full pages are packed (``lo``, ``code``, ``base``,
    ``meta`` indexed ``[b, h, page]``, plus the ``exc`` stream); the newest ``n_raw`` tokens stay raw
    bf16 in ``raw`` until their page fills.

    >>> st = FixedPageStore(batch=1, heads=2, head_dim=16, page=16, device="cpu")
    >>> x = torch.randn(1, 2, 40, 16).to(torch.bfloat16)
    >>> st.append(x)
    >>> torch.equal(st.to_bf16().view(torch.int16), x.view(torch.int16))
    True
    """

    code_name = NAME
    PLANES = ("lo", "code", "base", "meta")
    STREAM_DTYPE = torch.int32

    @classmethod
    def check_shape(cls, page: int, head_dim: int) -> None:
        check_shape(page, head_dim)

    @classmethod
    def plane_specs(cls, head_dim: int, page: int):
        return [("lo", torch.uint8, (page, head_dim)), ("code", torch.uint8, (page, head_dim // 2)),
                ("base", torch.uint8, (groups(head_dim),)), ("meta", torch.int32, (2,))]

    def block_nbytes(self) -> int:
        return block_bytes(self.page, self.head_dim)

    def _pack(self, blocks: torch.Tensor) -> dict[str, torch.Tensor]:
        pk = pack_blocks(blocks)
        pk["stream"] = pk.pop("exc")
        return pk

    def _unpack(self, planes: list[torch.Tensor], stream: torch.Tensor) -> torch.Tensor:
        return unpack_blocks(*planes, stream)

    @property
    def exc(self) -> torch.Tensor:
        """The layer's exception stream (int32; its first ``exc_len`` entries are used)."""
        return self._stream

    @property
    def exc_len(self) -> int:
        return self._stream_len


def store_view(k_store: FixedPageStore, v_store: FixedPageStore) -> tuple[torch.Tensor, list, list]:
    """Two stores as the pool's kernels read pages: ``block_index [B, H, n_pages]`` (int32) and each
    side's ``[lo, code, base, meta, exc, raw]`` with the planes block-major (views, no copy)."""
    cap = max(k_store.cap, v_store.cap, 1)
    k_store._reserve_pages(cap)  # the same capacity: one block index serves both
    v_store._reserve_pages(cap)
    if k_store.cap != v_store.cap:
        raise FormatError(f"k_store and v_store have room for {k_store.cap} and {v_store.cap} pages: they must "
                          "grow together")
    cap = k_store.cap  # a store of no page yet grows to more than one: its planes' stride
    b, h, n = k_store.batch, k_store.heads, k_store.n_pages
    dev = k_store.device
    bh = torch.arange(b * h, dtype=torch.int32, device=dev).reshape(b, h, 1)
    bidx = (bh * cap + torch.arange(n, dtype=torch.int32, device=dev)).contiguous()

    def side(st: FixedPageStore) -> list:
        planes = [getattr(st, name).reshape(b * h * cap, *getattr(st, name).shape[3:]) for name in st.PLANES]
        return [*planes, st.exc, st.raw]

    return bidx, side(k_store), side(v_store)
