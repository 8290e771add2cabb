"""A packed layout as one unit: everything glyd needs to know of it, registered in one place.

``LAYOUTS`` maps a layout's name (the one stored in files) to its :class:`Layout`. Each layout's
codec module registers its entry at import (``glyd.codec`` imports them); a layout from elsewhere
(a test, a plugin) registers with :func:`register`. The entry holds:

* the codec, the source of truth: ``pack`` (CPU), ``unpack`` (CPU), ``check_arrays``, and the
  names of its arrays in the order the ``glyd::`` ops pass them and files store them;
* facts the layers above ask for: the array whose second dimension is the padded K, a row a
  matrix row (``padded_array``, ``[N, padded K]``), a line for help texts (``about``), the bits a weight to plan with (``bits``)
  and the bytes a row of K columns stores besides them (``row_bytes``: per-row tables);
* its format versions: ``reads`` (every version its codec decodes; files, ``Packed`` and the store
  accept these and refuse others) and ``writes`` (the version ``pack`` produces);
* its torch twins and kernels, named as ``"module:attribute"`` (imported at first use, so the
  codec imports nothing above it) or given as the objects themselves: ``rows`` (the ``glyd::rows``
  decode of some rows), ``device_pack`` (packing with torch ops on the matrix's own device),
  ``unpack_kernel`` / ``prepare_kernel`` (the GPU unpack and the per-matrix preparation before a
  CUDA graph) and ``kernels`` (the registry's kernel families of this layout: family key ->
  ``"module:Class"``). A layout without them still runs everywhere: the twins fall back to the
  whole-matrix codec and products to ``F.linear`` of the unpacked matrix.

>>> from glyd.codec import LAYOUTS
>>> lay = LAYOUTS["fixed12"]
>>> lay.arrays, lay.padded_array, lay.padded_cols(100)
(('lo', 'code', 'base', 'exc_idx', 'exc_hi'), 'lo', 128)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from glyd.errors import FormatError

__all__ = ["Layout", "LAYOUTS", "register", "resolve"]

#: A callable, or where to import it from: ``"package.module:attribute"``.
Ref = Any


@dataclass(frozen=True)
class Layout:
    """One packed layout (see the module's docstring for each field).

    >>> from glyd.codec import LAYOUTS
    >>> LAYOUTS["tiered"].kernels["tiered_gemv"]
    'glyd.kernels.tiered.gemv:TieredGemvKernel'
    """

    name: str
    arrays: tuple[str, ...]
    pack: Callable[[torch.Tensor], Any]
    unpack: Callable[[Any], torch.Tensor]
    check_arrays: Callable[[tuple[int, int], dict[str, torch.Tensor]], None]
    padded_cols: Callable[[int], int]
    padded_array: str
    about: str = ""
    bits: float | None = None
    row_bytes: Callable[[int], float] | None = None
    rows: Ref = None
    device_pack: Ref = None
    unpack_kernel: Ref = None
    prepare_kernel: Ref = None
    kernels: dict[str, str] = field(default_factory=dict)
    reads: tuple[int, ...] = (1,)
    writes: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a layout's name must be an identifier, got {self.name!r}")
        if not self.arrays or len(set(self.arrays)) != len(self.arrays):
            raise ValueError(f"layout {self.name!r}: arrays must be distinct names, got {self.arrays!r}")
        if self.padded_array not in self.arrays:
            raise ValueError(f"layout {self.name!r}: padded_array {self.padded_array!r} is not one of its arrays")
        for key, ref in self.kernels.items():
            if not key.startswith(f"{self.name}_") or not isinstance(ref, str) or ":" not in ref:
                raise ValueError(f"layout {self.name!r}: kernel family {key!r} must be named {self.name}_<what> "
                                 f"and given as 'module:Class', got {ref!r}")
        if self.writes not in self.reads:
            raise ValueError(f"layout {self.name!r}: writes version {self.writes} but reads only {self.reads}")

    def check_version(self, version: object) -> int:
        """``version`` if this layout reads it, else FormatError naming the version.

        >>> from glyd.codec import LAYOUTS
        >>> LAYOUTS["fixed12"].check_version(1)
        1
        """
        if type(version) is not int or version not in self.reads:
            known = ", ".join(map(str, self.reads))
            raise FormatError(f"layout {self.name!r} format version {version!r} is not supported "
                              f"(this glyd reads version {known})")
        return version

    @property
    def ARRAYS(self) -> tuple[str, ...]:  # noqa: N802 - the name the codec modules give the tuple
        """The same as ``arrays``."""
        return self.arrays

    def padded_k(self, arrays: dict[str, torch.Tensor]) -> int:
        """The padded K of a packed matrix of this layout (its ``padded_array``'s second dimension)."""
        return arrays[self.padded_array].shape[1]


#: Layout name -> its entry, in registration order (fixed12, tiered, dense11, then any added).
LAYOUTS: dict[str, Layout] = {}


def register(layout: Layout) -> Layout:
    """Make ``layout`` known to every part of glyd (``Packed``, the ops, the kernels, the store, the
    command line); returns it. A name is registered once."""
    if not isinstance(layout, Layout):
        raise TypeError(f"register takes a glyd.codec.Layout, got {type(layout).__name__}")
    if layout.name in LAYOUTS and LAYOUTS[layout.name] is not layout:
        raise ValueError(f"layout {layout.name!r} is registered already")
    taken = {key: name for name, lay in LAYOUTS.items() if name != layout.name for key in lay.kernels}
    clash = sorted(set(layout.kernels) & set(taken))
    if clash:
        raise ValueError(f"layout {layout.name!r}: kernel families {clash} are registered already")
    LAYOUTS[layout.name] = layout
    return layout


def unregister(name: str) -> None:
    """Forget the layout ``name`` (for tests that register a layout of their own)."""
    LAYOUTS.pop(name, None)


def resolve(ref: Ref) -> Any:
    """The object ``ref`` names: ``"package.module:attribute"`` imported, anything else as it is."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
