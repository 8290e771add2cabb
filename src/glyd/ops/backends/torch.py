"""The pure-torch twins of the ``glyd::`` ops: the default implementation on every device.

``unpack`` is the CPU reference codec (``glyd.codec``, the source of truth); arrays on another
device are decoded on the CPU and the matrix copied back (on CUDA the kernels decode in place,
``backends/cuda.py``: this path is taken there only without Triton or for a layout without
kernels); ``linear`` is ``F.linear(x, unpack(W).to(x.dtype), bias)``; ``rows`` decodes only the
rows asked for, with torch ops of fixed shapes on the arrays' device (``glyd.ops.rows``).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from glyd.codec import LAYOUTS, Packed
from glyd.errors import FormatError
from glyd.codec import unpack as _codec_unpack
from glyd.ops.rows import unpack_rows

__all__ = ["packed", "linear", "unpack", "rows"]


#: id(first array) -> (the key of the arrays validated last, the ids watched): no references held
#: (the entry dies with any of its arrays, see ``packed``).
_VALID: dict[int, tuple] = {}


def packed(layout: str, shape, arrays, version: int) -> Packed:
    """The ``Packed`` an op's arguments describe: validated the first time, then (the same tensors,
    not changed in place since) built without checks: a module passes its buffers on every call."""
    if layout not in LAYOUTS:
        raise FormatError(f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    names = LAYOUTS[layout].arrays
    if len(arrays) != len(names):
        raise ValueError(f"{layout} has {len(names)} arrays ({', '.join(names)}), got {len(arrays)}")
    if len(shape) != 2:
        raise FormatError(f"shape must be the matrix's [rows, cols], got {list(shape)}")
    shape = (int(shape[0]), int(shape[1]))
    key = (layout, shape, version, tuple(map(id, arrays)), tuple(a._version for a in arrays))
    first = id(arrays[0])
    hit = _VALID.get(first)
    if hit is not None and hit[0] == key:
        return Packed.trusted(layout, shape, dict(zip(names, arrays)), version)
    p = Packed(layout, shape, dict(zip(names, arrays)), version)
    watched = set() if hit is None else hit[1]  # ids of the arrays whose death drops the entry
    _VALID[first] = (key, watched)
    # any array's death drops it, not only the first's: CPython gives a freed array's id to the next
    # tensor made (version 0), which would match the key
    for a in arrays:
        if id(a) not in watched:
            watched.add(id(a))
            weakref.finalize(a, _VALID.pop, first, None)
    return p


def unpack(layout: str, shape, arrays, version: int) -> torch.Tensor:
    p = packed(layout, shape, arrays, version)
    if p.device.type == "cpu":
        return _codec_unpack(p)
    return _codec_unpack(p.to("cpu")).to(p.device)


def linear(x: torch.Tensor, layout: str, shape, arrays, bias, version: int) -> torch.Tensor:
    w = unpack(layout, shape, arrays, version).to(device=x.device, dtype=x.dtype)
    return F.linear(x, w, bias)


def rows(layout: str, shape, arrays, version: int, index: torch.Tensor) -> torch.Tensor:
    return unpack_rows(packed(layout, shape, arrays, version), index)
