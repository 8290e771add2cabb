"""``tiered_unpack_cublas``: unpack into a reused bf16 scratch buffer, then cuBLAS (any M)."""

from __future__ import annotations

import dataclasses

from glyd.kernels import _common as C
from glyd.kernels.registry import Kernel
from glyd.kernels.tiered.unpack import unpack


@dataclasses.dataclass(frozen=True)
class TieredLongConfig:
    """Unpack + cuBLAS (no settings)."""


class TieredLongKernel(Kernel):
    """Unpack into a reused bf16 scratch buffer, then cuBLAS: any tiered matrix."""

    name = "tiered_unpack_cublas"
    layout = "tiered"
    Config = TieredLongConfig

    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        n, k = packed.shape
        w = unpack(packed, C.scratch(x2.device, n * k).view(n, k))
        return C.mm_into(x2, w, bias, out)
