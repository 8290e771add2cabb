"""``dense11_unpack_cublas``: unpack into a reused bf16 scratch buffer, then cuBLAS (any M)."""

from __future__ import annotations

import dataclasses

from glyd.kernels import _common as C
from glyd.kernels.dense11.unpack import unpack
from glyd.kernels.registry import Kernel


@dataclasses.dataclass(frozen=True)
class Dense11LongConfig:
    """Unpack + cuBLAS (no settings)."""


class Dense11LongKernel(Kernel):
    """Unpack into a reused bf16 scratch buffer, then cuBLAS: any dense11 matrix, any M."""

    name = "dense11_unpack_cublas"
    layout = "dense11"
    Config = Dense11LongConfig

    # x: bf16 [M, K]; packed: dense11 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        n, k = packed.shape
        w = unpack(packed, C.scratch(x2.device, n * k).view(n, k))
        return C.mm_into(x2, w, bias, out)
