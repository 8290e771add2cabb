"""The packed-matrix container shared by every layout."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from glyd.codec.layout import LAYOUTS
from glyd.errors import FormatError, UnsupportedError

#: The first format version of every layout (and the version of quantization configs). A layout's
#: own versions are in its entry: ``Layout.reads`` (decoded) and ``Layout.writes`` (``pack``'s);
#: dense11 writes 3 and reads 1, 2 and 3.
FORMAT_VERSION = 1


class Arrays(Mapping):
    """A packed matrix's arrays by name: a read-only mapping (an array put in after ``Packed``
    checked them would reach the decoders unchecked). Its tensors themselves are not frozen: the
    decoders that cache checks key them on the tensor and its version counter.

    >>> import torch, glyd
    >>> p = glyd.pack(torch.ones(2, 3, dtype=torch.bfloat16))
    >>> p.arrays["base"] = torch.zeros(1, dtype=torch.uint8)
    Traceback (most recent call last):
    ...
    TypeError: 'Arrays' object does not support item assignment
    """

    __slots__ = ("_arrays",)

    def __init__(self, arrays: Mapping[str, torch.Tensor]) -> None:
        object.__setattr__(self, "_arrays", dict(arrays))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __reduce__(self):  # pickle and deepcopy (a module caching a Packed is copied with it)
        return (Arrays, (self._arrays,))

    def __repr__(self) -> str:
        return f"Arrays({', '.join(self._arrays)})"


@dataclass(frozen=True)
class Packed:
    """A bf16 matrix in a lossless packed layout.

    ``arrays`` holds plain tensors (the layout's planes and tables, see ``docs/format.md``), kept as
    a read-only :class:`Arrays` mapping; ``shape`` is the true ``(rows, cols)`` of the matrix,
    before any internal padding; ``version`` the layout's format version of the arrays (None: the
    version the layout writes now; a version it does not read raises FormatError).

    >>> import torch, glyd
    >>> p = glyd.pack(torch.ones(3, 5, dtype=torch.bfloat16), layout="tiered")
    >>> p.shape, p.layout, sorted(p.arrays)
    ((3, 5), 'tiered', ['area', 'd1', 'esc_base', 'esc_off', 'sm', 'table'])
    """

    layout: str
    shape: tuple[int, int]
    arrays: Mapping[str, torch.Tensor] = field(repr=False)
    version: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.arrays, Mapping):
            raise FormatError(f"arrays must map array names to tensors, got {type(self.arrays).__name__}")
        object.__setattr__(self, "arrays", Arrays(self.arrays))  # a copy: the caller's dict may change later
        if self.layout not in LAYOUTS:
            raise FormatError(f"unknown layout {self.layout!r} (known: {', '.join(LAYOUTS)})")
        lay = LAYOUTS[self.layout]
        object.__setattr__(self, "version", lay.writes if self.version is None else lay.check_version(self.version))
        if (
            len(self.shape) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in self.shape)
            or min(self.shape) < 0
        ):
            raise FormatError(f"shape must be two non-negative ints, got {self.shape!r}")
        object.__setattr__(self, "shape", (int(self.shape[0]), int(self.shape[1])))
        lay.check_arrays(self.shape, self.arrays)

    @classmethod
    def trusted(cls, layout: str, shape: tuple[int, int], arrays: Mapping[str, torch.Tensor], version: int) -> Packed:
        """A Packed over arrays the caller has validated before (as a ``Packed``), unchanged since:
        no checks (they cost tens of microseconds a product)."""
        p = object.__new__(cls)
        for name, value in (("layout", layout), ("shape", shape), ("arrays", Arrays(arrays)), ("version", version)):
            object.__setattr__(p, name, value)
        return p

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays (what the packed matrix occupies in memory or on disk)."""
        return sum(a.numel() * a.element_size() for a in self.arrays.values())

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.numel if self.numel else 0.0

    @property
    def device(self) -> torch.device:
        return next(iter(self.arrays.values())).device

    def to(self, device: torch.device | str) -> Packed:
        """The same packed matrix with every array on ``device``."""
        return Packed(self.layout, self.shape, {k: v.to(device) for k, v in self.arrays.items()}, self.version)

    def cuda(self, device: int | torch.device | str | None = None) -> Packed:
        """``to`` a CUDA device (the current one when ``device`` is None), as ``Tensor.cuda``."""
        return self.to("cuda" if device is None else f"cuda:{device}" if isinstance(device, int) else device)

    def cpu(self) -> Packed:
        """``to("cpu")``, as ``Tensor.cpu``."""
        return self.to("cpu")


def expect_array(
    arrays: Mapping[str, torch.Tensor], name: str, dtype: torch.dtype | tuple[torch.dtype, ...], shape: tuple[int, ...] | None
) -> torch.Tensor:
    """Return ``arrays[name]`` after checking its dtype and shape; raise FormatError naming it."""
    if name not in arrays:
        raise FormatError(f"packed array {name!r} is missing")
    a = arrays[name]
    if not isinstance(a, torch.Tensor):
        raise FormatError(f"packed array {name!r} is not a tensor")
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if a.dtype not in dtypes:
        raise FormatError(f"packed array {name!r} has dtype {a.dtype}, expected {' or '.join(map(str, dtypes))}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise FormatError(f"packed array {name!r} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    return a


def check_no_extra(arrays: Mapping[str, torch.Tensor], names: tuple[str, ...], layout: str) -> None:
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise FormatError(f"unexpected arrays for layout {layout!r}: {', '.join(extra)}")


def as_bf16_matrix(w: torch.Tensor, what: str = "matrix") -> torch.Tensor:
    """Check that ``w`` is a 2-D bf16 tensor; return it contiguous on the CPU."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype != torch.bfloat16:
        raise TypeError(f"{what} must be bfloat16, got {w.dtype} (glyd packs bf16 weights only; convert explicitly)")
    if w.dim() != 2:
        raise ValueError(f"{what} must be 2-D, got shape {tuple(w.shape)}")
    if w.is_meta:
        raise UnsupportedError(f"{what} is on the meta device (a shape with no values): load its weights first")
    return w.detach().to("cpu").contiguous()


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def u16_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    """bf16 tensor whose raw bits are ``bits`` (int32 values 0..65535)."""
    # Casting 32768..65535 to int16 wraps two's-complement on every platform torch supports;
    # the exhaustive 65,536-pattern tests pin that.
    return bits.to(torch.int16).view(torch.bfloat16)
