"""Models with random weights built from a config a tensor at a time: packed as each weight is made.

For timing and memory only (a model too large to hold in bf16 still runs packed): the model is
built on the meta device (no memory), then every parameter is made on the target device in turn
(normal with std ``initializer_range`` for matrices, 1 for norms, 0 for biases) and handed straight
to glyd's :class:`~glyd.hf.packer.Packer`, the same one that packs a checkpoint as it streams in.
So neither the host nor the GPU holds more bf16 weights than the tensor being packed (q|k|v or
gate|up: the parts of one merged product) beyond the packed model itself. ``layout=None`` makes the
plain bf16 model the same way (the same values for the same ``seed``).

Each tensor's values depend only on ``seed``, its name, its shape and the device (a generator
seeded from the name): :func:`random_tensor` makes any one of them again, which is how the tests
check the packed model bit for bit. The largest tensors are made first (the embeddings and the
output projection), while the device is still empty, so the packing's temporary arrays never meet
a nearly full GPU.

>>> from transformers import LlamaConfig                                    # doctest: +SKIP
>>> model = random_model(LlamaConfig(), layout="fixed12", device="cuda")     # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from glyd.errors import FormatError
from glyd.hf import hooks
from glyd.hf._model import check_layout, note_source, pick_device
from glyd.hf.classes import build_empty
from glyd.hf.memory import WeightsCount, check_packed, fit_layout, parse_memory
from glyd.hf.packer import Packer

log = logging.getLogger(__name__)

__all__ = ["random_model", "random_tensor", "build_order", "DEFAULT_STD"]

#: std of the random matrices when the config names no ``initializer_range``.
DEFAULT_STD = 0.02
#: Elements drawn in float32 at a time (the fp32 draw of a 1 G-element embedding would be 4 GB).
_CHUNK = 1 << 24


def tensor_seed(name: str, seed: int) -> int:
    """The generator seed of tensor ``name``: the CRC-32 of the run's ``seed`` and the name (32 bits:
    torch's CPU generator keeps only the low 32 bits of a seed)."""
    return zlib.crc32(f"{int(seed)}:{name}".encode("utf-8"))


def random_tensor(name: str, shape: tuple[int, ...], *, device: torch.device | str, std: float = DEFAULT_STD,
                  seed: int = 0, tiny_share: float = 0.0) -> torch.Tensor:
    """The bf16 values :func:`random_model` gives tensor ``name``: normal(0, ``std``) for a 2-D or
    larger weight, zeros for a bias, ones for any other 1-D tensor (norms). ``tiny_share`` (0 to 0.5) of a
    weight's values, at places drawn from its own generator, are 1e-30: outside every fixed12 exponent
    window, as 0.02-0.13% of real weights are (normal weights have about 0.008%).

    >>> a = random_tensor("lm_head.weight", (4, 8), device="cpu")
    >>> torch.equal(a.view(torch.int16), random_tensor("lm_head.weight", (4, 8), device="cpu").view(torch.int16))
    True
    """
    device = torch.device(device)
    if not 0.0 <= tiny_share <= 0.5:
        raise ValueError(f"tiny_share must be a share of the weights from 0 to 0.5, got {tiny_share}")
    if len(shape) < 2:
        fill = 0.0 if name.endswith("bias") else 1.0
        return torch.full(tuple(shape), fill, dtype=torch.bfloat16, device=device)
    out = torch.empty(tuple(shape), dtype=torch.bfloat16, device=device)
    flat = out.view(-1)
    g = torch.Generator(device=device).manual_seed(tensor_seed(name, seed))
    for start in range(0, flat.numel(), _CHUNK):  # in chunks: no full-size fp32 copy
        n = min(_CHUNK, flat.numel() - start)
        flat[start:start + n] = torch.randn(n, generator=g, device=device, dtype=torch.float32).mul_(std)
    count = int(flat.numel() * tiny_share)
    if count:  # places drawn after the values, from the same generator: the same tensor for the same arguments
        flat[torch.randint(0, flat.numel(), (count,), generator=g, device=device)] = 1e-30
    return out


def _unit(name: str) -> str:
    """The block a tensor belongs to: up to the first list index (``model.layers.3``), else its module."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return name.rpartition(".")[0]


def build_order(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Every parameter name of ``model`` (a tied one under each of its names), block by block, the
    blocks holding the largest tensors first and the others in model order; within a block, model
    order (so the parts of a merged product come together)."""
    params = list(model.named_parameters(remove_duplicate=False))
    units: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for name, p in params:
        units.setdefault(_unit(name), []).append((name, p))
    biggest = {u: max(p.numel() for _, p in ps) for u, ps in units.items()}
    order = sorted(units, key=lambda u: -biggest[u])
    top = biggest[order[0]] if order else 0
    layers = [u for u in units if biggest[u] < top]  # model order for all but the largest
    first = [u for u in order if biggest[u] == top]
    return [item for u in first + layers for item in units[u]]


def _place(model: nn.Module, name: str, p: nn.Parameter) -> None:
    parent, _, attr = name.rpartition(".")
    (model.get_submodule(parent) if parent else model)._parameters[attr] = p


def _std_of(config: Any) -> float:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    std = getattr(text, "initializer_range", None) or getattr(config, "initializer_range", None)
    return float(std) if isinstance(std, (int, float)) and std > 0 else DEFAULT_STD


