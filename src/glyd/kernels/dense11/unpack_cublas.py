"""``dense11_unpack_cublas``: unpack into a reused bf16 scratch buffer, then cuBLAS (any M)."""

from __future__ import annotations

import dataclasses

from glyd.codec import dense11 as _codec
from glyd.kernels import _common as C
from glyd.kernels.dense11.versions import unpack_launch
from glyd.kernels.registry import Kernel


@dataclasses.dataclass(frozen=True)
class Dense11LongConfig:
    """Unpack + cuBLAS (no settings)."""


class Dense11LongKernel(Kernel):
    """Unpack into a reused bf16 scratch buffer, then cuBLAS: any dense11 matrix (either format version), any M."""

    name = "dense11_unpack_cublas"
    layout = "dense11"
    Config = Dense11LongConfig
    any_rows = True  # its plan, the unpack launches and cuBLAS, holds for any M

    # x: bf16 [M, K]; packed: dense11 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        return cls.plan(x2, packed, bias, config)(x2, bias, out, tuple(packed.arrays[a] for a in _codec.ARRAYS))

    @classmethod
    def plan(cls, x2, packed, bias, config):
        # the offsets' check and the launch worked out once: per call, one unpack launch (exceptions
        # inside it) and cuBLAS
        n, k = packed.shape
        C.check_launch_shapes(cls.name, x2, (n, k), bias=bias)
        return C.unpack_mm_plan(x2.device, k, [(0, n, unpack_launch(packed))])
