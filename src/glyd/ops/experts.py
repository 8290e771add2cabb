"""The op face of packed experts (``glyd.codec.experts``): each row of ``x`` multiplied by the expert
it was routed to, and the chosen experts unpacked.

* ``glyd::experts_linear(x, ids, layout, shape, arrays, version)``: row ``s`` of ``x`` [S, K] times
  expert ``ids[s]``'s matrix [N, K] transposed, [S, N] (x's dtype). The pure-torch twin (the
  default, every device) unpacks the experts that ``ids`` names, each once, and multiplies their
  rows with ``F.linear``; CUDA tensors take ``glyd.kernels.experts`` (a grouped GEMV that reads only
  the chosen experts' packed fixed12 weights, or the existing fused product an expert).
* ``glyd::unpack_experts(layout, shape, arrays, version, index)``: experts ``index`` as bf16
  ``[len(index), N, K]``, bit for bit (the GPU decode kernel on CUDA: one launch for a run of fixed12
  experts with K a multiple of 64, one an expert otherwise).

A packed experts tensor travels as its layout, true shape ``[E, N, K]``, format version and arrays
(the layout's ``ARRAYS`` order, then ``lens``). Importing this module defines the ops (``glyd.nn``
imports it); it imports no Triton.

>>> import torch
>>> from glyd.ops import experts
>>> w = (torch.randn(4, 8, 16) * 0.02).to(torch.bfloat16)
>>> p = experts.pack_experts(w, "fixed12")
>>> x, ids = torch.randn(3, 16).to(torch.bfloat16), torch.tensor([2, 0, 2])
>>> y = experts.experts_linear(x, ids, p)
>>> torch.equal(y[1].view(torch.int16), torch.nn.functional.linear(x[1:2], w[0])[0].view(torch.int16))
True
"""

from __future__ import annotations

import weakref
from typing import Sequence

import torch
import torch.nn.functional as F

from glyd.codec import LAYOUTS, PackedExperts, unpack_experts as _codec_unpack_experts
from glyd.codec.experts import array_names, as_experts, expert_number, stack
from glyd.ops.backends.cuda import triton_available

__all__ = ["experts_linear", "unpack_experts", "pack_experts", "experts_args", "experts_packed"]

LIB = torch.library.Library("glyd", "FRAGMENT")  # noqa: TOR901 - lives as long as the process
LIB.define("experts_linear(Tensor x, Tensor ids, str layout, SymInt[] shape, Tensor[] arrays, int version) -> Tensor")
LIB.define("unpack_experts(str layout, SymInt[] shape, Tensor[] arrays, int version, Tensor index) -> Tensor")


def experts_args(p: PackedExperts) -> tuple:
    """(layout, shape, arrays, version): how the ``glyd::`` experts ops take ``p``."""
    if not isinstance(p, PackedExperts):
        raise TypeError(f"expected a glyd PackedExperts, got {type(p).__name__}")
    return p.layout, list(p.shape), [p.arrays[a] for a in array_names(p.layout)], p.version


#: id(lens) -> (the key of the arrays validated last, weak references to them, their starts); the
#: entry dies with lens. Weak: a strong reference here kept lens (and every array) alive for good.
_VALID: dict[int, tuple] = {}