def _meta_model(config: Any, model_class: Any) -> nn.Module:
    from accelerate import init_empty_weights

    if model_class is None:
        from transformers import AutoModelForCausalLM

        model_class = AutoModelForCausalLM
    with init_empty_weights(include_buffers=False):  # buffers (rotary tables) are real and small
        model = build_empty(model_class, config)
    # transformers does not tie under init_empty_weights: tie as a loaded model is tied, so a tied
    # output projection is the embedding's parameter (made once, packed once).
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def _make(model: nn.Module, order: list[tuple[str, nn.Parameter]], packer: Packer | None, *, device: torch.device,
          std: float, seed: int, progress: bool, desc: str, tiny_share: float = 0.0) -> None:
    """Make every tensor of ``order`` on ``device``: fed to ``packer`` (None: put in place, bf16)."""
    made: dict[int, nn.Parameter] = {}  # id of a meta parameter -> the parameter made for it (tied weights)
    for name, p in tqdm(order, desc=desc, unit="tensor", disable=not progress):
        if packer is not None and packer.tied_copy(name):
            continue  # an output projection or embedding tied to the packed embedding
        if packer is None and id(p) in made:
            _place(model, name, made[id(p)])
            continue
        t = random_tensor(name, tuple(p.shape), device=device, std=std, seed=seed, tiny_share=tiny_share)
        if packer is not None:
            packer.feed(name, t)
        else:
            made[id(p)] = nn.Parameter(t, requires_grad=False)
            _place(model, name, made[id(p)])
        del t


def random_model(config: Any, *, layout: str | None = None, device: str | torch.device | None = None,
                 merge: bool | None = None, exact: bool = False, seed: int = 0, std: float | None = None,
                 model_class: Any = None, progress: bool = True, memory_limit: int | str | None = None,
                 tiny_share: float = 0.0) -> nn.Module:
    """A model of transformers ``config`` with random weights, made a tensor at a time on ``device``.

    ``layout`` (``"fixed12"``, ``"tiered"``, ``"auto"``): every weight glyd packs is packed as it is
    made (``merge``: q|k|v and gate|up as one product each; default on for a GPU); ``None``: the
    plain bf16 model. ``std``: of the random matrices (default the config's ``initializer_range``,
    else 0.02). ``model_class``: the transformers class (default ``AutoModelForCausalLM``).
    ``memory_limit``: the layout chosen or checked as ``glyd.from_pretrained``'s (``glyd.hf.memory``;
    with ``layout=None`` it is read, and a bad one refused, but the bf16 model has nothing to fit).
    ``tiny_share``: of every matrix's values made 1e-30, outside fixed12's window (:func:`random_tensor`), so
    that the kernels meet real weights' share of exceptions.
    Tensors are not hashed (a saved model hashes its weights then). See the module docstring.

    >>> from transformers import LlamaConfig
    >>> cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...                   vocab_size=64)
    >>> m = random_model(cfg, layout="fixed12", device="cpu", progress=False)
    >>> type(m.model.layers[0].mlp.down_proj).__name__
    'GlydLinear'
    """
    if layout is not None:
        check_layout(layout)
    dev = pick_device(device)
    t0 = time.perf_counter()
    model = _meta_model(config, model_class)
    limit = None if memory_limit is None else parse_memory(memory_limit)  # read even where bf16 needs none
    if layout is None:
        limit = None
    if limit is not None:  # nothing made or packed yet
        count = WeightsCount.of(model)
        layout = fit_layout(count, layout, limit)
    std = _std_of(config) if std is None else float(std)
    if not 0.0 <= tiny_share <= 0.5:
        raise ValueError(f"tiny_share must be a share of the weights from 0 to 0.5, got {tiny_share}")
    order = build_order(model)
    total = sum(p.numel() for _, p in model.named_parameters())
    log.info("random %s: %.3f B weights (normal, std %g%s; norms 1), made a tensor at a time on %s, %s",
             type(model).__name__, total / 1e9, std, f", {tiny_share:.4%} of them 1e-30" if tiny_share else "", dev,
             f"packed as {layout}" if layout else "kept in bf16")
    if merge is None:
        merge = dev.type == "cuda"
    packer = None if layout is None else Packer(model, layout=layout, merge=bool(merge), exact=exact, device=dev,
                                                hash_weights=False)
    desc = f"glyd: random weights ({layout or 'bf16'})"
    try:
        _make(model, order, packer, device=dev, std=std, seed=seed, progress=progress, desc=desc,
              tiny_share=tiny_share)
    finally:
        if packer is not None:
            packer.close()
    if packer is not None:
        packer.finish("random model")
        if limit is not None:
            check_packed(packer, count, limit)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise FormatError(f"random model: tensor(s) not made: {', '.join(left[:5])}")
    model.to(dev).eval()
    if packer is not None:
        note_source(model, None, None)
        hooks.wire(model)
        log.info("random model packed in %.1f s: %d matrices (%s), %.3f GB, %.3f bits a weight",
                 time.perf_counter() - t0, sum(packer.layouts.values()),
                 ", ".join(f"{k} x{v}" for k, v in sorted(packer.layouts.items())), packer.packed_bytes / 1e9,
                 8 * packer.packed_bytes / max(packer.weights, 1))
    else:
        log.info("random bf16 model made in %.1f s", time.perf_counter() - t0)
    return model
