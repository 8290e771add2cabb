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

import warnings

import torch

from glyd.codec.packed import u16_to_bf16
from glyd.errors import CorruptError, FormatError

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


class FixedPageStore:
    """One layer's keys (or values) for ``B`` sequences and ``H`` KV heads in ``kvf12`` pages of ``page`` tokens.

    The same interface as :class:`glyd.kv.pages.PageStore` (``append``, ``to_bf16``, ``from_bf16``,
    ``nbytes``, ``n_tokens``, ``lens``): full pages are packed (``lo``, ``code``, ``base``, ``meta``
    indexed ``[b, h, page]``, plus the ``exc`` stream); the newest ``n_raw`` tokens stay raw bf16 in
    ``raw`` until their page fills.

    >>> st = FixedPageStore(batch=1, heads=2, head_dim=16, page=16, device="cpu")
    >>> x = torch.randn(1, 2, 40, 16).to(torch.bfloat16)
    >>> st.append(x)
    >>> torch.equal(st.to_bf16().view(torch.int16), x.view(torch.int16))
    True
    """

    code_name = NAME

    def __init__(self, batch: int, heads: int, head_dim: int, page: int = 64, device: torch.device | str = "cpu"):
        check_shape(page, head_dim)
        self.batch, self.heads, self.head_dim, self.page = batch, heads, head_dim, page
        self.device = torch.device(device)
        self.n_pages = 0
        self.cap = 0
        b, h, p, d = batch, heads, page, head_dim
        self.lo = torch.empty(b, h, 0, p, d, dtype=torch.uint8, device=self.device)
        self.code = torch.empty(b, h, 0, p, d // 2, dtype=torch.uint8, device=self.device)
        self.base = torch.empty(b, h, 0, groups(d), dtype=torch.uint8, device=self.device)
        self.meta = torch.empty(b, h, 0, 2, dtype=torch.int32, device=self.device)
        self.exc = torch.empty(0, dtype=torch.int32, device=self.device)
        self.exc_len = 0
        # zeros, not empty: readers mask the unwritten slots, but garbage there could be NaN patterns
        self.raw = torch.zeros(b, h, p, d, dtype=torch.bfloat16, device=self.device)
        self.n_raw = 0
        #: per-sequence valid token counts when they differ (from_bf16 with lens); None: all equal.
        self.lens: torch.Tensor | None = None
        self._max_len = 0

    @property
    def n_tokens(self) -> int:
        return self.n_pages * self.page + self.n_raw

    @property
    def max_len(self) -> int:
        """The longest sequence's token count (a host int, known without a device sync)."""
        return self._max_len if self.lens is not None else self.n_tokens

    @property
    def nbytes(self) -> int:
        """Bytes held: the filled pages' planes and exceptions, plus the raw tokens actually held."""
        b, h = self.batch, self.heads
        return (b * h * self.n_pages * block_bytes(self.page, self.head_dim) + 4 * self.exc_len
                + b * h * self.n_raw * self.head_dim * 2)

    def _reserve_pages(self, need: int) -> None:
        if need <= self.cap:
            return
        cap = max(need, 2 * self.cap, 4)

        def grow(t: torch.Tensor) -> torch.Tensor:
            out = torch.empty(t.shape[0], t.shape[1], cap, *t.shape[3:], dtype=t.dtype, device=t.device)
            out[:, :, : self.n_pages] = t[:, :, : self.n_pages]
            return out

        self.lo, self.code, self.base, self.meta = (grow(t) for t in (self.lo, self.code, self.base, self.meta))
        self.cap = cap

    def _append_exc(self, extra: torch.Tensor) -> int:
        start = self.exc_len
        need = start + extra.numel()
        if need > self.exc.numel():
            grown = torch.zeros(max(need, 2 * self.exc.numel(), 256), dtype=torch.int32, device=self.device)
            grown[:start] = self.exc[:start]
            self.exc = grown
        self.exc[start:need] = extra
        self.exc_len = need
        if need >= 2**31:
            raise FormatError(f"KV exception stream of {need} entries exceeds int32 offsets; use fewer tokens per layer")
        return start

    def _pack_full(self, x: torch.Tensor) -> None:
        """Append pages ``x[B, H, n*P, D]`` (whole pages only)."""
        b, h, t, d = x.shape
        n = t // self.page
        if n == 0:
            return
        pk = pack_blocks(x.reshape(b * h * n, self.page, d))
        meta = pk["meta"].clone()
        meta[:, 0] += self._append_exc(pk["exc"])
        self._reserve_pages(self.n_pages + n)
        sl = slice(self.n_pages, self.n_pages + n)
        self.lo[:, :, sl] = pk["lo"].reshape(b, h, n, self.page, d)
        self.code[:, :, sl] = pk["code"].reshape(b, h, n, self.page, d // 2)
        self.base[:, :, sl] = pk["base"].reshape(b, h, n, groups(d))
        self.meta[:, :, sl] = meta.reshape(b, h, n, 2)
        self.n_pages += n

    def append(self, x: torch.Tensor) -> None:
        """Append tokens ``x[B, H, T, D]`` (bf16): fill the raw page, pack every page that fills."""
        if x.dtype != torch.bfloat16:
            raise FormatError(f"GlydCache holds bf16 keys and values only, got {x.dtype}")
        if x.dim() != 4 or tuple(x.shape[:2]) != (self.batch, self.heads) or x.shape[3] != self.head_dim:
            raise FormatError(f"KV states of shape {tuple(x.shape)} do not match the cache's "
                              f"[{self.batch}, {self.heads}, T, {self.head_dim}]")
        if self.lens is not None:
            raise FormatError("this store holds sequences of different lengths (from_bf16 with lens): it is read-only")
        x = x.to(self.device)
        t = x.shape[2]
        if t == 0:
            return
        if self.n_raw + t < self.page:
            self.raw[:, :, self.n_raw : self.n_raw + t] = x
            self.n_raw += t
            return
        allx = torch.cat([self.raw[:, :, : self.n_raw], x], dim=2) if self.n_raw else x
        full = (allx.shape[2] // self.page) * self.page
        self._pack_full(allx[:, :, :full])
        rest = allx.shape[2] - full
        self.raw[:, :, :rest] = allx[:, :, full:]
        self.n_raw = rest

    def pages(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        """Full pages ``first .. last-1`` of every sequence and head, bf16 ``[B, H, (last-first)*P, D]``."""
        last = self.n_pages if last is None else last
        b, h, p, d = self.batch, self.heads, self.page, self.head_dim
        n = last - first
        sl = slice(first, last)
        x = unpack_blocks(self.lo[:, :, sl].reshape(b * h * n, p, d), self.code[:, :, sl].reshape(b * h * n, p, d // 2),
                          self.base[:, :, sl].reshape(b * h * n, groups(d)), self.meta[:, :, sl].reshape(b * h * n, 2),
                          self.exc[: self.exc_len])
        return x.reshape(b, h, n * p, d)

    def to_bf16(self) -> torch.Tensor:
        """Every token, bf16 ``[B, H, T, D]``, bit for bit what was appended."""
        if self.lens is not None:
            raise FormatError("this store holds sequences of different lengths: use glyd.kv.attention.padded_bf16")
        raw = self.raw[:, :, : self.n_raw]
        if not self.n_pages:
            return raw.clone()
        return torch.cat([self.pages(), raw], dim=2) if self.n_raw else self.pages()

    def dense(self) -> torch.Tensor:
        """Deprecated name of :meth:`to_bf16` (glyd's "dense" was three things)."""
        warnings.warn("FixedPageStore.dense() is deprecated: use to_bf16()", DeprecationWarning, stacklevel=2)
        return self.to_bf16()

    @classmethod
    def from_dense(cls, x: torch.Tensor, lens: torch.Tensor | None = None, page: int = 64) -> FixedPageStore:
        """Deprecated name of :meth:`from_bf16`."""
        warnings.warn("FixedPageStore.from_dense() is deprecated: use from_bf16()", DeprecationWarning, stacklevel=2)
        return cls.from_bf16(x, lens, page)

    @classmethod
    def from_bf16(cls, x: torch.Tensor, lens: torch.Tensor | None = None, page: int = 64) -> FixedPageStore:
        """A store for ``x[B, H, T, D]`` where sequence ``b`` holds its first ``lens[b]`` tokens
        (as :meth:`glyd.kv.pages.PageStore.from_bf16`: full pages, then each sequence's raw page)."""
        b, h, t, d = x.shape
        st = cls(b, h, d, page=page, device=x.device)
        if lens is None:
            st.append(x)
            return st
        lens = lens.to(device=x.device, dtype=torch.int64)
        if lens.shape != (b,) or int(lens.min()) < 1 or int(lens.max()) > t:
            raise FormatError(f"lens {lens.tolist()} must be {b} lengths in 1..{t}")
        st._max_len = int(lens.max())
        st._pack_full(x[:, :, : (st._max_len // page) * page])
        first = (lens // page) * page
        idx = (first[:, None] + torch.arange(page, device=x.device)[None, :]).clamp_max(t - 1)
        # gathered as int16: torch's bf16 gather on the CPU does not keep NaN payloads (0x7fc0 came back 0xffff)
        xi = x.view(torch.int16)
        st.raw = torch.gather(xi, 2, idx[:, None, :, None].expand(b, h, page, d)).contiguous().view(torch.bfloat16)
        st.n_raw = page  # raw[b] holds lens[b] % page real tokens; the per-sequence counts live in lens
        st.lens = lens
        return st
