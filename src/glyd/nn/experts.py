"""``GlydExperts``: a mixture-of-experts block's experts module with its 3-D weights packed expert by expert.

transformers (5.x) holds the experts of an MoE block in one module (``MixtralExperts``,
``Qwen3MoeExperts``, ...): ``gate_up_proj`` ``[E, 2I, H]`` (or ``up_proj`` without a gate) and
``down_proj`` ``[E, H, I]``, and ``forward(hidden_states, top_k_index, top_k_weights)``, decorated by
transformers' ``use_experts_implementation`` (``has_gate``, ``has_bias``, ``is_transposed``,
``_apply_gate``, ``act_fn``; the implementation, ``eager`` / ``grouped_mm`` / ``batched_mm``, read
from ``config._experts_implementation``). ``GlydExperts`` takes such a module (the ``source``)
and holds each packed weight as ``<weight>_glyd_<array>`` buffers (``glyd.codec.experts``: the
checkpoint's keys), the source's other tensors (biases) as its own, and computes:

* ``exact=True``: the source's own forward (whichever implementation the config names), with the
  experts that ``top_k_index`` chose unpacked (the others zero, never read): bf16's result bit for
  bit. It holds a bf16 ``[E, N, K]`` tensor of each weight for the call.
* otherwise: ``glyd::experts_linear`` for the up (gate|up) and down products (the fused grouped
  GEMV on the GPU), the source's gate and activation between them, then the routing weights summed
  as transformers' grouped implementation sums them (fp32). Where the GPU's kernel sorts the rows
  by expert itself (a prompt's unpack + grouped GEMM), the rows are sorted once for both products
  (``glyd.ops.experts.route``, ``glyd::experts_linear_sorted``), the activation applied in that
  order, and put back in token order once: the same values, one sort and three copies fewer.

Only experts stored as ``[E, N, K]`` (``is_transposed`` false) are packed: ``is_packable``.

>>> import torch, glyd
>>> from glyd.codec import pack_experts
>>> from glyd.nn.experts import GlydExperts
>>> class Experts(torch.nn.Module):                      # the convention transformers' experts follow
...     num_experts, has_gate, has_bias, is_transposed = 2, True, False, False
...     def __init__(self):
...         super().__init__()
...         self.gate_up_proj = torch.nn.Parameter(torch.randn(2, 8, 4).to(torch.bfloat16))
...         self.down_proj = torch.nn.Parameter(torch.randn(2, 4, 4).to(torch.bfloat16))
...         self.act_fn = torch.nn.SiLU()
...     def _apply_gate(self, h):
...         g, u = h.chunk(2, dim=-1)
...         return self.act_fn(g) * u
...     def forward(self, h, idx, w):
...         out = torch.zeros_like(h)
...         for t in range(h.shape[0]):
...             for j in range(idx.shape[1]):
...                 e = int(idx[t, j])
...                 y = self._apply_gate(h[t] @ self.gate_up_proj[e].T) @ self.down_proj[e].T
...                 out[t] += y * w[t, j]
...         return out
>>> src = Experts()
>>> h, idx, w = torch.randn(3, 4).to(torch.bfloat16), torch.tensor([[0, 1], [1, 1], [0, 0]]), torch.rand(3, 2)
>>> want = src(h, idx, w)
>>> packed = {n: pack_experts(getattr(src, n).detach()) for n in ("gate_up_proj", "down_proj")}
>>> glyd_experts = GlydExperts(src, packed, exact=True)
>>> torch.equal(glyd_experts(h, idx, w).view(torch.int16), want.view(torch.int16))
True
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn

from glyd.codec.experts import PackedExperts, array_names
from glyd.errors import CorruptError, FormatError
from glyd.nn.modules import BUFFER_PREFIX, EXACT_MODULES, PackedWeight
from glyd.ops import experts as _experts_ops

__all__ = ["GlydExperts", "PackedExpertsWeight", "WEIGHTS", "is_packable"]

#: The 3-D weights of transformers' experts modules that glyd packs, in the order they are used.
WEIGHTS = ("gate_up_proj", "up_proj", "down_proj")
#: ``<weight>_glyd_<array>``: the buffer of one array of a packed weight (``weight_glyd_`` for a linear).
SEP = BUFFER_PREFIX[len("weight"):]


def is_packable(m: nn.Module) -> tuple[str, ...]:
    """The names of ``m``'s weights that glyd packs: those of :data:`WEIGHTS` that are 3-D bf16 (or
    meta) parameters of an experts module in transformers' convention, not transposed; () if none."""
    if not callable(getattr(type(m), "_apply_gate", None)) or getattr(m, "is_transposed", True):
        return ()
    if not isinstance(getattr(m, "has_gate", None), bool) or "down_proj" not in m._parameters:
        return ()
    names = tuple(n for n in WEIGHTS if isinstance(m._parameters.get(n), torch.Tensor)
                  and m._parameters[n].dim() == 3)
    first = "gate_up_proj" if m.has_gate else "up_proj"
    return names if set(names) == {first, "down_proj"} else ()


