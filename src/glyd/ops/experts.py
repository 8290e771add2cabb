"""The op face of packed experts (``glyd.codec.experts``): each row of ``x`` multiplied by the expert
it was routed to, and the chosen experts unpacked.

* ``glyd::experts_linear(x, ids, layout, shape, arrays, version)``: row ``s`` of ``x`` [S, K] times
  expert ``ids[s]``'s matrix [N, K] transposed, [S, N] (x's dtype). The pure-torch twin (the
  default, every device) unpacks the experts that ``ids`` names, each once, and multiplies their
  rows with ``F.linear``; CUDA tensors take ``glyd.kernels.experts`` (a grouped GEMV that reads only
  the chosen experts' packed fixed12 weights, or the existing fused product an expert).
* ``glyd::experts_linear_sorted(x, ids, offs, layout, shape, arrays, version)``: the same product for
  rows already sorted by expert (``ids`` non-decreasing, ``offs[e]`` int32: the rows of experts <= e,
  as :func:`route` gives them), in their sorted order. An MoE block's two products share one
  routing this way (``glyd.nn.experts``): the CUDA implementation's unpack + grouped GEMM then sorts,
  gathers and scatters nothing. The twin checks the order and the offsets (host syncs) and is
  ``experts_linear``'s twin.
* ``glyd::experts_route(ids, experts, group)``: the rows sorted by expert (stable), their ids, the
  offsets above, and each sorted row's token (``order // group``); one launch on CUDA
  (``glyd.kernels.experts_route``), ``torch.sort`` and ``torch.searchsorted`` in the twin. Ids
  outside the experts are refused (eagerly: one check, which the block's products then skip).
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

__all__ = ["experts_linear", "experts_linear_sorted", "route", "sorts_rows", "unpack_experts", "pack_experts",
           "experts_args", "experts_packed"]

LIB = torch.library.Library("glyd", "FRAGMENT")  # noqa: TOR901 - lives as long as the process
LIB.define("experts_linear(Tensor x, Tensor ids, str layout, SymInt[] shape, Tensor[] arrays, int version) -> Tensor")
LIB.define("experts_linear_sorted(Tensor x, Tensor ids, Tensor offs, str layout, SymInt[] shape, Tensor[] arrays, "
           "int version) -> Tensor")
LIB.define("experts_route(Tensor ids, int experts, int group) -> (Tensor, Tensor, Tensor, Tensor)")
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


def _check_sorted(x, ids, offs, e: int) -> None:
    # the twin's checks of a sorted call (host syncs): the order and offsets the kernels rely on
    if x.dim() != 2 or ids.dim() != 1:
        raise ValueError(f"sorted rows take x [S, K] and ids [S], got x {tuple(x.shape)} and ids {tuple(ids.shape)}")
    if offs.dtype != torch.int32 or tuple(offs.shape) != (e,):
        raise ValueError(f"offs must be an int32 [{e}] tensor (rows of experts <= e), got {offs.dtype}{list(offs.shape)}")
    if ids.numel() and bool((ids[1:] < ids[:-1]).any()):
        raise ValueError("ids must be sorted (non-decreasing): experts_linear_sorted takes the rows route() sorted")
    want = torch.searchsorted(ids.to(torch.int64), torch.arange(e, device=ids.device), right=True, out_int32=True)
    if not torch.equal(offs.to(want.device), want):
        raise ValueError("offs must hold, for each expert e, the rows of experts <= e (route() gives them)")


def _experts_linear_sorted_twin(x, ids, offs, layout, shape, arrays, version):
    _check_sorted(x, ids, offs, int(shape[0]))
    return _experts_linear_twin(x, ids, layout, shape, arrays, version)


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


# below the ops' autograd (none registered): the cuBLAS part writes into its output (out=), which autograd
# refuses for an input that requires grad (a biased experts module called with grad on, 2026-12-05 H200)
@torch.no_grad()
def _experts_linear_cuda(x, ids, layout, shape, arrays, version):
    p = experts_packed(layout, shape, arrays, version)
    if x.dtype != torch.bfloat16 or not triton_available() or p.device != x.device:
        return _experts_linear_twin(x, ids, layout, shape, arrays, version)
    _check_ids(x, ids, p.shape[0], p.shape[2])
    from glyd.kernels import experts as kernels

    return kernels.linear(x, ids, p)


@torch.no_grad()
def _experts_linear_sorted_cuda(x, ids, offs, layout, shape, arrays, version):
    if triton_available():  # a call like an earlier one: its kept plan (no check of the arrays again)
        from glyd.kernels import experts as kernels

        y = kernels.run_sorted(x, ids, offs, layout, shape, arrays, version)
        if y is not None:
            return y
    p = experts_packed(layout, shape, arrays, version)
    if x.dtype != torch.bfloat16 or not triton_available() or p.device != x.device:
        return _experts_linear_sorted_twin(x, ids, offs, layout, shape, arrays, version)
    _check_ids(x, ids, p.shape[0], p.shape[2])
    from glyd.kernels import experts as kernels

    return kernels.linear(x, ids, p, offs=offs)


def _check_route(ids, experts: int, group: int) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1:
        raise TypeError(f"ids must be a 1-D int32 or int64 tensor, got {getattr(ids, 'dtype', type(ids).__name__)}"
                        f"{list(getattr(ids, 'shape', []))}")
    if experts < 1 or group < 1:
        raise ValueError(f"route needs at least one expert and group >= 1, got {experts} and {group}")


def _route_torch(ids, experts, group):
    sids, order = torch.sort(ids, stable=True)
    experts_ids = torch.arange(experts, dtype=ids.dtype, device=ids.device)
    return order, sids, torch.searchsorted(sids, experts_ids, right=True, out_int32=True), order // group


def _experts_route_twin(ids, experts, group):
    _check_route(ids, experts, group)
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())  # host syncs: the twin may
        if lo < 0 or hi >= experts:
            raise IndexError(f"ids hold expert {lo if lo < 0 else hi}, outside the {experts} experts")
    return _route_torch(ids, experts, group)


def _experts_route_cuda(ids, experts, group):
    if not triton_available():
        return _experts_route_twin(ids, experts, group)
    _check_route(ids, experts, group)
    from glyd.kernels import experts_route as kernel

    order, sids, offs, tokens, ok = kernel.route(ids, experts, group)
    if not (ids.is_cuda and torch.cuda.is_current_stream_capturing()):  # a graph: the products give NaN rows
        torch._assert_async(ok, "glyd experts_route: ids outside the experts")
        kernel.mark_checked(sids)  # the block's products skip their own check of these ids
    return order, sids, offs, tokens


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
LIB.impl("experts_linear_sorted", _experts_linear_sorted_twin, "CompositeExplicitAutograd")
LIB.impl("experts_linear_sorted", _experts_linear_sorted_cuda, "CUDA")
LIB.impl("experts_route", _experts_route_twin, "CompositeExplicitAutograd")
LIB.impl("experts_route", _experts_route_cuda, "CUDA")
LIB.impl("unpack_experts", _unpack_experts_cuda, "CUDA")


@torch.library.register_fake("glyd::experts_linear")
def _experts_linear_fake(x, ids, layout, shape, arrays, version):
    return x.new_empty((*x.shape[:-1], shape[1]))


@torch.library.register_fake("glyd::experts_linear_sorted")
def _experts_linear_sorted_fake(x, ids, offs, layout, shape, arrays, version):
    return x.new_empty((*x.shape[:-1], shape[1]))


@torch.library.register_fake("glyd::experts_route")
def _experts_route_fake(ids, experts, group):
    s = ids.shape[0]
    return (ids.new_empty(s, dtype=torch.int64), ids.new_empty(s), ids.new_empty(experts, dtype=torch.int32),
            ids.new_empty(s, dtype=torch.int64))


@torch.library.register_fake("glyd::unpack_experts")
def _unpack_experts_fake(layout, shape, arrays, version, index):
    return arrays[0].new_empty((index.shape[0], shape[1], shape[2]), dtype=torch.bfloat16)


def experts_linear(x: torch.Tensor, ids: torch.Tensor, p: PackedExperts) -> torch.Tensor:
    """Row ``s`` of ``x`` [..., K] times expert ``ids[..., s]``'s matrix transposed: [..., N].

    ``ids`` (int32 or int64) has ``x``'s shape without its last dimension. The fused kernels for
    CUDA bf16 ``x``; else the twin (the chosen experts unpacked, then ``F.linear`` on their rows).
    """
    return torch.ops.glyd.experts_linear(x, ids, *experts_args(p))


def experts_linear_sorted(x: torch.Tensor, ids: torch.Tensor, offs: torch.Tensor, p: PackedExperts) -> torch.Tensor:
    """Row ``s`` of ``x`` [S, K] times expert ``ids[s]``'s matrix transposed, [S, N], for rows sorted
    by expert: ``ids`` non-decreasing and ``offs`` as :func:`route` gives them."""
    return torch.ops.glyd.experts_linear_sorted(x, ids, offs, *experts_args(p))


def route(ids: torch.Tensor, experts: int, group: int = 1) -> tuple[torch.Tensor, ...]:
    """(order, sorted ids, offs, tokens) of the rows ``ids`` [S] routes: ``order`` the rows sorted by
    expert (stable), ``ids[order]``, ``offs`` int32 [experts]: the rows of experts <= e, and
    ``order // group`` (``group`` rows a token: each sorted row's token). No host sync (a CUDA graph
    captures it: one launch on CUDA); once for both products of an MoE block.

    >>> order, sids, offs, tokens = route(torch.tensor([2, 0, 2, 1]), 3, group=2)
    >>> order.tolist(), sids.tolist(), offs.tolist(), tokens.tolist()
    ([1, 3, 0, 2], [0, 1, 2, 2], [1, 2, 4], [0, 1, 0, 1])
    """
    return torch.ops.glyd.experts_route(ids, experts, group)


def sorts_rows(x: torch.Tensor, rows: int, layout: str, shape) -> bool:
    """True where the CUDA implementation's product of ``rows`` rows of ``x`` (its device and dtype)
    times ``layout`` experts of ``shape`` sorts them by expert itself (the unpack + grouped GEMM): an
    MoE block then sorts once (:func:`route`) for both products (``experts_linear_sorted``). False for
    the twin (CPU tensors), other dtypes, and the kernels that take rows in any order."""
    if x.device.type != "cuda" or x.dtype != torch.bfloat16 or not triton_available():
        return False
    from glyd.kernels import experts as kernels

    return kernels.sorts_rows(layout, shape, rows, x.device)


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

