"""``GlydStaticCache``: a transformers ``Cache`` over a static pool of kvf12 pages (``glyd.kv.pool``).

As transformers' ``StaticCache``: memory is reserved once (for ``max_cache_len`` tokens, or the pages
that ``memory_fraction`` of the free GPU memory holds), every update writes in place, and a decode
step allocates nothing and never waits on the host, so ``generate`` can compile it
(``is_compileable``: on CUDA ``generate`` runs its decode steps under ``torch.compile``) and a step can
be captured in one CUDA graph. Unlike it, the keys and values are held losslessly packed (about 0.75
of bf16's bytes) and the ``"glyd_kv"`` attention (:func:`glyd.kv.enable_fused`) reads them in place.

Fused (the default): one-token steps attend through ``glyd::kvf12_attention`` (the Triton kernel on
CUDA, the torch twin elsewhere); the cached bits are the bf16 cache's, the attention output differs
from SDPA's by rounding (tokens can differ where two logits nearly tie). ``fused=False`` is the
reference path: every step unpacks the layer's whole cache and the model's own attention runs on it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from glyd.errors import FormatError, GlydError, UnsupportedError, cause
from glyd.kv import hf_attention
from glyd.kv.pool import EXC_FRACTION, FixedPagePool, KVCapacityError, check_fraction

DEFAULT_PAGE = 64


class GlydStaticLayer(CacheLayerMixin):
    """One layer of a :class:`GlydStaticCache`: its share of the cache's pool (layer ``index``)."""

    is_sliding = False

    def __init__(self, cache: GlydStaticCache, index: int):
        super().__init__()
        self._cache = cache
        self.index = index

    def __repr__(self) -> str:
        return f"GlydStaticLayer(index={self.index})"

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._cache._make_pool(key_states, value_states)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        pool = self._cache.pool
        t = key_states.shape[2]
        fused = t == 1 and self._cache.fused
        if fused and getattr(self._cache._attn_config, "_attn_implementation", None) != hf_attention.ATTN_NAME:
            # the model's own attention would see this token's states only: refuse rather than attend wrongly
            hf_attention.check_fused(self._cache._attn_config, "GlydStaticCache")
        if self.index == 0:  # once a forward, before any layer writes: every layer reads the new lengths
            if t == 1 and not torch.compiler.is_compiling():
                pool.poll()  # an eager step: raise on an overflow seen since (no host wait)
                pool.admit_step()  # a step into a full pool: refused before lens moves (host count only)
            elif t > 1:
                pool.admit(t)  # a prompt past the context: refused before lens moves (compiled: see pool._refused)
            pool.advance(t)
        try:
            first = pool.write(self.index, key_states, value_states)
        except GlydError:
            if self.index == 0:  # refused before any layer wrote: the cache stays as it was
                pool.advance(-t)
            raise
        if fused:
            hf_attention._LIVE[self.index] = (key_states, self)  # the "glyd_kv" attention reads the pool (for this key)
            return key_states, value_states
        if first is not None and (first == 0 or first + t > pool.context):
            # a prompt into an empty cache: it holds exactly these states (or one that a compiled graph
            # refuses, see FixedPagePool._refused: the graph raises before they are used)
            return key_states, value_states
        return pool.to_bf16(self.index)

    def attend(self, q: torch.Tensor, scale: float | None = None, starts: torch.Tensor | None = None,
               valid: torch.Tensor | None = None) -> torch.Tensor:
        """Decode attention of ``q [B, Hq, D]`` over this layer's tokens (the ``"glyd_kv"`` attention calls it;
        ``valid [B, S]``: the attention mask's row, see :meth:`glyd.kv.pool.FixedPagePool.attend`)."""
        return self._cache.pool.attend(self.index, q, scale=scale, starts=starts, valid=valid)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self._cache.fused:  # the fused attention reads the mask's row for the step's query, a byte a position
            # (a prompt longer than the context is refused in update; wide enough to be traced up to there)
            return max(self._cache.context, query_length), 0
        # the reference path hands the model's attention the held keys: a mask of their length (host sync)
        held = int(self._cache.pool.lens.max()) if self.is_initialized else 0
        return held + query_length, 0

    @property
    def is_compileable(self) -> bool:  # the reference path's shapes grow every step
        return self._cache.fused

    def get_seq_length(self):
        # a 0-d device tensor, as transformers' StaticLayer: read on the host only where the caller wants to
        return self._cache.pool.lens[0] if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self._cache.context

    def reset(self) -> None:
        if self.index == 0 and self._cache.pool is not None:
            self._cache.pool.reset()

    def offload(self):  # the pool stays where it is
        return None

    def prefetch(self):
        return None


