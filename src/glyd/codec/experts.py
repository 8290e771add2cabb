"""Experts: a 3-D bf16 tensor ``[E, N, K]`` (a mixture-of-experts block's expert weights, as
transformers holds them: ``gate_up_proj``, ``down_proj``) packed expert by expert.

Each expert's ``[N, K]`` matrix is packed on its own, in one layout for all of them (its own
window, tables and exceptions: the matrix is the codec's unit). The E packed matrices are held as
one set of arrays: each array of the layout is the experts' arrays concatenated along their first
dimension, expert 0 first, and ``lens`` (int64 ``[E, A]``) gives each expert's length along that
dimension in each of the A arrays (the layout's ``ARRAYS`` order). Expert ``e``'s arrays are then
views of the concatenated ones: for ``fixed12``, ``lo`` is ``[E*N, Kp]`` (expert e's rows ``e*N ..``)
and its exceptions a slice of ``exc_idx`` (indices local to the expert).

>>> import torch, glyd
>>> from glyd.codec.experts import pack_experts, unpack_experts
>>> w = (torch.randn(4, 6, 10) * 0.02).to(torch.bfloat16)
>>> p = pack_experts(w, "fixed12")
>>> p.shape, tuple(p.arrays["lo"].shape), tuple(p.arrays["lens"].shape)
((4, 6, 10), (24, 64), (4, 5))
>>> torch.equal(unpack_experts(p).view(torch.int16), w.view(torch.int16))
True
>>> torch.equal(glyd.unpack(p.expert(2)).view(torch.int16), w[2].view(torch.int16))
True
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from glyd.codec.packed import LAYOUTS, Packed, expect_array
from glyd.errors import CorruptError, FormatError

__all__ = ["LENS", "PackedExperts", "pack_experts", "unpack_experts", "stack", "array_names", "as_experts"]

#: The array that says how the experts' arrays are concatenated (not an array of any layout).
LENS = "lens"


def array_names(layout: str) -> tuple[str, ...]:
    """The arrays of a packed experts tensor of ``layout``, in order: the layout's, then ``lens``."""
    return (*LAYOUTS[layout].ARRAYS, LENS)


def expert_number(e: Any) -> int:
    """``e`` as an expert's number: an int (numpy's and 0-d integer tensors too), never a bool or a
    float, which int() would truncate to another expert."""
    if isinstance(e, bool) or (isinstance(e, torch.Tensor) and e.dtype == torch.bool):
        raise TypeError(f"expert {e!r} is not an int")
    try:
        return operator.index(e)
    except TypeError:
        raise TypeError(f"expert {e!r} is not an int") from None


def _check_shape(shape: object) -> tuple[int, int, int]:
    if (not isinstance(shape, (tuple, list)) or len(shape) != 3
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape) or min(shape) < 0):
        raise FormatError(f"an experts tensor's shape must be three non-negative ints (experts, rows, cols), "
                          f"got {shape!r}")
    return int(shape[0]), int(shape[1]), int(shape[2])


