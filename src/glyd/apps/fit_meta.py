"""What ``glyd fit`` counts: the model transformers builds from a config, on the meta device.

The model is built by ``AutoModelForCausalLM.from_config`` under ``torch.device("meta")`` (no
memory, a 70B model in about a second), so the count is what the class really holds: MoE experts,
embeddings tied (or not) as the config and the class resolve them, GQA projections, biases. Which
weights Glyd packs is decided by the packer's own rules (``glyd.hf._model``: exact ``nn.Linear``
and plain ``nn.Embedding`` weights; ``glyd.nn.experts.is_packable``: the fused 3-D weights of an
MoE block's experts, packed expert by expert); every other parameter, routers included, stays
bf16. The KV cache is counted per layer from the config's ``layer_types``, as
transformers' caches do: a sliding-window or chunked layer holds at most its window of tokens.

>>> from glyd.apps.fit_meta import model_shape
>>> s = model_shape({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
...                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "num_local_experts": 4})
>>> s.params, s.packable, sorted(s.unpacked_matrices.items())
(234816, 233984, [('MixtralTopKRouter', 512)])
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Collection

from glyd.errors import FormatError, show_path
from glyd.hf.checks import EXPERT_KEYS, check_built_top_k, check_top_k, count_fields
from glyd.hf.memory import count_weights, packable_rows  # the loader's own count (memory_limit)
from glyd.nn.experts import is_packable as packable_experts
from glyd.store._safetensors import short

log = logging.getLogger(__name__)

#: Cache layer types whose KV cache ``glyd fit`` can size, and the config field of their window.
KV_LAYER_WINDOW = {"full_attention": None, "sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}
#: Refuse configs that would take long to build even on the meta device.
MAX_LAYERS = 4096
#: Config keys that are not the model's shape (a Glyd folder's quantization_config is ours; labels
#: size no causal LM, and transformers builds a table of num_labels entries).
_DROP = ("architectures", "quantization_config", "auto_map", "transformers_version", "torch_dtype", "dtype",
         "num_labels", "id2label", "label2id")


@dataclass
class AttentionLayer:
    """One layer's KV cache shape: ``window`` tokens at most (None: every token); ``heads``: its
    query heads (``kv_heads`` unless grouped-query attention shares each KV head among several)."""

    kv_heads: int
    head_dim: int
    window: int | None = None
    heads: int = 0

    def __post_init__(self) -> None:
        if self.heads <= 0:
            self.heads = self.kv_heads


@dataclass
class ModelShape:
    """What ``glyd fit`` needs to know about a model, counted on the meta device."""

    name: str
    model_type: str
    params: int  # every parameter, a tied one once
    packable: int  # elements of the weights Glyd packs
    hidden: int
    intermediate: int
    vocab: int
    max_positions: int | None
    attention: list[AttentionLayer]
    unpacked_matrices: Counter[str] = field(default_factory=Counter)  # module type -> elements of >= 2-D weights kept bf16
    packable_rows: tuple[tuple[int, int], ...] = ()  # (K, rows) of the packed matrices: the layouts pad K
    text_only: bool = False  # a multimodal config: the language model only
    experts: bool = False  # MoE experts among the packed weights (glyd pack keeps them bf16 or refuses the folder)

    @property
    def other(self) -> int:
        """Elements kept in bf16 (norms, biases, and any weight outside an nn.Linear/nn.Embedding)."""
        return self.params - self.packable


def _first_line(exc: BaseException) -> str:
    """``exc`` as one line of at most 200 characters (transformers' messages span several)."""
    line = " ".join(str(exc).split()) or type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def build_config(cfg: dict[str, Any]) -> Any:
    """The transformers config of ``cfg`` (a config.json's dict); FormatError if transformers cannot build it."""
    name = cfg.get("_name", "config")
    try:
        import transformers
        from transformers import AutoConfig
    except ImportError as exc:
        raise FormatError(f"{show_path(name)}: glyd fit needs transformers to read a config ({exc})") from exc
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise FormatError(f"{show_path(name)}: config has no model_type")
    params = {k: v for k, v in cfg.items() if not k.startswith("_") and k not in _DROP and k != "model_type"}
    for path, _, value in count_fields(params):  # before the config class builds a list a layer
        if not 0 <= value <= MAX_LAYERS:
            raise FormatError(f"{show_path(name)}: {show_path(path)} {short(value)} is not between 0 and {MAX_LAYERS}")
    check_top_k(params, name)  # a model that routes to no experts, or past them, is no model to fit
    try:
        config = AutoConfig.for_model(model_type, **params)
    except ValueError as exc:
        if "nrecognized" in str(exc) or "model_type" in str(exc):
            raise FormatError(f"{show_path(name)}: transformers {transformers.__version__} does not know "
                              f"model_type {model_type!r}") from exc
        raise FormatError(f"{show_path(name)}: transformers cannot read this {model_type} config "
                          f"({_first_line(exc)})") from exc
    except Exception as exc:  # any failure inside a config class means this config cannot be counted
        raise FormatError(f"{show_path(name)}: transformers cannot read this {model_type} config "
                          f"({_first_line(exc)})") from exc
    # again with the class's defaults: a top-k the config gives beside an experts count it leaves out
    check_built_top_k(config, name)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int) or not 0 < layers <= MAX_LAYERS:
        raise FormatError(f"{show_path(name)}: num_hidden_layers {layers!r} is not between 1 and {MAX_LAYERS}")
    heads, kv = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0 and heads % kv:
        # transformers builds it, and its first forward fails (repeat_kv): glyd eval --random's decode step
        raise FormatError(f"{show_path(name)}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                          f"{kv}: each key/value head serves a whole group of query heads")
    return config


def meta_model(config: Any, name: str = "config") -> Any:
    """``AutoModelForCausalLM.from_config(config)`` on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # any failure inside transformers' constructors: this model cannot be counted
        raise FormatError(f"{show_path(name)}: transformers cannot build a causal LM from this "
                          f"{getattr(config, 'model_type', '?')} config ({_first_line(exc)})") from exc
    return model


def check_no_empty_experts(cfg: dict[str, Any], model: Any, name: str = "config") -> None:
    """FormatError where an experts count of ``cfg`` is 0 and ``model`` (built from it) still holds
    MoE blocks, with no experts in them (an empty weight). transformers decides per model type:
    Qwen2-MoE and Qwen3-MoE build dense MLPs where ``num_experts`` is 0 (a dense model, counted as
    one; the top-k routes nothing); Mixtral and OLMoE build their MoE blocks whatever the count, and
    blocks of 0 experts fail at the first forward (torch.topk), so no such model exists to fit."""
    zero = [path for path, key, value in count_fields(cfg) if key in EXPERT_KEYS and value == 0]
    if not zero:
        return
    empty = next((n for n, p in model.named_parameters() if p.dim() >= 2 and p.numel() == 0), None)
    if empty is not None:
        raise FormatError(f"{show_path(name)}: {show_path(zero[0])} is 0, but transformers builds "
                          f"{getattr(model.config, 'model_type', '?')}'s MoE blocks whatever the count: blocks with "
                          f"no experts ({empty} is empty), which fail at the first forward; give the experts count "
                          "of the model")


def _positive(value: Any, key: str, name: str) -> Any:
    """``value`` of a config field a config class may take unchecked (an extra field): a positive int,
    or 0 / None (the field's default applies); FormatError naming it otherwise (true, "64", 64.5, a list)."""
    if value is None or (type(value) is int and value >= 0):
        return value
    raise FormatError(f"{show_path(name)}: {key} {short(value)} is not a positive integer")


def attention_layers(text: Any, name: str = "config") -> list[AttentionLayer]:
    """The KV cache shape of each layer of a (text) config, as transformers' caches size them."""
    n = text.num_hidden_layers
    heads = getattr(text, "num_attention_heads", None)
    hidden = getattr(text, "hidden_size", None)
    if not isinstance(heads, int) or not isinstance(hidden, int) or heads <= 0 or hidden <= 0:
        raise FormatError(f"{show_path(name)}: config lacks a positive hidden_size or num_attention_heads")
    kv_heads = _positive(getattr(text, "num_key_value_heads", None), "num_key_value_heads", name) or heads
    head_dim = _positive(getattr(text, "head_dim", None), "head_dim", name) or hidden // heads
    types = getattr(text, "layer_types", None)
    if types is None:  # transformers' own inference (cache_utils.get_layer_types_and_kwargs)
        if getattr(text, "sliding_window", None) is not None:
            types = ["sliding_attention"] * n
        elif getattr(text, "attention_chunk_size", None) is not None:
            types = ["chunked_attention"] * n
        else:
            types = ["full_attention"] * n
    shared = getattr(text, "num_kv_shared_layers", None)
    if isinstance(shared, int) and shared > 0:  # layers that reuse another layer's cache
        types = list(types)[:-shared]
    out = []
    for t in types:
        if t not in KV_LAYER_WINDOW:
            raise FormatError(f"{show_path(name)}: glyd fit cannot size the cache of a {t!r} layer")
        key = KV_LAYER_WINDOW[t]
        window = getattr(text, key, None) if key else None
        if key and not (isinstance(window, int) and not isinstance(window, bool) and window > 0):  # true is no window
            raise FormatError(f"{show_path(name)}: a {t!r} layer needs a positive {key}, the config has {window!r}")
        out.append(AttentionLayer(kv_heads, head_dim, window, heads))
    return out


def _widest(intermediate: Any, name: str) -> int:
    """The MLP width a prefill chunk's activations take: Gemma 3n gives one a layer (a list), the widest."""
    widths = list(intermediate) if isinstance(intermediate, (list, tuple)) else [intermediate]
    return max((_positive(v, "intermediate_size", name) or 0 for v in widths), default=0)


def model_shape(cfg: dict[str, Any], stored: Collection[str] | None = None) -> ModelShape:
    """Count ``cfg`` (a config.json's dict) on the meta device; FormatError names what cannot be counted.
    ``stored``: the tensor names of the bf16 folder, whose tied copies the loader may pack apart
    (``glyd.hf.memory.count_weights``)."""
    name = str(cfg.get("_name", "config"))
    config = build_config(cfg)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    attention = attention_layers(text, name)
    model = meta_model(config, name)
    check_no_empty_experts(cfg, model, name)
    params, packable, unpacked = count_weights(model, stored)
    hidden = int(text.hidden_size)
    max_pos = getattr(text, "max_position_embeddings", None)
    if unpacked:
        log.debug("%s: weights Glyd does not pack: %s", name, dict(unpacked))
    return ModelShape(
        name=name,
        model_type=str(config.model_type),
        params=params,
        packable=packable,
        hidden=hidden,
        intermediate=_widest(getattr(text, "intermediate_size", None), name) or 4 * hidden,
        vocab=int(getattr(text, "vocab_size", None) or 0),
        max_positions=max_pos if type(max_pos) is int and max_pos > 0 else None,  # not true: no bound
        attention=attention,
        unpacked_matrices=unpacked,
        packable_rows=packable_rows(model, stored),
        text_only=bool(cfg.get("_text_only")),
        experts=any(packable_experts(m) for m in model.modules()),
    )