class GlydStaticCache(Cache):
    """A static, lossless KV cache: a pool of kvf12 pages reserved once, read in place by the fused attention.

    ``max_cache_len``: tokens a sequence (rounded up to whole pages); or ``memory_fraction`` with
    ``batch_size`` and ``device``: the largest pool that fits in that share of the free GPU memory
    (made at once). With ``max_cache_len``, the pool is made at the first prompt on its keys' device
    (as transformers' ``StaticCache`` places its tensors); ``batch_size`` and ``device`` (both optional)
    are checked against that prompt (another device is refused, never silently taken).
    ``exc_fraction``: the share of values reserved for exceptions, in (0, 1]. ``fused=True`` (default)
    needs :func:`glyd.kv.enable_fused` on the model first. Full-attention layers with bf16 keys and
    values only. ``glyd.from_pretrained(..., kv="lossless")`` hands ``generate`` one sized for the call
    (``glyd.kv.generate``).

    >>> from glyd.kv import GlydStaticCache, enable_fused                    # doctest: +SKIP
    >>> enable_fused(model)                                                   # doctest: +SKIP
    >>> cache = GlydStaticCache(model.config, max_cache_len=1024)             # doctest: +SKIP
    >>> out = model.generate(ids, max_new_tokens=64, past_key_values=cache)   # doctest: +SKIP
    """

    #: The page code the pool holds (``GlydCache.code``'s counterpart).
    code = "kvf12"

    def __init__(self, config, max_cache_len: int | None = None, *, page_size: int = DEFAULT_PAGE,
                 fused: bool = True, batch_size: int | None = None, device: torch.device | str | None = None,
                 memory_fraction: float | None = None, exc_fraction: float = EXC_FRACTION):
        if config is None:
            raise FormatError("GlydStaticCache needs the model's config (its layers and attention)")
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        bad = sorted(set(types) - {"full_attention"})
        if bad:
            raise FormatError(f"GlydStaticCache supports full-attention layers only; config.layer_types has {bad}")
        if fused:
            hf_attention.check_fused(config, "GlydStaticCache")
        self._device = _check_args(max_cache_len, batch_size, device, memory_fraction, exc_fraction)
        self.fused = fused
        self.page_size = page_size
        self.exc_fraction = exc_fraction
        self.batch = batch_size  # sequences the pool holds (None: the first prompt's)
        if max_cache_len is not None and type(page_size) is int and page_size > 0:  # (a bad page: the pool refuses it)
            # whole pages, as the pool will hold: the first prompt's mask is sized from this before the pool is made
            max_cache_len = -(-max_cache_len // page_size) * page_size
        self.context = max_cache_len  # tokens a sequence
        self.pool: FixedPagePool | None = None
        self._config = text
        self._attn_config = config
        super().__init__(layers=[GlydStaticLayer(self, i) for i in range(text.num_hidden_layers)])
        if memory_fraction is not None:
            heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
            hd = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
            self.pool = FixedPagePool.from_memory(len(self.layers), batch_size, heads, hd, fraction=memory_fraction,
                                                  page=page_size, device=device, exc_fraction=exc_fraction)
            self.context = self.pool.context
            for layer in self.layers:
                layer.dtype, layer.device, layer.is_initialized = torch.bfloat16, self.pool.device, True
                layer.batch_size = batch_size

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        n = len(self.layers)
        if type(layer_idx) is not int or not 0 <= layer_idx < n:
            # a model with more layers than the config that made the cache: layers 0 .. n-1 took this forward's
            # tokens already, which no rewind undoes exactly (pages that filled were packed): empty the pool
            if self.pool is not None:
                self.pool.reset()
            raise FormatError(f"GlydStaticCache was made for {n} layers; layer {layer_idx!r} is not one of them (the "
                              f"model is not the one whose config made the cache): the cache was emptied")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def _make_pool(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.pool is not None:
            return
        for name, t in (("key_states", keys), ("value_states", values)):
            if t.dtype != torch.bfloat16:
                raise FormatError(f"GlydStaticCache holds bf16 only; {name} is {t.dtype} (load the model in bfloat16)")
            if t.dim() != 4:
                raise FormatError(f"{name} must be [batch, heads, tokens, head_dim], got {tuple(t.shape)}")
        b, h, _, d = keys.shape
        if self._device is not None and not _same_device(self._device, keys.device):
            # transformers' StaticCache places its tensors on the keys' device; a device= that says otherwise is
            # refused, never silently replaced by theirs
            raise UnsupportedError(f"GlydStaticCache was made for device {self._device}; key_states are on "
                                   f"{keys.device} (pass device={str(keys.device)!r}, or none: the pool goes where "
                                   f"the first prompt's keys are)")
        if self.batch is not None and b != self.batch:
            raise FormatError(f"GlydStaticCache was made for {self.batch} sequences; key_states hold {b}")
        self.pool = FixedPagePool(len(self.layers), b, h, d, self.context, page=self.page_size,
                                  v_head_dim=values.shape[3], device=keys.device, exc_fraction=self.exc_fraction)
        self.context = self.pool.context
        for layer in self.layers:
            layer.batch_size = b

    # -- sizes --------------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes the held tokens take in the pool (pages, exception entries, raw pages; host sync)."""
        return 0 if self.pool is None else self.pool.nbytes(int(self.pool.lens.max()))

    @property
    def bf16_nbytes(self) -> int:
        """Bytes the same keys and values take in a bf16 cache (host sync)."""
        if self.pool is None:
            return 0
        p = self.pool
        return 2 * int(p.lens.max()) * p.batch * p.heads * (p.head_dim + p.v_head_dim) * p.layers

    def check(self) -> None:
        """Raise ``glyd.kv.KVCapacityError`` if the pool overflowed (host sync; see ``FixedPagePool.check``)."""
        if self.pool is not None:
            self.pool.check()

    # -- surgery: rare, through the whole cache ------------------------------------------------------
    def reset(self) -> None:
        if self.pool is not None:
            self.pool.reset()

    def _rebuild(self, edit) -> None:
        pool = self.pool
        if pool is None or int(pool.lens.max()) == 0:
            return
        states = [edit(*pool.to_bf16(i)) for i in range(len(self.layers))]
        for i, (k, v) in enumerate(states):  # (a reorder that repeats a sequence repeats its exceptions too)
            for name, side, x in (("key", pool.k, k), ("value", pool.v, v)):
                n = pool.exceptions(x)
                if n > side.arena:
                    raise KVCapacityError(f"the edited cache's layer {i} {name}s take {n} exception entries, more than "
                                          f"the {side.arena} reserved (exc_fraction={pool.exc_fraction}): the cache is "
                                          f"unchanged; reserve more")
        pool.reset()
        t = states[0][0].shape[2]
        if t:
            pool.advance(t)
            for i, (k, v) in enumerate(states):
                pool.write(i, k.contiguous(), v.contiguous())

    def crop(self, tokens_to_remove: int) -> None:
        """Drop tokens from the end (a negative count; transformers' meaning since 5.20)."""
        if isinstance(tokens_to_remove, torch.Tensor) and tokens_to_remove.dim() == 0 \
                and not tokens_to_remove.is_floating_point() and tokens_to_remove.dtype != torch.bool:
            tokens_to_remove = int(tokens_to_remove)
        if not hasattr(tokens_to_remove, "__index__") or isinstance(tokens_to_remove, bool):
            raise FormatError(f"crop({tokens_to_remove!r}): tokens_to_remove must be an int (negative: tokens to drop)")
        tokens_to_remove = int(tokens_to_remove)
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove")
        if tokens_to_remove < 0:
            self._rebuild(lambda k, v: (k[:, :, :tokens_to_remove], v[:, :, :tokens_to_remove]))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.pool is not None:
            if not isinstance(beam_idx, torch.Tensor) or beam_idx.is_floating_point() or beam_idx.is_complex() \
                    or beam_idx.dtype == torch.bool:
                what = beam_idx.dtype if isinstance(beam_idx, torch.Tensor) else type(beam_idx).__name__
                raise FormatError(f"GlydStaticCache.reorder_cache: beam_idx must be an integer tensor, got {what}")
            if beam_idx.dim() != 1:
                raise FormatError(f"GlydStaticCache.reorder_cache: beam_idx must be 1-D, got shape "
                                  f"{tuple(beam_idx.shape)}")
            if beam_idx.shape[0] != self.pool.batch:
                raise UnsupportedError(f"GlydStaticCache.reorder_cache: {beam_idx.numel()} indices for "
                                       f"{self.pool.batch} sequences; {_FIXED_BATCH}")
            n = beam_idx.tolist()  # (a host sync; the rewrite below syncs anyway)
            if min(n) < 0 or max(n) >= self.pool.batch:
                raise FormatError(f"GlydStaticCache.reorder_cache: indices must be in 0..{self.pool.batch - 1}, "
                                  f"got {n}")
            idx = beam_idx.to(self.pool.device)
            self._rebuild(lambda k, v: (k.index_select(0, idx), v.index_select(0, idx)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise UnsupportedError(f"GlydStaticCache.batch_repeat_interleave({repeats}): {_FIXED_BATCH}")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise UnsupportedError(f"GlydStaticCache.batch_select_indices: {_FIXED_BATCH}")


def _check_args(max_cache_len, batch_size, device, memory_fraction, exc_fraction) -> torch.device | None:
    """Refuse a bad GlydStaticCache argument by name, before anything is made; ``device`` as a torch device."""
    if (max_cache_len is None) == (memory_fraction is None):
        raise FormatError("GlydStaticCache takes max_cache_len or memory_fraction (with batch_size and device)")
    if memory_fraction is not None and (batch_size is None or device is None):
        raise FormatError("memory_fraction needs batch_size and device: the pool is sized and made at once")
    if max_cache_len is not None and (type(max_cache_len) is not int or max_cache_len <= 0):
        raise FormatError(f"GlydStaticCache max_cache_len must be a positive int, got {max_cache_len!r}")
    if batch_size is not None and (type(batch_size) is not int or batch_size <= 0):
        raise FormatError(f"GlydStaticCache batch_size must be a positive int, got {batch_size!r}")
    check_fraction("GlydStaticCache exc_fraction", exc_fraction)
    if memory_fraction is not None:
        check_fraction("GlydStaticCache memory_fraction", memory_fraction)
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise FormatError(f"GlydStaticCache device must be a torch.device or a device name, got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise FormatError(f"GlydStaticCache device {device!r} is not a device ({cause(exc)})") from exc
    if memory_fraction is not None and dev.type != "cuda":
        raise FormatError(f"memory_fraction measures free GPU memory; on {device!r} pass max_cache_len instead")
    return dev


def _same_device(want: torch.device, got: torch.device) -> bool:
    """``got`` (a tensor's device) is ``want``: "cuda" without an index is the current GPU, as the pool names it."""
    if want.type != got.type:
        return False
    if want.index is None and want.type == "cuda":
        want = torch.device("cuda", torch.cuda.current_device())
    return want.index is None or want.index == got.index


# What a static pool says when asked to change its number of sequences (contrastive search and some
# custom_generate or assisted-decoding methods do).
_FIXED_BATCH = ("the static pool holds a fixed number of sequences, which this generation method (contrastive search, "
                "some custom_generate or assisted decoding) changes: pass past_key_values=glyd.kv.make_cache("
                "model.config) (the growing cache) instead")
