"""``tiered_unpack_cublas``: unpack into a reused bf16 scratch buffer, then cuBLAS (any M)."""

from __future__ import annotations

import dataclasses

from glyd.codec import tiered as _codec
from glyd.kernels import _common as C
from glyd.kernels.registry import Kernel
from glyd.kernels.tiered.unpack import unpack_launch


@dataclasses.dataclass(frozen=True)
class TieredLongConfig:
    """Unpack + cuBLAS (no settings)."""


class TieredLongKernel(Kernel):
    """Unpack into a reused bf16 scratch buffer, then cuBLAS: any tiered matrix."""

    name = "tiered_unpack_cublas"
    layout = "tiered"
    Config = TieredLongConfig
    any_rows = True  # its plan, the unpack launches and cuBLAS, holds for any M

    # x: bf16 [M, K]; packed: tiered [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        return cls.plan(x2, packed, bias, config)(x2, bias, out, tuple(packed.arrays[a] for a in _codec.ARRAYS))

    @classmethod
    def plan(cls, x2, packed, bias, config):
        # the offsets' check and the launch worked out once: per call, one unpack launch and cuBLAS
        n, k = packed.shape
        return C.unpack_mm_plan(x2.device, k, [(0, n, unpack_launch(packed))])
