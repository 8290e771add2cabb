"""A static pool of kvf12 pages for every layer of a model, as serving engines hold their KV caches.

Memory is reserved once (:class:`FixedPagePool`: the pages ``batch`` sequences of ``max_len`` tokens
need, or :meth:`FixedPagePool.from_memory`: a share of the free GPU memory), and never again: a
sequence's pages are found through its block table, a prompt is written by one kernel
(``glyd::kvf12_write``, which packs every page that fills and keeps the rest raw), a decode step by the
same kernel with one token, and decode attention (``glyd::kvf12_attention``) reads the packed pages in
place. No step allocates or waits on the host, so a whole decode step can be captured in one CUDA
graph and ``torch.compile`` sees the same shapes every step. Both ops are ``torch.library`` ops: the
Triton kernels on CUDA (chosen by ``glyd.kv.registry``), the torch twins (``glyd.kv.pool_twin``) elsewhere.

Exceptions (values outside their 16-exponent window, about 0.05% of real keys) go to an arena a layer
and side, reserved as a share of the pool's values (``exc_fraction``, default 1/512, 0.4% more bytes);
a page whose exceptions do not fit is marked, its attention output is NaN on the GPU, and
:meth:`FixedPagePool.check` (host sync: after a prompt, or when asked) raises :class:`KVCapacityError`.
The same check covers a sequence that grows past the pool's context.

>>> import torch
>>> pool = FixedPagePool(layers=1, batch=2, heads=2, head_dim=32, max_len=128, page=32)
>>> k = torch.randn(2, 2, 40, 32).to(torch.bfloat16); v = torch.randn(2, 2, 40, 32).to(torch.bfloat16)
>>> pool.advance(40); pool.write(0, k, v)   # a prompt: returns its first position
0
>>> kd, vd = pool.to_bf16(0)
>>> torch.equal(kd.view(torch.int16), k.view(torch.int16))
True
"""

from __future__ import annotations

import math

import torch

from glyd.errors import FormatError
from glyd.kv import fixed
from glyd.kv import pool_ops
from glyd.kv.pool_twin import KVCapacityError

__all__ = ["FixedPagePool", "KVCapacityError", "EXC_FRACTION", "pool_bytes", "pages_that_fit", "check_fraction"]

#: Exception entries reserved a value (1/512: about 4x the rate measured on real SmolLM2 keys, 0.048%,
#: and 2.2x that of Gaussian keys with per-channel scales, 0.087%).
EXC_FRACTION = 1 / 512


