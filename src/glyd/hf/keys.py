"""Checkpoint key -> model tensor name, as transformers' own loader maps them.

transformers 5 renames some modules (ViT's ``encoder.layer.N.attention.attention.query`` is now
``layers.N.attention.q_proj``) and keeps reading the old checkpoints through its conversion mapping;
its ``save_pretrained`` even writes the old names back. glyd's streaming loader reads the shards one
tensor at a time, so it asks transformers for the same mapping (``get_model_conversion_mapping``)
and applies its renamings: the table is transformers', kept by transformers, not glyd's.

A checkpoint key that needs a *conversion* (several tensors fused or one split, for example MoE
experts stacked into one tensor) is resolved to its target and transformers' converter by
:func:`checkpoint_resolver`; ``glyd.hf.convert`` gathers the tensors of each target and runs the
converter's own operations before the result is packed. :func:`checkpoint_namer` (names only)
refuses such a key with :class:`glyd.errors.UnsupportedError`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from torch import nn

from glyd.errors import UnsupportedError, show_path

log = logging.getLogger(__name__)


def _conversions(model: nn.Module) -> tuple[list, list] | None:
    """(renamings, converters) transformers applies when it loads ``model``'s checkpoints (None if this
    transformers has no conversion mapping)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
    except ImportError:
        return None
    try:
        mapping = get_model_conversion_mapping(model)
    except (AttributeError, TypeError):  # not a PreTrainedModel, or an API this glyd does not know
        return None
    return ([t for t in mapping if isinstance(t, WeightRenaming)],
            [t for t in mapping if isinstance(t, WeightConverter)])


def checkpoint_resolver(model: nn.Module, names: set[str], where: str) -> Callable[[str], tuple[str, Any, str | None]]:
    """A function from a checkpoint key to (the name of the model's tensor that it fills, the
    transformers ``WeightConverter`` that makes that tensor or None, the converter's source pattern
    that the key matched or None).

    ``names`` are the model's state-dict names; ``where`` (the folder) goes into log messages. A key
    that already names a tensor, with or without the model's ``base_model_prefix``, is used as it
    is; any other goes through transformers' renamings and converters.

    >>> resolve = checkpoint_resolver(nn.Linear(2, 2), {"weight", "bias"}, "folder")
    >>> resolve("weight")
    ('weight', None, None)
    """
    prefix = getattr(model, "base_model_prefix", "") or ""
    conv = None
    looked = False

    def resolve(key: str) -> tuple[str, Any, str | None]:
        nonlocal conv, looked
        if key in names:
            return key, None, None
        if prefix and f"{prefix}.{key}" in names:
            return f"{prefix}.{key}", None, None
        if not looked:
            conv, looked = _conversions(model), True
        if conv is None:
            return key, None, None
        from transformers.core_model_loading import rename_source_key

        renamings, converters = conv
        renamed, pattern = rename_source_key(key, renamings, converters, prefix or None, dict.fromkeys(names, True))
        if pattern is not None:
            converter = next(c for c in converters if pattern in c.source_patterns)
            return renamed, converter, pattern
        if renamed != key:
            log.debug("%s: checkpoint key %s is %s in this transformers", show_path(where), key, renamed)
        return renamed, None, None

    return resolve


def checkpoint_namer(model: nn.Module, names: set[str], where: str) -> Callable[[str], str]:
    """A function from a checkpoint key to the name of the model's tensor that it fills (see
    :func:`checkpoint_resolver`); a key that transformers converts (fuses or splits) is refused.

    >>> namer = checkpoint_namer(nn.Linear(2, 2), {"weight", "bias"}, "folder")
    >>> namer("weight")
    'weight'
    """
    resolve = checkpoint_resolver(model, names, where)

    def name_of(key: str) -> str:
        name, converter, _ = resolve(key)
        if converter is not None:
            raise UnsupportedError(f"{show_path(where)}: tensor {key!r} is stored in an older layout that "
                                   "transformers converts while loading "
                                   f"({converter!r} -> {name!r}); read the folder with "
                                   f"glyd.from_pretrained, which converts it")
        return name

    return name_of
