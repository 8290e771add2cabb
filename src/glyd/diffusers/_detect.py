"""Whether a model, a class or a folder is diffusers', without importing diffusers.

A diffusers model can exist only once diffusers is imported, so a model or class is checked against
``sys.modules``; a folder is diffusers' when its config.json carries the fields diffusers writes
(``_class_name`` / ``_diffusers_version``), which transformers' configs never have.

>>> from torch import nn
>>> is_diffusers_model(nn.Linear(2, 2)), is_diffusers_class(nn.Linear)
(False, False)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from glyd.store._safetensors import read_json_bytes

#: config.json fields that diffusers writes for every model (``ConfigMixin.to_json_string``).
DIFFUSERS_KEYS = ("_class_name", "_diffusers_version")


def _model_mixin() -> type | None:
    if "diffusers" not in sys.modules:
        return None
    try:
        from diffusers.models.modeling_utils import ModelMixin
    except ImportError:
        return None
    return ModelMixin


def is_diffusers_class(cls: Any) -> bool:
    """True for a diffusers model class (a ``diffusers.ModelMixin`` subclass)."""
    mixin = _model_mixin()
    return mixin is not None and isinstance(cls, type) and issubclass(cls, mixin)


def is_diffusers_model(model: Any) -> bool:
    """True for a diffusers model (a ``diffusers.ModelMixin`` instance)."""
    return is_diffusers_class(type(model))


def folder_config(path: str | os.PathLike, subfolder: str | None = None) -> dict[str, Any]:
    """config.json of a local folder (``subfolder`` inside it) as a dict; {} when there is none or it
    cannot be read or parsed. One larger than any config is FormatError, refused before it is read."""
    p = Path(path) / (subfolder or "") / "config.json"
    if not p.is_file():  # (a FIFO would block the read: the loader says what the path is)
        return {}
    try:
        raw = read_json_bytes(p, "a config.json")
    except OSError:  # the loader says why it cannot be read
        return {}
    try:
        d = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # not diffusers'; the loader says what is wrong with it
        return {}
    return d if isinstance(d, dict) else {}


def is_diffusers_config(config: dict[str, Any]) -> bool:
    return any(k in config for k in DIFFUSERS_KEYS)


def wants_diffusers(name_or_path: Any, model_class: Any = None, subfolder: str | None = None) -> bool:
    """Whether ``glyd.from_pretrained(name_or_path, model_class=..., subfolder=...)`` is diffusers' to
    load: the class is a diffusers class, or the local folder's config.json is diffusers'."""
    if is_diffusers_class(model_class):
        return True
    if not isinstance(name_or_path, (str, os.PathLike)):
        return False
    return is_diffusers_config(folder_config(name_or_path, subfolder))