def _positive(name: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise FormatError(f"KV pool {name} must be a positive int, got {v!r}")
    return v


def check_fraction(name: str, v) -> float:
    """``v`` if it is a share in (0, 1] (an int or a float; not a bool, which Python counts as an int: True
    would be a whole 1.0; not NaN); else a ``FormatError`` naming ``name``.

    >>> check_fraction("exc_fraction", 0.5)
    0.5
    >>> check_fraction("exc_fraction", True)
    Traceback (most recent call last):
    glyd.errors.FormatError: exc_fraction must be a number in (0, 1], got True (a bool)
    """
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        what = "a bool" if isinstance(v, bool) else type(v).__name__
        raise FormatError(f"{name} must be a number in (0, 1], got {v!r} ({what})")
    if not 0 < v <= 1:  # (NaN compares False: refused too)
        raise FormatError(f"{name} must be in (0, 1], got {v!r}")
    return v


def _arena(n_values: int, exc_fraction: float) -> int:
    check_fraction("exc_fraction", exc_fraction)
    return max(64, math.ceil(n_values * exc_fraction))


def pool_bytes(layers: int, heads: int, head_dim: int, v_head_dim: int, page: int, pages: int, batch: int,
               exc_fraction: float = EXC_FRACTION) -> int:
    """Bytes a pool of ``pages`` pages (plus its sink page) for ``batch`` sequences reserves."""
    total = 0
    for d in (head_dim, v_head_dim):
        blocks = (pages + 1) * heads
        total += blocks * fixed.block_bytes(page, d) + 4 * (_arena(pages * heads * page * d, exc_fraction) + 1) + 4
        total += batch * heads * page * d * 2  # the raw pages
    per_seq = math.ceil(pages / batch)  # block table, block index and lens: int32
    return layers * total + 4 * batch * (1 + per_seq + heads * per_seq)


def pages_that_fit(budget: int, layers: int, batch: int, heads: int, head_dim: int, v_head_dim: int, page: int,
                   exc_fraction: float = EXC_FRACTION) -> int:
    """The most pages a sequence that a pool of ``budget`` bytes holds (:func:`pool_bytes`), below the
    planes' int32 offsets (a kernel's block offsets) whatever the budget.

    >>> pages_that_fit(10**15, 24, 1, 2, 64, 64, 64)   # a 0.5B model's cache in a petabyte: the int32 limit
    262142
    """
    cap = (2**31 // (heads * page * max(head_dim, v_head_dim)) - 2) // batch
    lo, hi = 0, min(max(1, budget // (page * heads)), cap)
    while lo < hi:  # bisection on the exact size
        mid = (lo + hi + 1) // 2
        if pool_bytes(layers, heads, head_dim, v_head_dim, page, mid * batch, batch, exc_fraction) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Side:
    """The keys' (or values') planes, one set a layer: ``[NB, ...]`` block-major, the arena, the raw pages.

    Separate tensors a layer (not views of one): the ops mutate whole tensors, which ``torch.compile``
    updates in place, and each is marked as a static address for CUDA graphs."""

    def __init__(self, layers: int, blocks: int, batch: int, heads: int, page: int, d: int, arena: int, device):
        fixed.check_shape(page, d)
        z = dict(device=device)
        u8 = dict(dtype=torch.uint8, **z)
        i32 = dict(dtype=torch.int32, **z)
        self.lo = [torch.zeros(blocks, page, d, **u8) for _ in range(layers)]
        self.code = [torch.zeros(blocks, page, d // 2, **u8) for _ in range(layers)]
        self.base = [torch.zeros(blocks, fixed.groups(d), **u8) for _ in range(layers)]
        self.meta = [torch.zeros(blocks, 2, **i32) for _ in range(layers)]
        self.exc = [torch.zeros(arena + 1, **i32) for _ in range(layers)]
        self.used = [torch.zeros(1, **i32) for _ in range(layers)]
        self.raw = [torch.zeros(batch, heads, page, d, dtype=torch.bfloat16, **z) for _ in range(layers)]
        self.arena = arena

    def layer(self, i: int) -> list[torch.Tensor]:
        """Layer ``i``'s tensors in the ops' order: lo, code, base, meta, exc, raw (fixed addresses)."""
        return [self.lo[i], self.code[i], self.base[i], self.meta[i], self.exc[i], self.raw[i]]

    def tensors(self) -> list[torch.Tensor]:
        return [t for ts in (self.lo, self.code, self.base, self.meta, self.exc, self.used, self.raw) for t in ts]

    def used_counts(self) -> list[int]:
        """Exception entries each layer's writes asked for (host sync)."""
        return torch.cat(self.used).tolist()


class FixedPagePool:
    """Static kvf12 pages for ``layers`` layers and ``batch`` sequences of up to ``max_len`` tokens.

    ``block_table [B, J]`` (int32) lists each sequence's pages (``J = ceil(max_len / page)``; sequence
    ``b`` owns pages ``b*J .. b*J + J-1``); ``lens [B]`` (int32) its tokens. Call :meth:`advance` once a
    forward (before the first layer writes), then :meth:`write` and :meth:`attend` a layer.

    >>> pool = FixedPagePool(layers=2, batch=1, heads=1, head_dim=32, max_len=64, page=32)
    >>> pool.context, pool.block_table.tolist()
    (64, [[0, 1]])
    """

    def __init__(self, layers: int, batch: int, heads: int, head_dim: int, max_len: int, *, page: int = 64,
                 v_head_dim: int | None = None, device: torch.device | str = "cpu",
                 exc_fraction: float = EXC_FRACTION):
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        for name, v in (("layers", layers), ("batch", batch), ("heads", heads), ("max_len", max_len), ("page", page),
                        ("head_dim", head_dim), ("v_head_dim", v_head_dim)):
            _positive(name, v)
        fixed.check_shape(page, head_dim)
        fixed.check_shape(page, v_head_dim)
        self.layers, self.batch, self.heads, self.page = layers, batch, heads, page
        self.head_dim, self.v_head_dim = head_dim, v_head_dim
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda" is the current GPU: name it, as
            self.device = torch.device("cuda", torch.cuda.current_device())  # tensors there are named
        self.exc_fraction = exc_fraction
        self.pages_per_seq = math.ceil(max_len / page)
        self.n_pages = batch * self.pages_per_seq
        if (self.n_pages + 1) * heads * page * max(head_dim, v_head_dim) >= 2**31:
            raise FormatError(f"a KV pool of {self.n_pages} pages x {heads} heads exceeds int32 offsets; use a "
                              f"shorter context or fewer sequences")
        blocks = (self.n_pages + 1) * heads  # + one sink page (masked writes of the twin land there)
        z = dict(device=self.device, dtype=torch.int32)
        self.block_table = torch.arange(self.n_pages, **z).reshape(batch, self.pages_per_seq)
        self.block_index = (self.block_table[:, None, :] * heads + torch.arange(heads, **z)[None, :, None]).contiguous()
        self.lens = torch.zeros(batch, **z)
        # the host's copy of lens.max() while every change went through advance/reset/seek (None: unknown,
        # read it from the device): a prompt's write then never waits on the GPU
        self._host_len: int | None = 0
        ka = _arena(self.n_pages * heads * page * head_dim, exc_fraction)
        va = _arena(self.n_pages * heads * page * v_head_dim, exc_fraction)
        self.k = _Side(layers, blocks, batch, heads, page, head_dim, ka, self.device)
        self.v = _Side(layers, blocks, batch, heads, page, v_head_dim, va, self.device)
        self._poll: tuple[torch.Tensor, torch.cuda.Event] | None = None
        if not torch.compiler.is_compiling():  # fixed addresses: CUDA graphs (and torch.compile's) replay them
            for t in (self.block_table, self.block_index, self.lens, *self.k.tensors(), *self.v.tensors()):
                torch._dynamo.mark_static_address(t)

    @classmethod
    def from_memory(cls, layers: int, batch: int, heads: int, head_dim: int, *, fraction: float = 0.9,
                    page: int = 64, v_head_dim: int | None = None, device: torch.device | str = "cuda",
                    exc_fraction: float = EXC_FRACTION, free_bytes: int | None = None) -> FixedPagePool:
        """The largest pool that fits in ``fraction`` of the free memory of ``device`` (``free_bytes``:
        that many bytes instead, e.g. on the CPU): its context is whole pages a sequence.

        >>> FixedPagePool.from_memory(2, 1, 1, 32, page=32, device="cpu", free_bytes=2**20).context
        4768
        """
        check_fraction("fraction", fraction)
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        if free_bytes is None:
            dev = torch.device(device)
            if dev.type != "cuda":
                raise FormatError("from_memory measures free GPU memory; pass free_bytes= for another device")
            free, _ = torch.cuda.mem_get_info(dev)
            free_bytes = free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        pages = pages_that_fit(int(free_bytes * fraction), layers, batch, heads, head_dim, v_head_dim, page,
                               exc_fraction)
        if pages == 0:
            raise KVCapacityError(f"{int(free_bytes * fraction)} bytes hold no KV page for {batch} sequence(s)")
        return cls(layers, batch, heads, head_dim, pages * page, page=page, v_head_dim=v_head_dim, device=device,
                   exc_fraction=exc_fraction)

    # -- sizes --------------------------------------------------------------------------------------
    @property
    def context(self) -> int:
        """Tokens a sequence can hold (whole pages)."""
        return self.pages_per_seq * self.page

    @property
    def reserved_bytes(self) -> int:
        """Bytes of every tensor the pool holds."""
        ts = [self.block_table, self.block_index, self.lens, *self.k.tensors(), *self.v.tensors()]
        return sum(t.numel() * t.element_size() for t in ts)

    def nbytes(self, tokens: int) -> int:
        """Bytes that ``tokens`` tokens a sequence take in the pool (host int; no sync): full pages, the
        exception entries written, raw pages. Reads the arenas' counters (one host sync)."""
        full = tokens // self.page
        used = sum(min(u, s.arena) for s in (self.k, self.v) for u in s.used_counts())
        per_page = self.heads * (fixed.block_bytes(self.page, self.head_dim) + fixed.block_bytes(self.page, self.v_head_dim))
        raw = (tokens % self.page) * self.heads * (self.head_dim + self.v_head_dim) * 2
        return self.layers * self.batch * (full * per_page + raw) + 4 * used

    # -- writing ------------------------------------------------------------------------------------
    def advance(self, tokens: int) -> None:
        """Count ``tokens`` more tokens a sequence (once a forward, before its layers write)."""
        if not isinstance(tokens, (int, torch.SymInt)) or isinstance(tokens, bool):
            raise FormatError(f"advance({tokens!r}): tokens must be an int")
        if type(tokens) is int and not torch.compiler.is_compiling() and self._host_len is not None \
                and self._host_len + tokens < 0:  # (not read by a compiled step: a guard on it would recompile)
            raise FormatError(f"advance({tokens}): the pool holds {self._host_len} tokens a sequence")
        self.lens.add_(tokens)
        # under torch.compile the capture query is not asked: dynamo breaks the graph at it (a bool from torch.*)
        compiling = torch.compiler.is_compiling()
        capturing = not compiling and self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if (compiling and tokens == 1) or capturing:
            # a compiled decode step leaves the count unknown (read only when eager: a guard on it would recompile
            # the step every token); a captured graph's replays advance lens without this line
            self._host_len = None
        elif self._host_len is not None:  # eager, or a compiled prompt: torch.compile guards on the count it
            self._host_len += tokens      # read and replays this store after each call of its graph

    def forget(self) -> None:
        """Say ``lens`` was changed outside this class (a graph replayed, a rewind): :meth:`held` reads it."""
        self._host_len = None

    def held(self) -> int:
        """The longest sequence's tokens: the host's count (no sync) when known, else read from the device
        (under ``torch.compile`` that read is a graph break: a compiled prompt wants the count known)."""
        if self._host_len is None:
            self._host_len = int(self.lens.max())
        return self._host_len

    def admit(self, tokens: int) -> None:
        """Refuse a prompt of ``tokens`` tokens a sequence that would outgrow the context, before anything
        moves (call it before :meth:`advance`; :meth:`write` checks again): see :meth:`_refused`."""
        self._refused(self.held(), tokens)

    def admit_step(self) -> None:
        """Refuse an eager one-token step that would outgrow the context, before anything moves, where the host's
        count is known (no sync; after compiled or captured steps it is not, and :meth:`check` says it later)."""
        if self._host_len is not None:
            self._refused(self._host_len, 1)

    def _refused(self, first: int, tokens: int) -> bool:
        """False where ``tokens`` tokens from position ``first`` fit the context. Else eager: raise
        :class:`KVCapacityError`; under ``torch.compile`` (``first`` is the host's count, a guarded int, so
        the answer is known while tracing): put ``glyd::kv_refuse`` in the graph, which raises the same error
        when the compiled code runs, before the graph's first change to ``lens`` (the op mutates it), and
        return True (the caller writes nothing). Dynamo cannot trace a ``raise``: a graph break, or with
        ``fullgraph=True`` its own ``Unsupported`` error in place of this one."""
        if first + tokens <= self.context:
            return False
        message = f"{first + tokens} tokens do not fit the pool's context of {self.context}"
        if not torch.compiler.is_compiling():
            raise KVCapacityError(message)
        pool_ops.refuse(self.lens, message)
        return True

    def _check_layer(self, layer) -> None:
        if type(layer) is not int or not 0 <= layer < self.layers:
            raise FormatError(f"layer {layer!r} is not one of the pool's {self.layers} (0 .. {self.layers - 1})")

    def _check_states(self, name: str, x: torch.Tensor, d: int) -> None:
        if x.dtype != torch.bfloat16:
            raise FormatError(f"the KV pool holds bf16 only; {name} is {x.dtype} (load the model in bfloat16)")
        if x.dim() != 4 or tuple(x.shape[:2]) != (self.batch, self.heads) or x.shape[3] != d:
            raise FormatError(f"{name} of shape {tuple(x.shape)} does not match the pool's "
                              f"[{self.batch}, {self.heads}, T, {d}]")
        if x.device != self.device:
            raise FormatError(f"{name} is on {x.device}, the pool on {self.device}")

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> int | None:
        """Write layer ``layer``'s new tokens ``keys``/``values [B, H, T, D]`` at positions ``lens - T ..``
        (one kernel for both sides where their head dims agree; pages that fill are packed). A prompt
        (``T > 1``) takes the position from the host's count (:meth:`held`; no sync unless ``lens`` was
        changed outside this class: a prompt that starts inside a page and fills it is written in two calls,
        the page then the rest) and returns it; a decode step (``T == 1``) returns None and never syncs."""
        self._check_layer(layer)
        self._check_states("keys", keys, self.head_dim)
        self._check_states("values", values, self.v_head_dim)
        t = keys.shape[2]
        if values.shape[2] != t:
            raise FormatError(f"keys hold {t} tokens, values {values.shape[2]}")
        if t == 0:
            raise FormatError("keys and values hold no tokens: nothing to write")
        first = None
        if t > 1 or (not torch.compiler.is_compiling() and self._host_len is not None):
            # (an eager decode step reads the host's count where it is known; a compiled one never: no guard on it)
            held = self.held()  # a prompt: the host's count (no wait unless lens was changed elsewhere)
            if held < t:  # lens not advanced for these tokens: they would land before position 0, over held ones
                raise FormatError(f"write(): the pool holds {held} tokens a sequence, fewer than the {t} written; "
                                  f"call advance({t}) first (once a forward, before the first layer writes)")
        if t > 1:
            first = held - t
            if self._refused(first, t):
                return first
            head = (-first) % self.page
            if 0 < head < t:  # the first page is part raw: fill it first (the kernel reads raw, never writes it then)
                self._write(layer, keys[:, :, :head], values[:, :, :head], t - head)
                keys, values = keys[:, :, head:], values[:, :, head:]
        self._write(layer, keys, values, 0)
        return first

    def _write(self, layer: int, keys: torch.Tensor, values: torch.Tensor, after: int) -> None:
        # one op for both sides where their head dims agree (one kernel on CUDA), else one a side
        lens = self.lens if after == 0 else self.lens - after
        if self.head_dim == self.v_head_dim:
            planes = []
            for side in (self.k, self.v):
                lo, code, base, meta, exc, raw = side.layer(layer)
                planes.append((lo, code, base, meta, exc, side.used[layer], raw))
            pool_ops.write_pair(keys.contiguous(), values.contiguous(), lens, self.block_index, *planes)
            return
        for side, x in ((self.k, keys), (self.v, values)):
            lo, code, base, meta, exc, raw = side.layer(layer)
            pool_ops.write(x.contiguous(), lens, self.block_index, lo, code, base, meta, exc, side.used[layer], raw)

    # -- reading ------------------------------------------------------------------------------------
    def attend(self, layer: int, q: torch.Tensor, scale: float | None = None,
               starts: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Decode attention of ``q [B, Hq, D]`` (bf16) over layer ``layer``'s tokens -> ``[B, Hq, DV]``;
        ``starts [B]``: each sequence ignores its tokens before that position (left padding); ``valid [B, S]``
        (bool or uint8, the attention mask's row): sequence ``b`` attends position ``t`` only where ``t < S``
        and ``valid[b, t]``."""

        self._check_layer(layer)
        if q.dim() != 3 or q.dtype != torch.bfloat16 or q.shape[0] != self.batch or q.shape[2] != self.head_dim \
                or q.shape[1] % self.heads:
            raise FormatError(f"q must be bf16 [{self.batch}, a multiple of {self.heads}, {self.head_dim}], got "
                              f"{q.dtype} {tuple(q.shape)}")
        scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        return pool_ops.attention(q.contiguous(), self.lens, starts, self.block_index, self.k.layer(layer),
                                  self.v.layer(layer), scale, valid)

    def to_bf16(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s keys and values, bf16 ``[B, H, T, D]``, bit for bit what was written (every
        sequence must hold the same number of tokens, as in a transformers cache; host syncs)."""
        self._check_layer(layer)
        self.check()
        n = self.lens.tolist()
        if len(set(n)) != 1:
            raise FormatError(f"the pool's sequences hold {n} tokens; to_bf16() needs them equal")
        t = n[0]
        full = t // self.page
        out = []
        for side, d in ((self.k, self.head_dim), (self.v, self.v_head_dim)):
            lo, code, base, meta, exc, raw = side.layer(layer)
            blk = self.block_index[:, :, :full].reshape(-1).to(torch.int64)
            x = fixed.unpack_blocks(lo[blk], code[blk], base[blk], meta[blk], exc[:-1])
            x = x.reshape(self.batch, self.heads, full * self.page, d)
            out.append(torch.cat([x, raw[:, :, : t - full * self.page]], dim=2))
        return out[0], out[1]

    def exceptions(self, x: torch.Tensor) -> int:
        """Exception entries that writing ``x [B, H, T, D]`` (bf16) from position 0 takes (its full pages'
        values outside their windows; host sync): what a rewrite (``GlydStaticCache``'s crop, reorder) checks
        against the arena before it empties the pool."""
        full = x.shape[2] // self.page
        if full == 0:
            return 0
        b, h, _, d = x.shape
        tiles = x[:, :, : full * self.page].reshape(b * h * full, self.page, d)
        hi7 = (tiles.contiguous().view(torch.int16).to(torch.int32) >> 8) & 0x7F
        off = hi7 - fixed.channel_base(fixed.choose_base(hi7), d)[:, None, :]
        return int(((off < 0) | (off >= fixed.WINDOW)).sum())

    def check(self) -> None:
        """Raise :class:`KVCapacityError` if a sequence outgrew the pool's context or an exception arena
        overflowed (pages written since then are marked and their attention output is NaN). Host sync."""
        n = self.lens.tolist()
        if max(n) > self.context:
            raise KVCapacityError(f"a sequence holds {max(n)} tokens, more than the pool's context of {self.context}")
        for name, side in (("key", self.k), ("value", self.v)):
            cap = side.arena
            used = side.used_counts()
            bad = [i for i, u in enumerate(used) if u > cap]
            if bad:
                raise KVCapacityError(f"layer {bad[0]}'s {name} exceptions ({used[bad[0]]}) overflowed the "
                                      f"{cap} reserved (exc_fraction={self.exc_fraction}); pages written since are "
                                      f"lost: reserve more")

    def poll(self) -> None:
        """The check of :meth:`check` without waiting: on CUDA, read the counters copied to the host at the
        previous call if that copy is done (raise if they overflowed), and start a new copy. For eager
        decode steps (``GlydStaticCache`` calls it once a step): an overflow raises a step or two later,
        before ``generate`` returns. Not under CUDA-graph capture (the caller checks) or on the CPU (the
        twins raise when they read what overflowed)."""
        if self.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return
        if self._poll is not None:
            host, done = self._poll
            if not done.query():
                return
            self._poll = None
            n = host.tolist()
            if n[0] > self.context or max(n[1 : 1 + self.layers]) > self.k.arena or max(n[1 + self.layers :]) > self.v.arena:
                self.check()
        flags = torch.stack([self.lens.max(), *(u[0] for u in self.k.used), *(u[0] for u in self.v.used)])
        host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
        host.copy_(flags, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._poll = (host, done)

    def reset(self) -> None:
        """Empty every sequence (the reserved memory stays)."""
        self.lens.zero_()
        self._host_len = 0
        for u in (*self.k.used, *self.v.used):
            u.zero_()