@dataclass(frozen=True)
class PackedExperts:
    """E bf16 matrices of one shape ``[N, K]``, each packed on its own in ``layout``, held as one set
    of concatenated arrays (see the module docstring); ``shape`` is ``(E, N, K)``.

    Construction checks the arrays' names, dtypes and dimensions, and the layout's padded plane
    (``Layout.padded_array``) as ``[E*N, padded K]``; with ``lens`` readable (not on the meta device) also that the lengths add up and that every expert's arrays are a valid packed
    matrix of its layout (``Packed``'s checks, shapes only: values are checked when unpacking).
    """

    layout: str
    shape: tuple[int, int, int]
    arrays: dict[str, torch.Tensor] = field(repr=False)
    version: int | None = None
    _starts: tuple = field(default=(), repr=False, compare=False)  # per array: E + 1 offsets (host ints)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise FormatError(f"unknown layout {self.layout!r} (known: {', '.join(LAYOUTS)})")
        lay = LAYOUTS[self.layout]
        object.__setattr__(self, "version", lay.writes if self.version is None else lay.check_version(self.version))
        object.__setattr__(self, "shape", _check_shape(self.shape))
        e = self.shape[0]
        names = LAYOUTS[self.layout].ARRAYS
        extra = sorted(set(self.arrays) - set(names) - {LENS})
        if extra:
            raise FormatError(f"unexpected arrays for experts packed as {self.layout!r}: {', '.join(extra)}")
        lens = expect_array(self.arrays, LENS, torch.int64, (e, len(names)))
        for a in names:  # dtypes and per-expert shapes: each expert's Packed below
            t = self.arrays.get(a)
            if not isinstance(t, torch.Tensor):
                raise FormatError(f"packed array {a!r} is missing" if t is None else f"packed array {a!r} is not a tensor")
            if t.dim() < 1:
                raise FormatError(f"packed array {a!r} of an experts tensor must have at least one dimension")
        # the padded plane (a row a matrix row, K padded) checks the shape without a value: on meta
        # arrays too (a reader's open, glyd info), where the shape would otherwise go unchecked
        n, k = self.shape[1:]
        expect_array(self.arrays, lay.padded_array, self.arrays[lay.padded_array].dtype, (e * n, lay.padded_cols(k)))
        if lens.is_meta:
            return
        if e == 0:
            raise FormatError("an experts tensor holds at least one expert")
        lens_host = lens.detach().cpu()
        if bool((lens_host < 0).any()):
            raise CorruptError(f"{LENS} holds negative lengths")
        starts = []
        for i, a in enumerate(names):
            col = lens_host[:, i]
            have = self.arrays[a].shape[0]
            big = (col > have).nonzero()
            if big.numel():  # before summing: int64 sums of hostile lengths wrap around to any total
                e0 = int(big[0, 0])
                raise CorruptError(f"{LENS} gives expert {e0} {int(col[e0])} entries of array {a!r}, which has {have}")
            total = int(col.sum())
            if total != have:
                raise FormatError(f"{LENS} gives {total} entries of array {a!r} to the experts, but it has "
                                  f"{self.arrays[a].shape[0]}")
            starts.append(tuple([0, *torch.cumsum(col, 0).tolist()]))
        object.__setattr__(self, "_starts", tuple(starts))
        for i in range(e):  # every expert is a valid packed matrix (shapes only)
            self.expert(i)

    @classmethod
    def trusted(cls, layout: str, shape: tuple[int, int, int], arrays: dict[str, torch.Tensor], version: int,
                starts: tuple) -> PackedExperts:
        """A PackedExperts over arrays validated before (as a PackedExperts, with these ``starts``),
        unchanged since: no checks and no host sync."""
        p = object.__new__(cls)
        for name, value in (("layout", layout), ("shape", tuple(shape)), ("arrays", arrays), ("version", version),
                            ("_starts", starts)):
            object.__setattr__(p, name, value)
        return p

    @property
    def num_experts(self) -> int:
        return self.shape[0]

    @property
    def numel(self) -> int:
        e, n, k = self.shape
        return e * n * k

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays, ``lens`` included."""
        return sum(a.numel() * a.element_size() for a in self.arrays.values())

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.numel if self.numel else 0.0

    @property
    def device(self) -> torch.device:
        return self.arrays[LENS].device

    @property
    def starts(self) -> tuple:
        """Per layout array (``ARRAYS`` order): the E + 1 offsets of the experts along dimension 0."""
        if not self._starts:
            raise FormatError("the experts' lengths are not readable here (meta tensors)")
        return self._starts

    def expert(self, e: int) -> Packed:
        """Expert ``e``'s packed ``[N, K]`` matrix: views of the concatenated arrays (no copy)."""
        e = expert_number(e)
        if not 0 <= e < self.shape[0]:
            raise IndexError(f"expert {e} is out of range for {self.shape[0]} experts")
        names = LAYOUTS[self.layout].ARRAYS
        arrays = {a: self.arrays[a][s[e]:s[e + 1]] for a, s in zip(names, self.starts)}
        try:
            return Packed(self.layout, self.shape[1:], arrays, self.version)
        except FormatError as exc:
            raise FormatError(f"expert {e}: {exc}") from exc

    def to(self, device: torch.device | str) -> PackedExperts:
        """The same experts with every array on ``device``."""
        return PackedExperts(self.layout, self.shape, {k: v.to(device) for k, v in self.arrays.items()}, self.version)

    def cuda(self, device: int | torch.device | str | None = None) -> PackedExperts:
        """``to`` a CUDA device (the current one when ``device`` is None), as ``Tensor.cuda``."""
        return self.to("cuda" if device is None else f"cuda:{device}" if isinstance(device, int) else device)

    def cpu(self) -> PackedExperts:
        """``to("cpu")``, as ``Tensor.cpu``."""
        return self.to("cpu")


