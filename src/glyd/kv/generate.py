"""glyd's lossless KV cache in transformers' ``generate`` (what ``glyd.from_pretrained(..., kv=...)`` wires).

``kv="lossless"`` (the ``kvf12`` page code): every ``generate`` call given no cache gets a
:class:`~glyd.kv.GlydStaticCache` (a static pool of kvf12 pages, read in place by the fused ``"glyd_kv"``
attention, which :func:`wire` switches the model to), sized as transformers sizes its own static cache
(``cache_implementation="static"``, transformers 5.17): ``max(num_beams, num_return_sequences)`` times the
batch's sequences, of ``max_length - 1`` positions (plus an ``inputs_embeds`` prompt's length), at least
``generation_config.max_cache_len`` and at least this model's previous pool (so that a compiled decode
step is not compiled again), rounded up to whole pages. ``kv="lossless-tiered"``: a growing
:class:`~glyd.kv.GlydCache` of ``kvtiered`` pages, as before (the static pool holds kvf12 pages only).

How: ``generate`` makes its default cache in ``GenerationMixin._prepare_cache_for_generation``, where it
knows the batch and the length. :func:`wire` puts a wrapper of that method on the model, which hands
``generate`` glyd's cache in place of the ``DynamicCache`` transformers made there. A cache the caller
passes, ``use_cache=False`` and a ``cache_implementation`` (the call's or the model's generation config's)
are transformers' as ever.
After ``generate`` returns, the pool is checked once (:meth:`GlydStaticCache.check`: a page whose
exceptions overflowed raises, never a wrong token kept silently; compiled decode steps cannot check).

What the pool cannot do is refused at the call, on one line that names the option: contrastive search
(``penalty_alpha`` with ``top_k > 1``: it repeats and selects the cache's sequences), a model spread over
several devices. An assistant model's ``generate`` (assisted decoding, when the assistant is itself wired)
gets the growing ``GlydCache`` of the same code: its cache is handed back to it call after call, each
call longer than the one it was sized for.

>>> model = glyd.from_pretrained(path, kv="lossless")                          # doctest: +SKIP
>>> out = model.generate(ids, max_new_tokens=64, return_dict_in_generate=True)  # doctest: +SKIP
>>> type(out.past_key_values).__name__                                          # doctest: +SKIP
'GlydStaticCache'
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from typing import Any

from glyd.errors import UnsupportedError
from glyd.kv.cache import CODES, make_cache
from glyd.kv.hf_attention import ATTN_NAME, enable_fused
from glyd.kv.static_cache import GlydStaticCache

log = logging.getLogger(__name__)

#: The page code whose caches are static pools (the others stay growing ``GlydCache``s).
POOL_CODE = "kvf12"
#: Attention implementations ``kv="lossless"`` replaces by ``"glyd_kv"`` (SDPA for prompts, the pool for steps).
REPLACEABLE_ATTENTION = (None, "sdpa", ATTN_NAME)
#: Generation modes the static pool cannot serve, and the options that ask for each.
REFUSED_MODES = {"contrastive_search": "penalty_alpha with top_k > 1 (contrastive search)"}
#: What the wrapper reads from ``_prepare_cache_for_generation``'s arguments (by name).
_ARGUMENTS = ("generation_config", "model_kwargs", "batch_size", "max_cache_length")
#: The model attribute holding the longest pool made for it (as transformers' ``_previous_max_cache_length``).
_LONGEST = "_glyd_previous_max_cache_length"
#: The caches made inside the current ``generate`` call (checked when it returns).
_MADE: contextvars.ContextVar[list | None] = contextvars.ContextVar("glyd_kv_made", default=None)

_INSTEAD = "pass past_key_values=glyd.kv.make_cache(model.config) (the growing cache) instead"


def wire(model: Any, code: str) -> None:
    """Give ``model.generate`` glyd's cache of page code ``code`` whenever it is given none (module doc);
    set ``model.glyd_make_cache`` (the cache ``generate`` gets: ``glyd_make_cache(max_cache_len)`` for
    kvf12) and ``model.glyd_make_growing_cache`` (a :class:`~glyd.kv.GlydCache` of that code).

    >>> wire(model, "kvf12")                                                # doctest: +SKIP
    """
    if code not in CODES:
        raise ValueError(f"code must be one of {sorted(CODES)}, got {code!r}")
    # wired before (another code): wrap transformers' own methods again, not glyd's wrappers
    prepare = _original(model._prepare_cache_for_generation)
    generate = _original(model.generate)
    signature = inspect.signature(prepare)
    missing = [name for name in _ARGUMENTS if name not in signature.parameters]
    if missing:
        import transformers

        raise UnsupportedError(f"kv= needs transformers' generate to make its cache in _prepare_cache_for_generation"
                               f"({', '.join(_ARGUMENTS)}); transformers {transformers.__version__} names no "
                               f"{', '.join(missing)}: load without kv= and {_INSTEAD}")
    if code == POOL_CODE:
        if not getattr(type(model), "_supports_attention_backend", False):
            raise UnsupportedError(f"kv='lossless' switches the model's attention to {ATTN_NAME!r}, which transformers' "
                                   f"{type(model).__name__} does not take (_supports_attention_backend is False): load "
                                   f"without kv= and {_INSTEAD}")
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in REPLACEABLE_ATTENTION:
            raise UnsupportedError(f"kv='lossless' runs the {ATTN_NAME!r} attention (SDPA for prompts, the static "
                                   f"pool for decode steps), not attn_implementation={impl!r}: leave it out, or load "
                                   f"without kv= and {_INSTEAD}")
        enable_fused(model)

    @functools.wraps(prepare)
    def prepare_cache(*args: Any, **kwargs: Any) -> Any:
        arguments = signature.bind(*args, **kwargs).arguments
        model_kwargs = arguments["model_kwargs"]
        given = {key: value for key, value in model_kwargs.items() if _is_cache(value)}
        result = prepare(*args, **kwargs)
        made = [key for key, value in model_kwargs.items() if _is_cache(value) and given.get(key) is not value]
        config = arguments["generation_config"]
        if made and config.cache_implementation is None:
            model_kwargs[_one(made, model_kwargs)] = cache = _cache_for(model, code, arguments)
            if config.is_assistant:  # as transformers does for the cache it made
                cache.activate_past_recording()
            caches = _MADE.get()
            if caches is not None:
                caches.append(cache)
        return result

    @functools.wraps(generate)
    def generate_with_glyd_cache(*args: Any, **kwargs: Any) -> Any:
        caches: list = []
        token = _MADE.set(caches)
        try:
            out = generate(*args, **kwargs)
        finally:
            _MADE.reset(token)
        for cache in caches:
            if isinstance(cache, GlydStaticCache):
                cache.check()  # one host sync: an overflowed pool raises, never a silent wrong token
        return out

    prepare_cache._glyd_original, generate_with_glyd_cache._glyd_original = prepare, generate
    model.__dict__["_prepare_cache_for_generation"] = prepare_cache
    model.__dict__["generate"] = generate_with_glyd_cache
    if code == POOL_CODE:
        model.__dict__["glyd_make_cache"] = functools.partial(GlydStaticCache, model.config)
    else:
        model.__dict__["glyd_make_cache"] = functools.partial(make_cache, model.config, code=code)
    model.__dict__["glyd_make_growing_cache"] = functools.partial(make_cache, model.config, code=code)


def _original(method: Any) -> Any:
    return getattr(method, "_glyd_original", method)


def _is_cache(value: Any) -> bool:
    from transformers.cache_utils import Cache

    return isinstance(value, Cache)


def _one(made: list[str], model_kwargs: dict) -> str:
    """The key of the one cache transformers made: a plain ``DynamicCache`` (glyd's cache takes its place)."""
    from transformers.cache_utils import DynamicCache

    kinds = {key: type(model_kwargs[key]).__name__ for key in made}
    if len(made) != 1 or type(model_kwargs[made[0]]) is not DynamicCache:
        raise UnsupportedError(f"kv=: transformers made {kinds} for this model (an encoder-decoder or another "
                               f"cache layout), where glyd's cache replaces one DynamicCache: load without kv= and "
                               f"pass a cache of your own")
    return made[0]


def _cache_for(model: Any, code: str, arguments: dict[str, Any]) -> Any:
    config = arguments["generation_config"]
    if code != POOL_CODE or config.is_assistant:
        return make_cache(model.config, code=code)
    mode = getattr(arguments.get("generation_mode"), "value", arguments.get("generation_mode"))
    if mode in REFUSED_MODES:
        raise UnsupportedError(f"generate({REFUSED_MODES[mode]}) repeats and selects the cache's sequences, which "
                               f"kv='lossless''s static pool holds a fixed number of: {_INSTEAD}")
    devices = sorted({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()})
    if len(devices) > 1:
        raise UnsupportedError(f"kv='lossless''s static pool lives on one device; this model spans {devices} "
                               f"(device_map): {_INSTEAD}")
    ceiling = getattr(config, "max_cache_len", None) or 0  # absent from older transformers
    length = max(int(arguments["max_cache_length"]), int(ceiling), getattr(model, _LONGEST, 0))
    model.__dict__[_LONGEST] = length
    batch = max(config.num_beams or 1, config.num_return_sequences or 1) * int(arguments["batch_size"])
    log.debug("kv='lossless': a static pool of %d sequences x %d positions", batch, length)
    return GlydStaticCache(model.config, max_cache_len=length, batch_size=batch)
