"""Merging and unmerging a packed model (only when asked for a form the folder was not saved in)."""

from __future__ import annotations

import torch
from torch import nn

from glyd import ops as _ops
from glyd.hf._model import MERGE_GROUPS
from glyd.nn.modules import GlydLinear
from glyd.store import sha256_tensor


def merge_packed(model: nn.Module, exact: bool) -> int:
    n = 0
    for pname, parent in list(model.named_modules()):
        for attr, parts in MERGE_GROUPS.items():
            mods = [parent._modules.get(p) for p in parts]
            if hasattr(parent, attr) or any(not isinstance(m, GlydLinear) or m.splits for m in mods):
                continue
            if len({m.in_features for m in mods}) != 1 or len({m.bias is None for m in mods}) != 1:
                continue
            w = torch.cat([_ops.unpack(m.packed) for m in mods])
            layout = mods[0].layout
            p = _ops._pack(w, layout)
            bias = None if mods[0].bias is None else torch.cat([m.bias for m in mods])
            merged = GlydLinear(p, bias, exact=exact, splits=[m.out_features for m in mods], sha256=sha256_tensor(w.cpu()))
            setattr(parent, attr, merged)
            for part, mod in zip(parts, merged.parts()):
                setattr(parent, part, mod)
            n += 1
    return n


def unmerge_packed(model: nn.Module, exact: bool) -> int:
    n = 0
    for pname, parent in list(model.named_modules()):
        for attr, parts in MERGE_GROUPS.items():
            merged = parent._modules.get(attr)
            if not isinstance(merged, GlydLinear) or not merged.splits or len(merged.splits) != len(parts):
                continue
            w = _ops.unpack(merged.packed)
            biases = merged.bias.split(merged.splits) if merged.bias is not None else [None] * len(parts)
            for part, wi, bi in zip(parts, w.split(merged.splits), biases):
                wi = wi.contiguous()
                setattr(parent, part, GlydLinear(_ops._pack(wi, merged.layout), bi, exact=exact, sha256=sha256_tensor(wi.cpu())))
            del parent._modules[attr]
            n += 1
    return n
