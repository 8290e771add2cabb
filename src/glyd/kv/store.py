"""The base class of the two growing page stores (``PageStore``: the kvtiered code; ``FixedPageStore``: kvf12).

A store holds one layer's keys (or values) for ``B`` sequences and ``H`` KV heads: full pages packed
into fixed planes indexed ``[b, h, page]`` plus one variable-length stream a layer (the kvtiered code's
tails, kvf12's exceptions), and the newest ``n_raw`` tokens raw bf16 in ``raw`` until their page
fills. Everything but the page code itself lives here once: argument checks, growth, ``append``,
``to_bf16``, ``from_bf16``; a subclass names its planes and stream and packs and unpacks blocks.

>>> import torch
>>> from glyd.kv import FixedPageStore
>>> st = FixedPageStore(batch=1, heads=2, head_dim=16, page=16)
>>> st.append(torch.randn(1, 2, 20, 16).to(torch.bfloat16)); st.n_pages, st.n_raw
(1, 4)
"""

from __future__ import annotations

import warnings

from typing import ClassVar

import torch

from glyd.errors import FormatError


class PageStoreBase:
    """Shared machinery of the page stores; subclasses set the class attributes and the three hooks."""

    #: the page code's name (``GlydCache(code=...)``)
    code_name: ClassVar[str]
    #: the packed planes, in the order ``_pack`` returns and ``_unpack`` takes them
    PLANES: ClassVar[tuple[str, ...]]
    #: the stream: its dtype, the elements kept readable past its used length, its smallest size, what
    #: an element is called in messages
    STREAM_DTYPE: ClassVar[torch.dtype]
    STREAM_SLACK: ClassVar[int] = 0
    STREAM_MIN: ClassVar[int] = 256
    STREAM_UNIT: ClassVar[str] = "entries"

    def __init__(self, batch: int, heads: int, head_dim: int, page: int = 64, device: torch.device | str = "cpu"):
        for name, v in (("batch", batch), ("heads", heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise FormatError(f"KV store {name} must be a positive int, got {v!r}")
        self.check_shape(page, head_dim)
        self.batch, self.heads, self.head_dim, self.page = batch, heads, head_dim, page
        self.device = torch.device(device)
        self.n_pages = 0
        self.cap = 0
        for name, dtype, shape in self.plane_specs(head_dim, page):
            setattr(self, name, torch.empty(batch, heads, 0, *shape, dtype=dtype, device=self.device))
        self._stream = torch.empty(0, dtype=self.STREAM_DTYPE, device=self.device)
        self._stream_len = 0
        # zeros, not empty: readers mask the unwritten slots, but garbage there could be NaN patterns
        self.raw = torch.zeros(batch, heads, page, head_dim, dtype=torch.bfloat16, device=self.device)
        self.n_raw = 0
        #: per-sequence valid token counts when they differ (from_bf16 with lens); None: all equal.
        self.lens: torch.Tensor | None = None
        self._max_len = 0

    # -- what a subclass says -----------------------------------------------------------------------
    @classmethod
    def check_shape(cls, page: int, head_dim: int) -> None:
        """Raise :class:`FormatError` unless pages of ``page`` tokens x ``head_dim`` fit the code."""
        raise NotImplementedError

    @classmethod
    def plane_specs(cls, head_dim: int, page: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(name, dtype, shape of one block's plane) of each of ``PLANES``."""
        raise NotImplementedError

    def block_nbytes(self) -> int:
        """Fixed bytes of one packed block (page x head)."""
        raise NotImplementedError

    def _pack(self, blocks: torch.Tensor) -> dict[str, torch.Tensor]:
        """Pack ``blocks [N, P, D]``: every plane (``[N, ...]``), ``"stream"`` and ``"meta"`` whose
        column 0 counts from the start of that stream."""
        raise NotImplementedError

    def _unpack(self, planes: list[torch.Tensor], stream: torch.Tensor) -> torch.Tensor:
        """Decode blocks from their planes (``[N, ...]`` each, in ``PLANES`` order) -> bf16 ``[N, P, D]``."""
        raise NotImplementedError

    # -- sizes --------------------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return self.n_pages * self.page + self.n_raw

    @property
    def max_len(self) -> int:
        """The longest sequence's token count (a host int, known without a device sync)."""
        return self._max_len if self.lens is not None else self.n_tokens

    @property
    def nbytes(self) -> int:
        """Bytes held: the filled pages' planes and stream, plus the raw tokens actually held."""
        b, h = self.batch, self.heads
        return (b * h * self.n_pages * self.block_nbytes() + self._stream_len * self._stream.element_size()
                + b * h * self.n_raw * self.head_dim * 2)

    # -- growth -------------------------------------------------------------------------------------
    def _reserve_pages(self, need: int) -> None:
        if need <= self.cap:
            return
        cap = max(need, 2 * self.cap, 4)
        for name in self.PLANES:
            t = getattr(self, name)
            out = torch.empty(t.shape[0], t.shape[1], cap, *t.shape[3:], dtype=t.dtype, device=t.device)
            out[:, :, : self.n_pages] = t[:, :, : self.n_pages]
            setattr(self, name, out)
        self.cap = cap

    def _append_stream(self, extra: torch.Tensor) -> int:
        start = self._stream_len
        need = start + extra.numel()
        if need >= 2**31:
            raise FormatError(f"KV {self.code_name} stream of {need} {self.STREAM_UNIT} exceeds int32 offsets; "
                              f"use fewer tokens per layer")
        if need + self.STREAM_SLACK > self._stream.numel():
            # zeros: a kernel may read up to STREAM_SLACK elements past the used length
            size = max(need + self.STREAM_SLACK, 2 * self._stream.numel(), self.STREAM_MIN)
            grown = torch.zeros((size + 3) // 4 * 4, dtype=self._stream.dtype, device=self.device)
            grown[:start] = self._stream[:start]
            self._stream = grown
        self._stream[start:need] = extra
        self._stream_len = need
        return start

    def _pack_full(self, x: torch.Tensor) -> None:
        """Append pages ``x[B, H, n*P, D]`` (whole pages only)."""
        b, h, t, d = x.shape
        n = t // self.page
        if n == 0:
            return
        pk = self._pack(x.reshape(b * h * n, self.page, d))
        meta = pk["meta"].clone()
        meta[:, 0] += self._append_stream(pk["stream"])
        pk["meta"] = meta
        self._reserve_pages(self.n_pages + n)
        sl = slice(self.n_pages, self.n_pages + n)
        for name in self.PLANES:
            plane = getattr(self, name)
            plane[:, :, sl] = pk[name].reshape(b, h, n, *plane.shape[3:])
        self.n_pages += n

    # -- writing ------------------------------------------------------------------------------------
    def append(self, x: torch.Tensor) -> None:
        """Append tokens ``x[B, H, T, D]`` (bf16): fill the raw page, pack every page that fills."""
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
            raise FormatError(f"GlydCache holds bf16 keys and values only, got {getattr(x, 'dtype', type(x).__name__)}")
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

    # -- reading ------------------------------------------------------------------------------------
    def pages(self, first: int = 0, last: int | None = None) -> torch.Tensor:
        """Full pages ``first .. last-1`` of every sequence and head, bf16 ``[B, H, (last-first)*P, D]``."""
        last = self.n_pages if last is None else last
        if not 0 <= first <= last <= self.n_pages:
            raise FormatError(f"pages {first}..{last} are outside the {self.n_pages} full pages held")
        b, h, p, d = self.batch, self.heads, self.page, self.head_dim
        n = last - first
        if n == 0:
            return torch.empty(b, h, 0, d, dtype=torch.bfloat16, device=self.device)
        planes = [getattr(self, name)[:, :, first:last] for name in self.PLANES]
        x = self._unpack([pl.reshape(b * h * n, *pl.shape[3:]) for pl in planes], self._stream[: self._stream_len])
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
        warnings.warn(f"{type(self).__name__}.dense() is deprecated: use to_bf16()", DeprecationWarning, stacklevel=2)
        return self.to_bf16()

    @classmethod
    def from_dense(cls, x: torch.Tensor, lens: torch.Tensor | None = None, page: int = 64):
        """Deprecated name of :meth:`from_bf16`."""
        warnings.warn(f"{cls.__name__}.from_dense() is deprecated: use from_bf16()", DeprecationWarning, stacklevel=2)
        return cls.from_bf16(x, lens, page)

    @classmethod
    def from_bf16(cls, x: torch.Tensor, lens: torch.Tensor | None = None, page: int = 64):
        """A store for ``x[B, H, T, D]`` where sequence ``b`` holds its first ``lens[b]`` tokens.

        With ``lens``, each sequence keeps its own ``lens[b] // page`` full pages and a raw tail of
        ``lens[b] % page`` tokens (the decode kernels read ``lens``); pages past a sequence's end are
        packed too (so planes stay rectangular) but never read. Such a store is read-only.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise FormatError(f"from_bf16 takes bf16 [B, H, T, D], got {getattr(x, 'shape', type(x).__name__)}")
        b, h, t, d = x.shape
        st = cls(b, h, d, page=page, device=x.device)
        if lens is None:
            st.append(x)
            return st
        if x.dtype != torch.bfloat16:
            raise FormatError(f"GlydCache holds bf16 keys and values only, got {x.dtype}")
        lens = lens.to(device=x.device, dtype=torch.int64)
        if lens.shape != (b,) or t == 0 or int(lens.min()) < 1 or int(lens.max()) > t:
            raise FormatError(f"lens {lens.tolist()} must be {b} lengths in 1..{t}")
        st._max_len = int(lens.max())
        st._pack_full(x[:, :, : (st._max_len // page) * page])
        # each sequence's raw tail: its tokens from (lens // page) * page on
        first = (lens // page) * page
        idx = (first[:, None] + torch.arange(page, device=x.device)[None, :]).clamp_max(t - 1)
        # gathered as int16: torch.gather on bf16 (CPU) rewrites NaN payloads (0x7fc0 -> 0xffff)
        xi = x.view(torch.int16)
        st.raw = torch.gather(xi, 2, idx[:, None, :, None].expand(b, h, page, d)).contiguous().view(torch.bfloat16)
        st.n_raw = page  # raw[b] holds lens[b] % page real tokens; the per-sequence counts live in lens
        st.lens = lens
        return st
