"""Mixture-of-experts models: which experts modules glyd packs, and how they are packed, loaded back
from a glyd folder and listed with the model's other packed tensors.

transformers 5 holds an MoE block's experts as fused 3-D parameters of one module (``gate_up_proj``
``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``; ``glyd.nn.experts``); each is packed expert by expert
(``glyd.codec.experts``) into a ``GlydExperts``. A checkpoint that stores one matrix per expert
(Mixtral's ``experts.0.w1.weight``, Qwen3-MoE's ``experts.0.gate_proj.weight``) is fused first by
transformers' own conversion mapping (``glyd.hf.convert``). Older transformers held experts as
``nn.Linear`` modules: those are packed as any linear.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from glyd.codec import PackedExperts
from glyd.codec.experts import LENS
from glyd.errors import CorruptError, FormatError, show_path
from glyd.nn.experts import GlydExperts, is_packable
from glyd.nn.modules import GlydEmbedding, GlydLinear

log = logging.getLogger(__name__)

__all__ = ["ExpertsPlan", "PACKED_KINDS", "experts_entries", "module_tensors", "packed_tensors", "place_experts",
           "unpack_tensor"]


class ExpertsPlan:
    """The experts weights of a model that the packer packs: ``wants(name)``, ``take(name, packed,
    sha)`` for each as it is packed; the module is swapped for a ``GlydExperts`` when all its
    packed weights are in."""

    def __init__(self, model: nn.Module, exact: bool) -> None:
        self.model = model
        self.exact = exact
        self.params: dict[str, tuple[str, str]] = {}  # weight name -> (module name, attribute)
        self._got: dict[str, dict[str, tuple[PackedExperts, Any]]] = {}
        for mname, m in model.named_modules():
            for attr in is_packable(m):
                self.params[f"{mname}.{attr}" if mname else attr] = (mname, attr)

    def wants(self, name: str) -> bool:
        return name in self.params

    def shape_of(self, name: str) -> tuple[int, ...]:
        """The shape the model's weight ``name`` has."""
        mname, attr = self.params[name]
        return tuple((self.model.get_submodule(mname) if mname else self.model)._parameters[attr].shape)

    def take(self, name: str, packed: PackedExperts, sha: Any) -> GlydExperts | None:
        """Record weight ``name`` packed (``sha``: its sha256 or a future of it); the new module once
        its experts module is complete, else None."""
        mname, attr = self.params.pop(name)
        got = self._got.setdefault(mname, {})
        got[attr] = (packed, sha)
        source = self.model.get_submodule(mname) if mname else self.model
        if set(got) != set(is_packable(source)):
            return None
        del self._got[mname]
        module = GlydExperts(source, {a: p for a, (p, _) in got.items()}, exact=self.exact)
        parent, _, child = mname.rpartition(".")
        setattr(self.model.get_submodule(parent) if parent else self.model, child, module)
        return module

    def missing(self) -> list[str]:
        return sorted(self.params)


def packed_tensors(model: nn.Module) -> Iterator[tuple[str, nn.Module, Any, str | None]]:
    """Every packed tensor of ``model``: (its name in the checkpoint, its module, the ``Packed`` or
    ``PackedExperts``, the sha256 of the original recorded at packing time or None)."""
    for name, m in model.named_modules():
        try:
            tensors = list(module_tensors(name, m))
        except (FormatError, CorruptError) as exc:
            if not isinstance(m, GlydExperts) or not name:
                raise
            raise type(exc)(f"{name}: {exc}") from exc  # a GlydExperts names its weight, not itself
        yield from tensors


#: The module classes that hold packed tensors.
PACKED_KINDS = (GlydLinear, GlydEmbedding, GlydExperts)


def module_tensors(name: str, m: nn.Module) -> Iterator[tuple[str, nn.Module, Any, str | None]]:
    """The packed tensors of module ``m`` (named ``name``), as :func:`packed_tensors` yields them."""
    if isinstance(m, (GlydLinear, GlydEmbedding)):
        yield f"{name}.weight", m, m.packed, m.sha256
    elif isinstance(m, GlydExperts):
        for w in m.weights:
            yield f"{name}.{w}" if name else w, m, m.packed(w), m.sha256.get(w)


def unpack_tensor(p: Any) -> torch.Tensor:
    """The bf16 tensor of a ``Packed`` or ``PackedExperts`` where it lives, bit for bit."""
    from glyd import ops
    from glyd.ops import experts as experts_ops

    return experts_ops.unpack_experts(p) if isinstance(p, PackedExperts) else ops.unpack(p)


def experts_entries(packed: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The entries of ``checkpoint_layout``'s packed tensors that are experts (they have ``lens``)."""
    return {n: e for n, e in packed.items() if LENS in e["arrays"]}


def place_experts(model: nn.Module, folder: Path, entries: dict[str, dict[str, Any]], manifest: dict[str, Any],
                  exact: bool) -> None:
    """Swap each experts module named by ``entries`` (packed experts from the shard headers:
    ``{layout, arrays: {array: (dtype, shape)}}``) for a ``GlydExperts`` with meta buffers of the
    checkpoint's shapes, for transformers' loader to fill."""
    by_module: dict[str, dict[str, dict[str, Any]]] = {}
    for name, e in entries.items():
        mname, _, attr = name.rpartition(".")
        by_module.setdefault(mname, {})[attr] = e
    for mname, weights in by_module.items():
        try:
            source = model.get_submodule(mname) if mname else model
        except AttributeError:
            raise FormatError(f"{show_path(folder)}: packed experts {mname}.{next(iter(weights))!r} name no module of "
                              "the model") from None
        want = is_packable(source)
        if set(weights) != set(want):
            raise FormatError(f"{show_path(folder)}: {mname} ({type(source).__name__}) packs "
                              f"{', '.join(want) or 'nothing'} as experts; the "
                              f"checkpoint packs {', '.join(sorted(weights))}")
        packed, shas = {}, {}
        for attr, e in weights.items():
            name = f"{mname}.{attr}" if mname else attr
            entry = manifest.get("tensors", {}).get(name, {})
            shape = tuple(source._parameters[attr].shape)
            if tuple(entry.get("shape", ())) != shape:
                raise FormatError(f"{show_path(folder)}: tensor {name!r} is {entry.get('shape')} in glyd.json but the "
                                  f"model needs {list(shape)}")
            meta = {a: torch.empty(s, dtype=dt, device="meta") for a, (dt, s) in e["arrays"].items()}
            try:
                packed[attr] = PackedExperts(entry["layout"], shape, meta, entry["format_version"])
            except FormatError as exc:
                raise FormatError(f"{show_path(folder)}: tensor {name!r}: {exc}") from exc
            shas[attr] = entry.get("sha256")
        parent, _, child = mname.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child,
                GlydExperts(source, packed, exact=exact, sha256=shas))
