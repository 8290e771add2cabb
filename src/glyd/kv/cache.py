"""``GlydCache``: a transformers ``Cache`` whose layers hold keys and values in lossless pages.

Two page codes (``code=``): ``"kvf12"`` (the default; ``glyd.kv.fixed``: 12 bits a value plus rare
exceptions, about 0.75 of bf16, chosen for decode speed) and ``"kvtiered"`` (``glyd.kv.pages``: escape
tiers, about 0.68 of bf16, chosen for memory).

Reference path (default): ``update`` returns the whole cache unpacked to bf16, bit for bit the
tensors a ``DynamicCache`` would return, so the model's own attention (SDPA, eager, ...) runs
unchanged.

Fused path (``fused=True``, after :func:`enable_fused`): on one-token decode steps ``update``
returns only the new token's states, and the ``"glyd_kv"`` attention function reads the packed
pages with :func:`glyd.kv.decode_attention` (the Gluon or Triton kernel on CUDA, the torch twin elsewhere).
Prefill and every other call go through SDPA as usual.
"""

from __future__ import annotations

import functools
import warnings

import torch
import transformers
from packaging.version import Version
from transformers.cache_utils import Cache, DynamicLayer

from glyd.errors import FormatError
from glyd.kv.fixed import FixedPageStore
from glyd.kv.hf_attention import _PENDING, ATTN_NAME, check_fused, enable_fused, glyd_kv_attention  # noqa: F401
from glyd.kv.pages import PageStore

DEFAULT_PAGE = 64
#: The page codes a cache can hold, by name: the store class of each.
CODES = {"kvf12": FixedPageStore, "kvtiered": PageStore}
#: Old names of the codes, still taken (with a DeprecationWarning).
OLD_CODES = {"dense": "kvtiered"}
DEFAULT_CODE = "kvf12"

_TRANSFORMERS = Version(transformers.__version__).release
#: The keyword ``generate()`` takes a cache by: transformers 5.24 renamed ``past_key_values`` to
#: ``cache`` (the old name warns, FutureWarning); earlier releases know only ``past_key_values``.
GENERATE_CACHE_KW = "cache" if _TRANSFORMERS >= (5, 24) else "past_key_values"
# DynamicLayer.crop with a positive value (the legacy "final length") raises from transformers 5.20 on.
_LEGACY_CROP = _TRANSFORMERS < (5, 20)


