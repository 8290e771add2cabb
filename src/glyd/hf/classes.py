"""Which transformers class glyd builds a model with: the caller's choice, else what config.json says.

``glyd.from_pretrained(path, model_class=...)`` takes a transformers class (``AutoModel``,
``AutoModelForSequenceClassification``, ``BertModel``, ...) or its name. Left out, the class is the
one config.json's ``architectures`` names (the class the checkpoint was saved from), else
``AutoModelForCausalLM`` as before. A concrete class is used through the ``Auto*`` class that maps
the config to it, when one does, so that a packed folder (``model_type: "glyd"``) is read through
``AutoConfig`` as transformers' own ``Auto*.from_pretrained`` reads it.

>>> from glyd.hf.classes import pick_class
>>> pick_class("AutoModel", {"model_type": "bert"}).__name__
'AutoModel'
>>> pick_class(None, {"model_type": "bert", "architectures": ["BertForSequenceClassification"]}).__name__
'AutoModelForSequenceClassification'
>>> pick_class(None, {"model_type": "llama"}).__name__
'AutoModelForCausalLM'
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from glyd.errors import FormatError, UnsupportedError, not_a_file, show_path
from glyd.store._config import own_model_type
from glyd.store._safetensors import load_json, read_json_bytes, short

log = logging.getLogger(__name__)

#: The class used when neither the caller nor config.json's ``architectures`` names one.
DEFAULT_CLASS = "AutoModelForCausalLM"

#: transformers' task classes tried first (in this order) for the one that maps a config to a named
#: class; every other ``Auto*`` class of ``transformers.models.auto.modeling_auto`` follows
#: (:func:`auto_classes`). Task classes, not architectures: which model types each one covers is
#: transformers' own table.
AUTO_CLASSES = (
    "AutoModelForCausalLM",
    "AutoModel",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForQuestionAnswering",
    "AutoModelForMaskedLM",
    "AutoModelForMultipleChoice",
    "AutoModelForNextSentencePrediction",
    "AutoModelForPreTraining",
)


def read_config(path: Path) -> dict[str, Any]:
    """config.json of a model folder as a dict ({} when it is missing: the loaders say so);
    FormatError naming it when it is not a JSON object glyd can read (malformed, nested too deeply,
    a duplicate key: transformers' own parser would raise RecursionError on some) or is larger than
    any config (``MAX_JSON_FILE_BYTES``, refused before it is read)."""
    p = path / "config.json"
    what = not_a_file(p)
    if what == "missing":
        return {}
    if what is not None:
        raise FormatError(f"{show_path(p)}: {what}, not a regular file (glyd reads no pipe or device: it could block "
                          "or never end)")
    d = load_json(read_json_bytes(p, "a config.json"), p)
    if not isinstance(d, dict):
        raise FormatError(f"{show_path(p)}: not a JSON object")
    return d


def check_model_type(cls: Any, config: dict[str, Any], where: object) -> None:
    """Raise FormatError unless ``config``'s own model type is a string, and (where ``cls`` is an
    ``Auto*`` class, which picks the model by it) a non-empty one: transformers' own errors are a
    ValueError of several lines, or a TypeError from deep inside."""
    own = own_model_type(config)
    if (own is not None and not isinstance(own, str)) or (_is_auto(cls) and not own):
        field = "quantization_config.original_model_type" if config.get("model_type") == "glyd" else "model_type"
        what = f"has no {field}" if own is None else f"{field} is {short(own)}, not the name of a model type"
        raise FormatError(f"{show_path(where)}: {what}: {cls.__name__} cannot tell which model to build (pass "
                          "model_class= a concrete transformers class)")


def _is_auto(cls: Any) -> bool:
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    return isinstance(cls, type) and issubclass(cls, _BaseAutoModelClass)


def _is_model(cls: Any) -> bool:
    from transformers import PreTrainedModel

    return isinstance(cls, type) and issubclass(cls, PreTrainedModel)


def _named(name: str) -> Any:
    import transformers

    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError, RuntimeError):
        return None


def auto_classes() -> list[str]:
    """Names of the ``Auto*`` model classes :func:`pick_class` looks through: :data:`AUTO_CLASSES`,
    then the others this transformers has (image classification, speech seq2seq, ...)."""
    from transformers.models.auto import modeling_auto

    rest = sorted(n for n in dir(modeling_auto) if n.startswith("Auto") and n not in AUTO_CLASSES
                  and _is_auto(getattr(modeling_auto, n, None)))
    return [*AUTO_CLASSES, *rest]


def _auto_for(cls: type, model_type: Any) -> type:
    """The ``Auto*`` class that maps configs of ``model_type`` to ``cls`` (``cls`` itself when none does)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
    except (KeyError, TypeError):
        return cls
    for name in auto_classes():
        auto = _named(name)
        mapping = getattr(auto, "_model_mapping", None)
        try:
            if mapping is not None and mapping[config_class] is cls:
                return auto
        except (KeyError, ValueError, ImportError, AttributeError):
            continue
    return cls


def _fits(cls: type, model_type: Any) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return issubclass(CONFIG_MAPPING[model_type], cls.config_class)
    except (KeyError, TypeError):
        return False


def pick_class(choice: Any, config: dict[str, Any]) -> type:
    """The transformers class to build the model of ``config`` (config.json's dict) with.

    ``choice``: a transformers model class or ``Auto*`` class, its name, or None (config.json's
    ``architectures``, else :data:`DEFAULT_CLASS`).
    """
    model_type = own_model_type(config)
    if choice is None:
        archs = config.get("architectures")
        name = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
        cls = _named(name) if name else None
        if not _is_model(cls):
            if name:
                log.info("config.json's architectures names %r, not a transformers class: loading with %s",
                         name, DEFAULT_CLASS)
            return _named(DEFAULT_CLASS)
        picked = _auto_for(cls, model_type)
        if picked is cls and not _fits(cls, model_type):
            log.info("config.json's architectures names %s, which does not build a %r model: loading with %s",
                     name, model_type, DEFAULT_CLASS)
            return _named(DEFAULT_CLASS)
        return picked
    if isinstance(choice, str):
        cls = _named(choice)
        if not (_is_auto(cls) or _is_model(cls)):
            raise UnsupportedError(f"model_class={choice!r}: not a transformers model class (e.g. 'AutoModel', "
                                   f"'AutoModelForSequenceClassification', 'BertModel')")
        choice = cls
    if _is_auto(choice):
        return choice
    if _is_model(choice):
        return _auto_for(choice, model_type)
    raise TypeError(f"model_class must be a transformers model class or its name, got {choice!r}")


def build_empty(cls: type, config: Any, **kwargs: Any) -> Any:
    """``cls`` built from ``config`` (under the caller's ``init_empty_weights``), in bfloat16."""
    import torch

    if _is_auto(cls):
        try:
            return cls.from_config(config, dtype=torch.bfloat16, **kwargs)
        except ValueError as exc:
            if "Unrecognized configuration class" not in str(exc):
                raise
            raise FormatError(f"{cls.__name__} has no model for config type {config.model_type!r}; choose the class "
                              f"with model_class=... (e.g. AutoModel)") from None
    kwargs.pop("trust_remote_code", None)
    return cls._from_config(config, dtype=torch.bfloat16, **kwargs)