def stack(packs: Sequence[Packed]) -> PackedExperts:
    """Join E packed matrices of one layout and shape (one device) into a ``PackedExperts``."""
    if not packs:
        raise ValueError("stack needs at least one packed matrix")
    first = packs[0]
    for i, p in enumerate(packs):
        if not isinstance(p, Packed):
            raise TypeError(f"expert {i}: expected a glyd Packed, got {type(p).__name__}")
        if (p.layout, p.shape, p.version) != (first.layout, first.shape, first.version):
            raise ValueError(f"expert {i} is {p.layout} {p.shape}, expert 0 {first.layout} {first.shape}: "
                             f"one layout and shape for every expert")
    names = LAYOUTS[first.layout].ARRAYS
    dev = first.device
    arrays = {a: torch.cat([p.arrays[a] for p in packs], dim=0) for a in names}
    lens = torch.tensor([[p.arrays[a].shape[0] for a in names] for p in packs], dtype=torch.int64, device=dev)
    arrays[LENS] = lens
    return PackedExperts(first.layout, (len(packs), *first.shape), arrays, first.version)


def as_experts(w: torch.Tensor) -> torch.Tensor:
    """``w`` checked as a 3-D bf16 experts tensor with at least one expert."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"experts must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype != torch.bfloat16:
        raise TypeError(f"experts must be bfloat16, got {w.dtype} (glyd packs bf16 weights only; convert explicitly)")
    if w.dim() != 3 or w.shape[0] == 0:
        raise ValueError(f"experts must be a 3-D tensor [experts, rows, cols] with at least one expert, "
                         f"got shape {tuple(w.shape)}")
    return w


def pack_experts(w: torch.Tensor, layout: str = "fixed12") -> PackedExperts:
    """Pack a 3-D bf16 tensor ``[E, N, K]`` expert by expert with the CPU reference codec."""
    w = as_experts(w).detach().to("cpu")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return stack([LAYOUTS[layout].pack(w[e]) for e in range(w.shape[0])])


def unpack_experts(p: PackedExperts, index: Sequence[int] | None = None) -> torch.Tensor:
    """The bf16 ``[E, N, K]`` tensor of ``p`` on the CPU, bit for bit (``index``: only those experts,
    ``[len(index), N, K]``)."""
    if not isinstance(p, PackedExperts):
        raise TypeError(f"unpack_experts expects a glyd PackedExperts, got {type(p).__name__}")
    if p.device.type != "cpu":
        p = p.to("cpu")
    picks = range(p.shape[0]) if index is None else [expert_number(i) for i in index]
    out = torch.empty((len(picks), *p.shape[1:]), dtype=torch.bfloat16)
    if out.numel():
        for j, e in enumerate(picks):
            out[j] = LAYOUTS[p.layout].unpack(p.expert(e))
    return out