def experts_packed(layout: str, shape, arrays, version: int) -> PackedExperts:
    """The ``PackedExperts`` an op's arguments describe: validated (one host sync) the first time,
    then, for the same tensors not changed in place since, rebuilt without checks or syncs."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    names = array_names(layout)
    if len(arrays) != len(names):
        raise ValueError(f"experts packed as {layout} have {len(names)} arrays ({', '.join(names)}), got {len(arrays)}")
    shape = tuple(int(s) for s in shape)
    lens = arrays[-1]
    key = (layout, shape, version, tuple(map(id, arrays)), tuple(a._version for a in arrays))
    hit = _VALID.get(id(lens))
    # the same objects, not only the same ids: an array freed since may have left its id to another
    if hit is not None and hit[0] == key and all(r() is a for r, a in zip(hit[1], arrays)):
        return PackedExperts.trusted(layout, shape, dict(zip(names, arrays)), version, hit[2])
    p = PackedExperts(layout, shape, dict(zip(names, arrays)), version)
    if lens.is_meta:  # nothing read, nothing to remember
        return p
    if id(lens) not in _VALID:
        weakref.finalize(lens, _VALID.pop, id(lens), None)
    _VALID[id(lens)] = (key, tuple(weakref.ref(a) for a in arrays), p.starts)
    return p


def _check_ids(x: torch.Tensor, ids: torch.Tensor, e: int, k: int) -> None:
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x has shape {tuple(x.shape)}; its last dimension must be K = {k}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"ids must be int32 or int64 expert indices, got {ids.dtype}")
    if tuple(ids.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"ids has shape {tuple(ids.shape)}: one expert a row of x {tuple(x.shape[:-1])} is needed")


def _experts_linear_twin(x, ids, layout, shape, arrays, version):
    p = experts_packed(layout, shape, arrays, version)
    e, n, k = p.shape
    _check_ids(x, ids, e, k)
    x2, flat = x.reshape(-1, k), ids.reshape(-1).to(torch.int64)
    out = x2.new_empty((x2.shape[0], n))
    if flat.numel():
        lo, hi = int(flat.min()), int(flat.max())  # host syncs: the twin may
        if lo < 0 or hi >= e:
            raise IndexError(f"ids hold expert {lo if lo < 0 else hi}, outside the {e} experts")
        for ex in flat.unique().tolist():  # each chosen expert unpacked once, then its rows multiplied
            rows = (flat == ex).nonzero().reshape(-1)
            w = _unpack_on(p, [ex], x.device)[0].to(x.dtype)
            out[rows] = F.linear(x2[rows], w)
    return out.reshape(*x.shape[:-1], n)


def _unpack_on(p: PackedExperts, index: list[int], device: torch.device) -> torch.Tensor:
    cpu = p if p.device.type == "cpu" else p.to("cpu")
    return _codec_unpack_experts(cpu, index).to(device)


def _index_list(index: torch.Tensor, e: int) -> list[int]:
    if index.dtype not in (torch.int32, torch.int64) or index.dim() != 1:
        raise TypeError(f"index must be a 1-D int32 or int64 tensor of experts, got {index.dtype}{list(index.shape)}")
    picks = index.tolist()
    bad = [i for i in picks if not 0 <= i < e]
    if bad:
        raise IndexError(f"index holds expert {bad[0]}, outside the {e} experts")
    return picks


def _unpack_experts_twin(layout, shape, arrays, version, index):
    p = experts_packed(layout, shape, arrays, version)
    return _unpack_on(p, _index_list(index, p.shape[0]), p.device)


def _experts_linear_cuda(x, ids, layout, shape, arrays, version):
    p = experts_packed(layout, shape, arrays, version)
    if x.dtype != torch.bfloat16 or not triton_available() or p.device != x.device:
        return _experts_linear_twin(x, ids, layout, shape, arrays, version)
    _check_ids(x, ids, p.shape[0], p.shape[2])
    from glyd.kernels import experts as kernels

    return kernels.linear(x, ids, p)


def _unpack_experts_cuda(layout, shape, arrays, version, index):
    p = experts_packed(layout, shape, arrays, version)
    picks = _index_list(index, p.shape[0])
    if not triton_available():
        return _unpack_on(p, picks, p.device)
    from glyd import kernels

    out = torch.empty((len(picks), *p.shape[1:]), dtype=torch.bfloat16, device=p.device)
    e, n, k = p.shape
    if (picks and picks == list(range(picks[0], picks[0] + len(picks))) and layout == "fixed12"
            and k == p.arrays["lo"].shape[1] and len(picks) * n * k < 2**31):
        from glyd.kernels.fixed12.experts_unpack import unpack_experts as unpack_run

        return unpack_run(p, out, first=picks[0])  # a run of experts (exact mode's prompt: all): one launch
    for j, ex in enumerate(picks):
        kernels.unpack(p.expert(ex), out=out[j])
    return out


LIB.impl("experts_linear", _experts_linear_twin, "CompositeExplicitAutograd")
LIB.impl("unpack_experts", _unpack_experts_twin, "CompositeExplicitAutograd")
LIB.impl("experts_linear", _experts_linear_cuda, "CUDA")
LIB.impl("unpack_experts", _unpack_experts_cuda, "CUDA")


@torch.library.register_fake("glyd::experts_linear")
def _experts_linear_fake(x, ids, layout, shape, arrays, version):
    return x.new_empty((*x.shape[:-1], shape[1]))


@torch.library.register_fake("glyd::unpack_experts")
def _unpack_experts_fake(layout, shape, arrays, version, index):
    return arrays[0].new_empty((index.shape[0], shape[1], shape[2]), dtype=torch.bfloat16)


def experts_linear(x: torch.Tensor, ids: torch.Tensor, p: PackedExperts) -> torch.Tensor:
    """Row ``s`` of ``x`` [..., K] times expert ``ids[..., s]``'s matrix transposed: [..., N].

    ``ids`` (int32 or int64) has ``x``'s shape without its last dimension. The fused kernels for
    CUDA bf16 ``x``; else the twin (the chosen experts unpacked, then ``F.linear`` on their rows).
    """
    return torch.ops.glyd.experts_linear(x, ids, *experts_args(p))


def unpack_experts(p: PackedExperts, index: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """Experts ``index`` of ``p`` (default all) as bf16 ``[len(index), N, K]`` on ``p``'s device, bit for bit."""
    if index is None:
        index = range(p.shape[0])
    if not isinstance(index, torch.Tensor):
        index = torch.tensor([expert_number(i) for i in index], dtype=torch.int64)
    return torch.ops.glyd.unpack_experts(*experts_args(p), index)


def pack_experts(w: torch.Tensor, layout: str = "fixed12") -> PackedExperts:
    """Pack a 3-D bf16 tensor ``[E, N, K]`` expert by expert where it lives (on CUDA with the GPU
    pack, bit-identical to ``glyd.codec.pack_experts``). ``layout="auto"``: ``choose_layout`` for
    one expert's ``[N, K]``, the same for every expert."""
    from glyd.ops import _pack as pack, choose_layout

    w = as_experts(w)
    if layout == "auto":
        layout = choose_layout(tuple(w.shape[1:]), w.device)
    return stack([pack(w[e], layout) for e in range(w.shape[0])])

