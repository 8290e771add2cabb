"""Glyd: lossless bf16 weight compression with GPU kernels that multiply from the packed form.

>>> import torch, glyd
>>> w = torch.randn(64, 96).mul(0.02).to(torch.bfloat16)
>>> p = glyd.pack(w, layout="fixed12")
>>> torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16))
True

``import glyd`` imports nothing heavy (so that ``glyd --version`` answers at once): torch and numpy
are imported with the first name that needs them (``glyd.pack``, ``glyd.Packed``, ...), Triton
kernels and the transformers integration on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from glyd._version import __version__
from glyd.errors import CorruptError, DestinationExistsError, FormatError, GlydError, UnsupportedError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from glyd.codec import LAYOUTS, Packed, unpack  # noqa: F401

# ``quant_method: "glyd"`` for transformers, registered when (and only if) transformers is imported.
from glyd.hf._register import install as _install_hf_hook

_install_hf_hook()

# The registry's ``glyd`` is another product with this import name: say so if it is installed here.
from glyd._dist import warn_conflicts as _warn_conflicts

_warn_conflicts()

# Public names imported on first use: the codec's (torch, numpy) and those of modules with heavy
# dependencies (transformers, triton).
_LAZY = {
    "LAYOUTS": "glyd.codec",
    "Packed": "glyd.codec",
    "unpack": "glyd.codec",
    "verify": "glyd.hf",
    "GlydLinear": "glyd.nn",
    "GlydEmbedding": "glyd.nn",
    "GlydCache": "glyd.kv",
}
#: Sub-packages reachable as attributes (``glyd.codec``, ``glyd.ops``, ...) without importing them first.
_SUBPACKAGES = ("codec", "ops", "kernels", "nn", "store", "kv", "filecodec", "hf", "diffusers", "apps")

__all__ = [
    "__version__",
    "LAYOUTS",
    "Packed",
    "pack",
    "unpack",
    "GlydError",
    "FormatError",
    "CorruptError",
    "DestinationExistsError",
    "UnsupportedError",
    "from_pretrained",
    "save_pretrained",
    "compress",
    *_LAZY,
]


def pack(matrix: torch.Tensor, layout: str = "fixed12") -> Packed:
    """Pack a 2-D bf16 matrix losslessly, on the matrix's device: a CPU matrix with the CPU
    reference codec, a CUDA matrix with torch ops on the GPU (bit-identical). ``glyd.unpack`` gives
    every bit back.

    ``layout``: ``"fixed12"`` (12 bits a weight plus rare exceptions; fastest to decode),
    ``"tiered"`` (about 10.5-10.8 bits a weight), ``"dense11"`` (about 11.1-11.2 bits a weight, fixed
    rate with popcount-ranked escapes; its GPU kernels are not timed yet), any other layout in
    ``glyd.LAYOUTS``, or ``"auto"``: the layout ``glyd.ops.choose_layout`` picks for the matrix's
    shape on the matrix's device, from the kernel times measured on that GPU, as
    ``glyd.from_pretrained(layout="auto")`` and ``glyd pack --layout auto`` choose it; ``"fixed12"``
    for a CPU tensor or a GPU without measurements. Any shape; padding is internal.

    >>> import torch, glyd
    >>> p = glyd.pack(torch.zeros(2, 3, dtype=torch.bfloat16), layout="auto")
    >>> p.layout, p.shape, p.device.type
    ('fixed12', (2, 3), 'cpu')
    """
    import torch

    from glyd import codec

    if layout == "auto" or (isinstance(matrix, torch.Tensor) and matrix.is_cuda):
        from glyd import ops

        return ops._pack(matrix, layout)
    if layout not in codec.LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of auto, {', '.join(codec.LAYOUTS)}")
    return codec.pack(matrix, layout)


def _models(diffusers: bool) -> Any:
    # transformers models are glyd.hf's, diffusers models glyd.diffusers' (each imports its library lazily)
    return importlib.import_module("glyd.diffusers" if diffusers else "glyd.hf")


def from_pretrained(name_or_path: Any, **kwargs: Any) -> Any:
    """Load a model with packed weights: a transformers model (``glyd.hf.from_pretrained``: causal
    LMs, encoders, ...) or a diffusers model (``glyd.diffusers.from_pretrained``: a folder whose
    config.json diffusers wrote, or ``model_class=`` a diffusers class), from a bf16 folder (packed
    as it loads) or a glyd folder (loaded as it is). The keyword arguments are those of the one used.

    >>> model = glyd.from_pretrained("path/to/bf16-model", exact=True)                 # doctest: +SKIP
    >>> flux = glyd.from_pretrained("flux-glyd", subfolder="transformer", exact=True)  # doctest: +SKIP
    """
    from glyd.diffusers._detect import wants_diffusers

    diffusers = wants_diffusers(name_or_path, kwargs.get("model_class"), kwargs.get("subfolder"))
    return _models(diffusers).from_pretrained(name_or_path, **kwargs)


def save_pretrained(model: Any, path: Any, **kwargs: Any) -> Any:
    """Write a packed model as a glyd folder: transformers' layout (``glyd.hf.save_pretrained``) or,
    for a diffusers model, diffusers' (``glyd.diffusers.save_pretrained``).

    >>> glyd.save_pretrained(model, "model-glyd")                                      # doctest: +SKIP
    """
    from glyd.diffusers._detect import is_diffusers_model

    return _models(is_diffusers_model(model)).save_pretrained(model, path, **kwargs)


def compress(model: Any, **kwargs: Any) -> Any:
    """Pack a loaded bf16 model in place and return it: a transformers model or any ``nn.Module``
    (``glyd.hf.compress``), or a diffusers model (``glyd.diffusers.compress``). ``exact=True`` makes
    its outputs equal bf16's bit for bit.

    >>> glyd.compress(model, layout="fixed12")                                         # doctest: +SKIP
    >>> glyd.compress(pipe.transformer, exact=True)                                    # doctest: +SKIP
    """
    from glyd.diffusers._detect import is_diffusers_model

    return _models(is_diffusers_model(model)).compress(model, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"glyd.{name}")
    raise AttributeError(f"module 'glyd' has no attribute {name!r}")