@contextlib.contextmanager
def _naming(weight: str) -> Iterator[None]:
    """Errors about a weight's packed arrays name the weight (the module holds two)."""
    try:
        yield
    except (FormatError, CorruptError) as exc:
        raise type(exc)(f"{weight}: {exc}") from exc


def _named(weight: str, op: Callable, *args: Any) -> torch.Tensor:
    """``op(*args)`` with ``_naming(weight)``'s errors, without a context manager's calls (a product's host time)."""
    try:
        return op(*args)
    except (FormatError, CorruptError) as exc:
        raise type(exc)(f"{weight}: {exc}") from exc


class PackedExpertsWeight(PackedWeight):
    """What ``experts.gate_up_proj`` returns for a packed experts module: the bf16 ``[E, N, K]``
    tensor, unpacked on use (its shape and dtype answered without unpacking)."""

    __slots__ = ()
    ndim = 3

    def dim(self) -> int:
        return 3


class GlydExperts(nn.Module):
    """An experts module (transformers' convention, see the module docstring) with packed weights.

    ``source``: the module it replaces (its packed weights are taken off it; it is kept outside the
    module tree for its forward, gate and activation); ``packed``: weight name -> ``PackedExperts``;
    ``sha256``: weight name -> sha256 of the original bf16 tensor (save and verify).
    """

    def __init__(self, source: nn.Module, packed: dict[str, PackedExperts], *, exact: bool = False,
                 sha256: dict[str, str | None] | None = None) -> None:
        super().__init__()
        names = is_packable(source)
        if not names or set(packed) != set(names):
            raise ValueError(f"{type(source).__name__}: GlydExperts packs {', '.join(names) or 'no weights of it'}, "
                             f"got packed {', '.join(sorted(packed))}")
        for name, p in packed.items():
            if not isinstance(p, PackedExperts):
                raise TypeError(f"{name}: expected a glyd PackedExperts, got {type(p).__name__}")
            want = tuple(source._parameters[name].shape)
            if tuple(p.shape) != want:
                raise ValueError(f"{name}: packed experts are {list(p.shape)}, the module's weight is {list(want)}")
        self.__dict__["source"] = source
        self.weights = tuple(n for n in WEIGHTS if n in packed)  # up (or gate|up) first, then down
        self.layouts = {n: p.layout for n, p in packed.items()}
        self.packed_shapes = {n: tuple(p.shape) for n, p in packed.items()}
        self.packed_versions = {n: p.version for n, p in packed.items()}
        self.sha256 = dict(sha256 or {})
        self.exact = bool(exact)
        for name in self.weights:
            del source._parameters[name]
            for a, t in packed[name].arrays.items():
                self.register_buffer(f"{name}{SEP}{a}", t, persistent=True)
        # The source's other tensors (biases, buffers) move to this module (state_dict, .to()); the
        # source gets them back for the length of a call (_with_source) and for good (dequantized).
        for pname, t in list(source._parameters.items()):
            self.register_parameter(pname, source._parameters.pop(pname))
        for bname in list(source._buffers):
            self.register_buffer(bname, source._buffers.pop(bname),
                                 persistent=bname not in source._non_persistent_buffers_set)

    @property
    def layout(self) -> str:
        """The layout of the packed weights (one for all of them, else ``"auto"``)."""
        layouts = set(self.layouts.values())
        return layouts.pop() if len(layouts) == 1 else "auto"

    def _arrays(self, name: str) -> list[torch.Tensor]:
        return [self._buffers[f"{name}{SEP}{a}"] for a in array_names(self.layouts[name])]

    def packed(self, name: str) -> PackedExperts:
        """The packed experts of weight ``name`` over the current buffers."""
        with _naming(name):
            return _experts_ops.experts_packed(self.layouts[name], self.packed_shapes[name], self._arrays(name),
                                               self.packed_versions[name])

    @property
    def packed_weights(self) -> dict[str, PackedExperts]:
        return {n: self.packed(n) for n in self.weights}

    @property
    def packed_nbytes(self) -> int:
        return sum(t.nbytes for n in self.weights for t in self._arrays(n))

    def _op_args(self, name: str) -> tuple:
        return (self.layouts[name], list(self.packed_shapes[name]), self._arrays(name), self.packed_versions[name])

    def _device(self) -> torch.device:
        return self._arrays(self.weights[0])[0].device

    def unpack(self, name: str, index: torch.Tensor | None = None) -> torch.Tensor:
        """Weight ``name`` (experts ``index``, default all) as bf16, bit for bit."""
        if index is None:
            index = torch.arange(self.packed_shapes[name][0])
        with _naming(name):
            return torch.ops.glyd.unpack_experts(*self._op_args(name), index)

    def __getattr__(self, name: str) -> Any:
        if name in WEIGHTS and name in self.__dict__.get("layouts", {}):
            return PackedExpertsWeight(lambda n=name: self.unpack(n), self.packed_shapes[name], self._device)
        return super().__getattr__(name)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                *args: Any, **kwargs: Any) -> torch.Tensor:
        if not isinstance(top_k_index, torch.Tensor) or top_k_index.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"top_k_index must be an int32 or int64 tensor of expert ids, got "
                            f"{getattr(top_k_index, 'dtype', type(top_k_index).__name__)}")
        if self.exact:
            return self._exact(hidden_states, top_k_index, top_k_weights, *args, **kwargs)
        return self._fused(hidden_states, top_k_index, top_k_weights)

    def _own_tensors(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The source's parameters and buffers, as this module holds them now (moved, or loaded)."""
        packed = tuple(f"{n}{SEP}" for n in self.weights)
        return dict(self._parameters), {b: t for b, t in self._buffers.items() if not b.startswith(packed)}

    def _with_source(self, weights: dict[str, torch.Tensor], run: Callable[[nn.Module], torch.Tensor]) -> torch.Tensor:
        src = self.source
        params, buffers = self._own_tensors()
        try:
            src._parameters.update(params)
            src._buffers.update(buffers)
            src.__dict__.update(weights)
            return run(src)
        finally:
            for n in weights:
                src.__dict__.pop(n, None)
            for n in params:
                src._parameters.pop(n, None)
            for n in buffers:
                src._buffers.pop(n, None)

    def _exact(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
        e = self.packed_shapes[self.weights[0]][0]
        # clamped as transformers' batched_mm clamps ids outside the experts (grouped_mm reads experts
        # 0 and E-1 for them too): every expert an implementation may read holds its true weights
        chosen = top_k_index.reshape(-1).clamp(0, e - 1).unique().to("cpu")  # a host sync: exact mode may
        weights = {}
        for name in self.weights:
            shape = self.packed_shapes[name]
            w = torch.zeros(shape, dtype=torch.bfloat16, device=hidden_states.device)
            if chosen.numel():
                w[chosen.to(w.device)] = self.unpack(name, chosen).to(w.device)
            weights[name] = w
        return self._with_source(weights, lambda src: type(src).forward(src, hidden_states, top_k_index,
                                                                        top_k_weights, *args, **kwargs))

    def _check_routing(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> None:
        # the fused path reshapes and broadcasts these: a shape that does not fit must not slip through
        k = self.packed_shapes[self.weights[0]][2]
        if hidden_states.dim() != 2 or hidden_states.shape[1] != k:
            raise ValueError(f"hidden_states has shape {tuple(hidden_states.shape)}: [tokens, {k}] is needed")
        if top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0]:
            raise ValueError(f"top_k_index has shape {tuple(top_k_index.shape)}: [tokens, top_k] for the "
                             f"{hidden_states.shape[0]} tokens is needed")
        if not isinstance(top_k_weights, torch.Tensor) or top_k_weights.shape != top_k_index.shape:
            raise ValueError(f"top_k_weights has shape {tuple(getattr(top_k_weights, 'shape', ()))}; top_k_index's "
                             f"{tuple(top_k_index.shape)} is needed")

    def _fused(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        self._check_routing(hidden_states, top_k_index, top_k_weights)
        tokens, top_k = top_k_index.shape
        ids = top_k_index.reshape(-1)
        up, down = self.weights
        try:
            if _experts_ops.sorts_rows(hidden_states, ids.numel(), self.layouts[up], self.packed_shapes[up]):
                y = self._sorted_products(hidden_states, ids, top_k)
            else:
                y = self._products(hidden_states, ids, top_k)
        except IndexError as exc:
            raise IndexError(f"top_k_index: {exc}") from exc
        # as transformers' grouped and batched implementations: weights applied, then summed in fp32
        y = y * top_k_weights.reshape(-1, 1)
        return y.view(tokens, top_k, y.shape[-1]).sum(dim=1).to(hidden_states.dtype)  # not -1: no tokens

    def _products(self, hidden_states: torch.Tensor, ids: torch.Tensor, top_k: int) -> torch.Tensor:
        """Both products in token order (row s is token s // top_k): each kernel routes its own rows."""
        src, (up, down) = self.source, self.weights
        x = hidden_states.repeat_interleave(top_k, dim=0)  # [tokens * top_k, hidden]
        h = _named(up, torch.ops.glyd.experts_linear, x, ids, *self._op_args(up))
        if getattr(src, "has_bias", False):
            h = h + self._bias_rows(f"{up}_bias", ids)
        h = src._apply_gate(h) if src.has_gate else src.act_fn(h)
        y = _named(down, torch.ops.glyd.experts_linear, h, ids, *self._op_args(down))
        if getattr(src, "has_bias", False):
            y = y + self._bias_rows("down_proj_bias", ids)
        return y

    def _bias_rows(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        # ids outside the experts reach here only inside a CUDA graph (an eager product raised), where
        # their rows are NaN already: clamped, the lookup cannot end the graph in a device-side assert
        bias = self._parameters[name]
        return bias.index_select(0, ids.clamp(0, bias.shape[0] - 1))

    def _sorted_products(self, hidden_states: torch.Tensor, ids: torch.Tensor, top_k: int) -> torch.Tensor:
        """Both products on the rows sorted by expert once (where the up product's kernel would sort them):
        the tokens gathered in that order, the activation applied to it, the rows put back in token
        order last; every row's values as ``_products`` gives them."""
        src, (up, down) = self.source, self.weights
        order, sids, offs, token = _experts_ops.route(ids, self.packed_shapes[up][0], top_k)
        x = hidden_states.index_select(0, token)  # sorted row s: token order[s] // top_k
        h = _named(up, torch.ops.glyd.experts_linear_sorted, x, sids, offs, *self._op_args(up))
        if getattr(src, "has_bias", False):
            h = h + self._bias_rows(f"{up}_bias", sids)
        h = src._apply_gate(h) if src.has_gate else src.act_fn(h)
        y = _named(down, torch.ops.glyd.experts_linear_sorted, h, sids, offs, *self._op_args(down))
        if getattr(src, "has_bias", False):
            y = y + self._bias_rows("down_proj_bias", sids)
        return torch.empty_like(y).index_copy_(0, order, y)

    def dequantized(self) -> nn.Module:
        """The source module with its bf16 weights unpacked back in place (``dequantize``)."""
        src = self.source
        for name in self.weights:
            src._parameters[name] = nn.Parameter(self.unpack(name).to(self._device()), requires_grad=False)
        params, buffers = self._own_tensors()
        src._parameters.update(params)
        src._buffers.update(buffers)
        return src

    def extra_repr(self) -> str:
        parts = [f"{n}={list(self.packed_shapes[n])}" for n in self.weights]
        return f"{type(self.source).__name__}: {', '.join(parts)}, layout={self.layout}, exact={self.exact}"


EXACT_MODULES.append(GlydExperts)  # set_exact switches it too
