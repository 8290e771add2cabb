"""dense11's GPU unpack and per-matrix preparation for either format version: the layout's
``unpack_kernel`` and ``prepare_kernel`` (``glyd.codec.dense11``), and the unpack launch of
``dense11_unpack_cublas``. Version 1 (bit planes): ``unpack.py``; versions 2 and 3: ``unpack_v2.py``.

>>> import torch, glyd
>>> from glyd.kernels.dense11 import versions
>>> p = glyd.pack(torch.randn(3, 70).to(torch.bfloat16), "dense11")
>>> torch.equal(versions.unpack(p).view(torch.int16), glyd.unpack(p).view(torch.int16))
True
"""

from __future__ import annotations

from typing import Any

import torch

from glyd.codec.packed import Packed
from glyd.kernels import _plan
from glyd.kernels.dense11 import unpack as _v1
from glyd.kernels.dense11 import unpack_v2 as _v2
from glyd.kernels.dense11.decode_v2 import prepare as _prepare_v2
from glyd.kernels.dense11.unpack import Dense11UnpackConfig
from glyd.kernels.dense11.unpack_v2 import Dense11V2UnpackConfig

#: The unpack configs (``glyd.kernels.<Name>`` finds a config class in the layout's unpack module).
__all__ = ["prepare", "unpack_launch", "unpack", "Dense11UnpackConfig", "Dense11V2UnpackConfig"]


def prepare(p: Packed) -> Any:
    """The checked per-matrix data of ``p`` (version 1's or versions 2 and 3's ``Prepared``), built once a matrix."""
    return _prepare_v2(p) if isinstance(p, Packed) and p.version in (2, 3) else _v1.prepare(p)


# packed: dense11 [N, K] -> launch(out, *arrays): out bf16 [N, K] (written, contiguous)
def unpack_launch(p: Packed, config: Any = None) -> _plan.Launch:
    """The unpack of ``p`` as one ``glyd.kernels._plan.Launch``, by its format version."""
    if isinstance(p, Packed) and p.version in (2, 3):
        return _v2.unpack_launch(p, config)
    return _v1.unpack_launch(p, config)


# packed: dense11 [N, K] -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, config: Any = None) -> torch.Tensor:
    """The bf16 matrix of ``p`` on its device, bit for bit (into ``out`` when given), by its format version."""
    return _v2.unpack(p, out, config) if isinstance(p, Packed) and p.version in (2, 3) else _v1.unpack(p, out, config)