class GlydLayer(DynamicLayer):
    """One attention layer's cache: a :class:`~glyd.kv.pages.PageStore` for keys and one for values."""

    is_compileable = False
    is_croppable = True

    def __init__(self, page_size: int = DEFAULT_PAGE, fused: bool = False, code: str = DEFAULT_CODE, **kwargs):
        super().__init__()
        if page_size <= 0 or page_size % 4:
            raise FormatError(f"page_size {page_size} must be a positive multiple of 4")
        self.page_size = page_size
        self.fused = fused
        self.code = _check_code(code)
        self._store = CODES[self.code]
        self._pending_id: int | None = None
        self.k_store: PageStore | None = None
        self.v_store: PageStore | None = None

    def __repr__(self) -> str:
        return f"GlydLayer(page_size={self.page_size}, code={self.code!r}, tokens={self.get_seq_length()})"

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        for name, t in (("key_states", key_states), ("value_states", value_states)):
            if t.dtype != torch.bfloat16:
                raise FormatError(f"GlydCache holds bf16 only; {name} is {t.dtype} (load the model in bfloat16)")
            if t.dim() != 4:
                raise FormatError(f"{name} must be [batch, heads, tokens, head_dim], got {tuple(t.shape)}")
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.k_store = self._store(b, h, d, self.page_size, key_states.device)
        self.v_store = self._store(b, value_states.shape[1], value_states.shape[3], self.page_size, key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        before = self.k_store.n_tokens
        self.k_store.append(key_states)
        self.v_store.append(value_states)
        if self._pending_id is not None:
            _PENDING.pop(self._pending_id, None)
            self._pending_id = None
        if before == 0:  # the cache held nothing before: it holds exactly these states
            return key_states, value_states
        if self.fused and key_states.shape[2] == 1:
            self._pending_id = id(key_states)
            _PENDING[self._pending_id] = (key_states, self)
            return key_states, value_states
        return self.k_store.to_bf16(), self.v_store.to_bf16()

    def get_seq_length(self) -> int:
        return self.k_store.n_tokens if self.is_initialized else 0

    # Layer surgery (crop, beams, batch selection) is rare: unpack, edit, repack.
    def _rebuild(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.is_initialized = False
        self.lazy_initialization(keys, values)
        self.k_store.append(keys)
        self.v_store.append(values)

    def _to_bf16(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_store.to_bf16(), self.v_store.to_bf16()

    def crop(self, tokens_to_remove: int) -> None:
        n = self.get_seq_length()
        if tokens_to_remove > 0 and not _LEGACY_CROP:  # as this transformers' DynamicLayer
            raise ValueError(f"crop({tokens_to_remove}): a positive value is not supported; pass a negative number "
                             f"of tokens to remove")
        if tokens_to_remove > 0:  # legacy meaning, as DynamicLayer: the final length
            if tokens_to_remove >= n:
                return
            tokens_to_remove = n - tokens_to_remove
        if tokens_to_remove == 0 or n == 0:
            return
        k, v = self._to_bf16()
        keep = max(n - abs(tokens_to_remove), 0)
        self._rebuild(k[:, :, :keep], v[:, :, :keep])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            k, v = self._to_bf16()
            idx = beam_idx.to(k.device)
            self._rebuild(k.index_select(0, idx), v.index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            k, v = self._to_bf16()
            self._rebuild(k.repeat_interleave(repeats, dim=0), v.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            k, v = self._to_bf16()
            self._rebuild(k[indices, ...], v[indices, ...])

    def reset(self) -> None:
        if self.is_initialized:
            b, h, d = self.k_store.batch, self.k_store.heads, self.k_store.head_dim
            self.k_store = self._store(b, h, d, self.page_size, self.device)
            self.v_store = self._store(b, self.v_store.heads, self.v_store.head_dim, self.page_size, self.device)

    def offload(self):  # the packed planes stay where they are
        return None

    def prefetch(self):
        return None

    @property
    def nbytes(self) -> int:
        return (self.k_store.nbytes + self.v_store.nbytes) if self.is_initialized else 0

    @property
    def bf16_nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        n = self.get_seq_length()
        k, v = self.k_store, self.v_store
        return 2 * n * (k.batch * k.heads * k.head_dim + v.batch * v.heads * v.head_dim)


def _check_code(code: str) -> str:
    if code in OLD_CODES:
        warnings.warn(f"GlydCache(code={code!r}) is deprecated: code={OLD_CODES[code]!r}", DeprecationWarning, stacklevel=3)
        return OLD_CODES[code]
    if code not in CODES:
        raise ValueError(f"code must be one of {sorted(CODES)}, got {code!r}")
    return code


class GlydCache(Cache):
    """A KV cache held losslessly compressed: ``code="kvf12"`` (default, about 0.75 of bf16 on real
    keys and values, the cheapest decode) or ``code="kvtiered"`` (about 0.68, escape tiers).

    Keys and values are packed in pages of ``page_size`` tokens; the newest tokens stay raw bf16
    until their page fills. Attention sees exactly the bf16 tensors a ``DynamicCache`` holds.

    >>> from glyd.kv import GlydCache                                        # doctest: +SKIP
    >>> out = model.generate(ids, max_new_tokens=32, past_key_values=GlydCache(model.config))
    ...                                                                       # doctest: +SKIP
    >>> tiered = GlydCache(model.config, code="kvtiered")                      # doctest: +SKIP
    """

    def __init__(self, config=None, page_size: int = DEFAULT_PAGE, fused: bool = False, code: str = DEFAULT_CODE):
        if page_size <= 0 or page_size % 4:
            raise FormatError(f"page_size {page_size} must be a positive multiple of 4")
        self.page_size = page_size
        self.fused = fused
        self.code = code = _check_code(code)
        if fused:
            check_fused(config, "GlydCache")
        if config is None:
            super().__init__(layer_class_to_replicate=functools.partial(GlydLayer, page_size, code=code))
            return
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        bad = sorted(set(types) - {"full_attention"})
        if bad:
            raise FormatError(f"GlydCache supports full-attention layers only; config.layer_types has {bad}")
        super().__init__(layers=[GlydLayer(page_size, fused, code) for _ in range(text.num_hidden_layers)])

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's pages, tails and raw tokens."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def bf16_nbytes(self) -> int:
        """Bytes the same keys and values take in a bf16 ``DynamicCache``."""
        return sum(layer.bf16_nbytes for layer in self.layers)


def make_cache(config=None, *, page_size: int = DEFAULT_PAGE, fused: bool = False,
               code: str = DEFAULT_CODE) -> GlydCache:
    """The growing cache: what ``glyd.from_pretrained(..., kv="lossless-tiered")`` hands to ``generate``
    (``code="kvtiered"``), and what to pass where ``kv="lossless"``'s static pool (``GlydStaticCache``,
    ``glyd.kv.generate``) refuses a generation method (``code="kvf12"``, the same pages).

    ``config`` is the model's ``PretrainedConfig`` (or None: layers are made on first use).
    ``fused=True`` needs :func:`enable_fused` on the model first.

    >>> cache = make_cache(model.config)                                     # doctest: +SKIP
    >>> model.generate(ids, past_key_values=cache, max_new_tokens=16)        # doctest: +SKIP
    """
    return GlydCache(config, page_size=page_size, fused=fused, code=code)
