"""``GlydLinear`` and ``GlydEmbedding``: torch modules that hold a weight packed and use it as is.

A packed weight lives in buffers named ``weight_glyd_<array>`` (one a packed array), so a
module's state_dict keys are the keys of the packed checkpoint format
(``glyd.store.key_for(name, array)``): saving and loading move the arrays as they are.

Every product, unpack and row lookup is one call of a ``glyd::`` op (``torch.ops.glyd.linear``,
``.unpack``, ``.rows``; ``glyd.ops``) on the module's buffers: fused Triton kernels for CUDA
tensors, the pure-torch twin (unpack, then ``F.linear``) elsewhere. An eager product that wants no
gradient calls the op's CUDA or CPU implementation itself (``glyd.ops._eager``: the dispatcher would
only pass it through). ``exact=True`` always unpacks and calls ``F.linear`` with the bf16
weight itself, so the output is the bf16 layer's bit for bit.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from glyd import ops as _ops  # noqa: F401 - defines the glyd:: ops
from glyd.ops import _eager
from glyd.codec import LAYOUTS, Packed

#: Prefix of a packed array's buffer: ``<module>.weight_glyd_<array>``.
BUFFER_PREFIX = "weight_glyd_"


class PackedWeight:
    """What ``module.weight`` returns for a packed module: the bf16 weight, unpacked on use.

    ``dtype``, ``device``, ``shape``, ``ndim``, ``size()`` and ``numel()`` are answered from the
    packed form without unpacking (transformers reads them often). Passing it to a torch
    function, or reading any other tensor attribute, unpacks the matrix (``materialize()``).

    >>> import torch, glyd
    >>> lin = glyd.GlydLinear(glyd.pack(torch.ones(4, 3, dtype=torch.bfloat16)))
    >>> lin.weight.dtype, tuple(lin.weight.shape)
    (torch.bfloat16, (4, 3))
    >>> float(torch.sum(lin.weight))
    12.0
    """

    __slots__ = ("_unpack", "_meta", "_ptr")

    def __init__(self, unpack: Callable[[], torch.Tensor], shape: tuple[int, int], device: Callable[[], torch.device],
                 ptr: Callable[[], int] | None = None):
        self._unpack = unpack
        self._meta = (torch.Size(shape), device)
        self._ptr = ptr

    dtype = torch.bfloat16
    ndim = 2
    is_meta = False
    requires_grad = False

    @property
    def shape(self) -> torch.Size:
        return self._meta[0]

    @property
    def device(self) -> torch.device:
        return self._meta[1]()

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return 2

    def numel(self) -> int:
        return self.shape.numel()

    def materialize(self) -> torch.Tensor:
        """The bf16 weight, bit for bit, on the module's device."""
        return self._unpack()

    def data_ptr(self) -> int:
        """Where the packed matrix is stored: equal for a tied pair, as PEFT and transformers compare it
        (an unpacked copy's address is the allocator's: two weights could share it, a tied pair not)."""
        return self._ptr() if self._ptr is not None else self.materialize().data_ptr()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def real(a: Any) -> Any:
            if isinstance(a, PackedWeight):
                return a.materialize()
            if isinstance(a, (list, tuple)):
                return type(a)(real(x) for x in a)
            return a

        return func(*real(args), **{k: real(v) for k, v in (kwargs or {}).items()})

    def __getitem__(self, index: Any) -> torch.Tensor:
        # rows of the weight (ProphetNet reads its n-gram embeddings as weight[i]): the unpacked matrix's
        return self.materialize()[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    def __repr__(self) -> str:
        return f"PackedWeight(shape={tuple(self.shape)}, dtype=torch.bfloat16, device={self.device})"


class _PackedModule(nn.Module):
    """Holds one packed matrix as ``weight_glyd_<array>`` buffers."""

    def _init_packed(self, packed: Packed, sha256: str | None) -> None:
        if not isinstance(packed, Packed):
            raise TypeError(f"{type(self).__name__} expects a glyd Packed, got {type(packed).__name__}")
        self.layout = packed.layout
        self.packed_shape = tuple(packed.shape)
        self.packed_version = packed.version
        #: sha256 of the original bf16 matrix (computed when it was packed), for save and verify.
        self.sha256 = sha256
        # the layout's own order: how the glyd:: ops take the arrays
        self._array_names = tuple(a for a in LAYOUTS[packed.layout].arrays if a in packed.arrays)
        for name, array in packed.arrays.items():
            self.register_buffer(BUFFER_PREFIX + name, array, persistent=True)
        self._packed_cache: tuple[tuple[int, ...], Packed] | None = None

    def _op_args(self) -> tuple:
        # (layout, shape, arrays, version): how the glyd:: ops take the packed matrix
        return (self.layout, list(self.packed_shape), [self._buffers[BUFFER_PREFIX + n] for n in self._array_names],
                self.packed_version)

    def _unpack(self) -> torch.Tensor:
        return torch.ops.glyd.unpack(*self._op_args())

    @property
    def packed(self) -> Packed:
        """The packed matrix, built over the current buffers (rebuilt only when they change)."""
        bufs = tuple(self._buffers[BUFFER_PREFIX + n] for n in self._array_names)
        key = tuple(id(b) for b in bufs)
        cache = self._packed_cache
        if cache is None or cache[0] != key:
            p = Packed(self.layout, self.packed_shape, dict(zip(self._array_names, bufs)), self.packed_version)
            self._packed_cache = cache = (key, p)
        return cache[1]

    def _device(self) -> torch.device:
        return self._buffers[BUFFER_PREFIX + self._array_names[0]].device

    def _data_ptr(self) -> int:
        return self._buffers[BUFFER_PREFIX + self._array_names[0]].data_ptr()

    @property
    def packed_nbytes(self) -> int:
        return sum(self._buffers[BUFFER_PREFIX + n].nbytes for n in self._array_names)


class GlydLinear(_PackedModule):
    """``nn.Linear`` with a packed bf16 weight.

    ``splits`` marks a merged product (for example q|k|v): ``parts()`` gives one module a part,
    each returning its slice of the one merged product.

    >>> import torch, glyd
    >>> w = torch.randn(8, 16).to(torch.bfloat16)
    >>> lin = glyd.GlydLinear(glyd.pack(w), exact=True)
    >>> x = torch.randn(2, 16).to(torch.bfloat16)
    >>> torch.equal(lin(x).view(torch.int16), torch.nn.functional.linear(x, w).view(torch.int16))
    True
    """

    def __init__(
        self,
        packed: Packed,
        bias: torch.Tensor | None = None,
        *,
        exact: bool = False,
        splits: Sequence[int] | None = None,
        sha256: str | None = None,
    ) -> None:
        super().__init__()
        self._init_packed(packed, sha256)
        self.out_features, self.in_features = self.packed_shape
        if bias is not None:
            if bias.shape != (self.out_features,):
                raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({self.out_features},)")
            self.bias = nn.Parameter(bias.detach(), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self.exact = bool(exact)
        if splits is not None:
            splits = tuple(int(s) for s in splits)
            if sum(splits) != self.out_features or min(splits) <= 0:
                raise ValueError(f"splits {splits} do not add up to the {self.out_features} rows of the weight")
        self.splits = splits
        # (input, each part's output (a thunk), taken flags) of the last merged product, until every part has read it.
        self._pending: tuple[torch.Tensor, tuple[Callable[[], torch.Tensor], ...], list[bool]] | None = None

    @property
    def weight(self) -> PackedWeight:
        return PackedWeight(self._unpack, self.packed_shape, self._device, self._data_ptr)

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        layout, shape, arrays, version = self._op_args()
        return _eager.linear(x, layout, shape, arrays, self.bias, version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact:
            return F.linear(x, self._unpack(), self.bias)
        return self._linear(x)

    def _products(self, x: torch.Tensor) -> tuple[Callable[[], torch.Tensor], ...]:
        assert self.splits is not None
        if self.exact:
            # bf16's own products: one F.linear a part with that part's rows, run when that part is
            # called, exactly as unmerged (so that in training x's gradients add up in bf16's order).
            w = self._unpack()
            ws = w.split(self.splits, dim=0)
            bs = self.bias.split(self.splits) if self.bias is not None else (None,) * len(ws)
            return tuple(functools.partial(F.linear, x, wi, bi) for wi, bi in zip(ws, bs))
        return tuple((lambda y=y: y) for y in self._linear(x).split(self.splits, dim=-1))

    def part_forward(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Part ``index`` of the merged product of ``x``; the product (the unpack with ``exact=True``)
        runs once for all parts."""
        pend = self._pending
        if pend is not None and pend[0] is x and not pend[2][index]:
            pend[2][index] = True
            if all(pend[2]):
                self._pending = None
            return pend[1][index]()
        outs = self._products(x)
        taken = [False] * len(outs)
        taken[index] = True
        self._pending = (x, outs, taken) if len(outs) > 1 else None
        return outs[index]()

    def parts(self) -> list[GlydLinearPart]:
        if self.splits is None:
            raise ValueError("parts() needs a merged GlydLinear (built with splits=...)")
        return [GlydLinearPart(self, i) for i in range(len(self.splits))]

    def extra_repr(self) -> str:
        s = f"in_features={self.in_features}, out_features={self.out_features}, layout={self.layout}"
        s += f", bias={self.bias is not None}, exact={self.exact}"
        return s + (f", splits={self.splits}" if self.splits else "")


class GlydLinearPart(nn.Module):
    """One part (for example ``k_proj``) of a merged ``GlydLinear``; it holds no weights itself."""

    def __init__(self, merged: GlydLinear, index: int) -> None:
        super().__init__()
        # Kept out of _modules: the merged module is registered once, on the parent.
        self.__dict__["merged"] = merged
        self.index = index
        self.start = sum(merged.splits[:index])
        self.out_features = merged.splits[index]
        self.in_features = merged.in_features

    @property
    def weight(self) -> PackedWeight:
        m = self.merged
        return PackedWeight(
            lambda: m._unpack()[self.start : self.start + self.out_features],
            (self.out_features, self.in_features),
            m._device,
        )

    @property
    def bias(self) -> torch.Tensor | None:
        b = self.merged.bias
        return None if b is None else b[self.start : self.start + self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merged.part_forward(x, self.index)

    def extra_repr(self) -> str:
        return f"part {self.index} of a merged product, rows {self.start}..{self.start + self.out_features}"


class GlydTiedLinear(nn.Module):
    """An output projection that shares a ``GlydEmbedding``'s packed weight (tied embeddings):
    packed once, used twice. It holds no buffers; the embedding's are used."""

    def __init__(self, embedding: GlydEmbedding, *, exact: bool = False) -> None:
        super().__init__()
        self.__dict__["source"] = embedding
        self.out_features, self.in_features = embedding.packed_shape
        self.exact = bool(exact)
        self.register_parameter("bias", None)

    @property
    def weight(self) -> PackedWeight:
        src = self.source
        return PackedWeight(src._unpack, src.packed_shape, src._device, src._data_ptr)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact:
            return F.linear(x, self.source._unpack())
        layout, shape, arrays, version = self.source._op_args()
        return _eager.linear(x, layout, shape, arrays, None, version)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, tied, exact={self.exact}"


class GlydEmbedding(_PackedModule):
    """``nn.Embedding`` with a packed bf16 table: only the rows looked up are decoded, bit for bit.

    ``scale`` reproduces scaled embeddings: a tensor multiplies in bf16 (Gemma 3's buffer), a float
    as a float (BART's family).

    >>> import torch, glyd
    >>> table = torch.randn(100, 8).to(torch.bfloat16)
    >>> emb = glyd.GlydEmbedding(glyd.pack(table, "tiered"))
    >>> ids = torch.tensor([[5, 7, 5]])
    >>> torch.equal(emb(ids).view(torch.int16), table[ids].view(torch.int16))
    True
    """

    def __init__(
        self,
        packed: Packed,
        padding_idx: int | None = None,
        *,
        scale: torch.Tensor | float | None = None,
        sha256: str | None = None,
    ) -> None:
        super().__init__()
        self._init_packed(packed, sha256)
        self.num_embeddings, self.embedding_dim = self.packed_shape
        self.padding_idx = padding_idx
        _set_scale(self, scale)

    @property
    def weight(self) -> PackedWeight:
        return PackedWeight(self._unpack, self.packed_shape, self._device, self._data_ptr)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.ops.glyd.rows(*self._op_args(), ids)
        return _scaled(out, self.embed_scale)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, layout={self.layout}, padding_idx={self.padding_idx}"


def _set_scale(m: nn.Module, scale: torch.Tensor | float | None) -> None:
    # A tensor is a buffer (Gemma 3's, rounded to bf16 as it multiplies); a float stays a float, as
    # BART's family keeps it: it multiplies in float arithmetic, not rounded to bf16 first.
    if isinstance(scale, torch.Tensor):
        m.register_buffer("embed_scale", scale.detach().clone(), persistent=False)
    else:
        m.embed_scale = None if scale is None else float(scale)


def _scaled(out: torch.Tensor, scale: torch.Tensor | float | None) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return out * scale.to(out.dtype)
    return out if scale is None else out * scale


class GlydTiedEmbedding(nn.Module):
    """An input embedding that shares a ``GlydEmbedding``'s packed table (a weight tied in three or
    more places, as T5's ``shared`` and its encoder's and decoder's ``embed_tokens``): packed once,
    looked up with its own ``padding_idx`` and ``scale``. It holds no packed buffers; the source's are used.

    >>> import torch, glyd
    >>> from glyd.nn import GlydTiedEmbedding
    >>> emb = glyd.GlydEmbedding(glyd.pack(torch.randn(10, 4).to(torch.bfloat16)))
    >>> torch.equal(GlydTiedEmbedding(emb)(torch.tensor([3])), emb(torch.tensor([3])))
    True
    """

    def __init__(self, embedding: GlydEmbedding, padding_idx: int | None = None, *,
                 scale: torch.Tensor | float | None = None) -> None:
        super().__init__()
        self.__dict__["source"] = embedding
        self.num_embeddings, self.embedding_dim = embedding.packed_shape
        self.padding_idx = padding_idx
        _set_scale(self, scale)

    @property
    def weight(self) -> PackedWeight:
        return self.source.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.ops.glyd.rows(*self.source._op_args(), ids)
        return _scaled(out, self.embed_scale)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, tied, padding_idx={self.padding_idx}"


#: Module classes with an ``exact`` switch (``glyd.nn.experts`` adds ``GlydExperts``).
EXACT_MODULES: list[type] = [GlydLinear, GlydTiedLinear]


def set_exact(model: nn.Module, exact: bool = True) -> nn.Module:
    """Switch every packed product of ``model`` between bf16's own (``exact=True``) and the fused path."""
    kinds = tuple(EXACT_MODULES)
    for m in model.modules():
        if isinstance(m, kinds):
            m.exact = bool(exact)
    return model
