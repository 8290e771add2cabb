"""``dense11_unpack_cublas``: unpack into a reused bf16 scratch buffer, then cuBLAS (any M)."""

from __future__ import annotations

import dataclasses

from glyd.codec import dense11 as _codec
from glyd.kernels import _common as C
from glyd.kernels.dense11.versions import unpack_launch
from glyd.kernels.registry import Kernel

#: the unpacks: "triton" (``versions.unpack_launch``: every format version, any GPU and the interpreter), "wg"
#: (``unpack_wg``: version 3 on a Hopper GPU, the wgmma tile's decode, K a multiple of 128, stored through shared
#: memory) and "wg_direct" (the same, stored from the decode's own layout)
UNPACKS = ("triton", "wg", "wg_direct")


@dataclasses.dataclass(frozen=True)
class Dense11LongConfig:
    """Unpack + cuBLAS. ``unpack``: which unpack fills the scratch buffer (``UNPACKS``).

    >>> Dense11LongConfig(unpack="wg").unpack
    'wg'
    """

    unpack: str = "triton"

    def __post_init__(self) -> None:
        if self.unpack not in UNPACKS:
            raise ValueError(f"unpack must be one of {', '.join(UNPACKS)}, got {self.unpack!r}")


class Dense11LongKernel(Kernel):
    """Unpack into a reused bf16 scratch buffer, then cuBLAS: any dense11 matrix (either format version), any M."""

    name = "dense11_unpack_cublas"
    layout = "dense11"
    Config = Dense11LongConfig
    any_rows = True  # its plan, the unpack launches and cuBLAS, holds for any M

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok or config is None or config.unpack == "triton":
            return ok, why
        u = config.unpack
        if "wgmma" not in device.features:
            return False, f'unpack "{u}" needs Gluon on a Hopper GPU (sm_90)'
        if problem.version != 3:
            return False, f'unpack "{u}" decodes dense11 format version 3; this matrix is version {problem.version}'
        if problem.k != problem.kp or problem.k % 128:
            return False, f'unpack "{u}" needs K a multiple of 128 (no padded columns), got K = {problem.k}'
        return True, ""

    # x: bf16 [M, K]; packed: dense11 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        return cls.plan(x2, packed, bias, config)(x2, bias, out, tuple(packed.arrays[a] for a in _codec.ARRAYS))

    @classmethod
    def plan(cls, x2, packed, bias, config):
        # the offsets' check and the launch worked out once: per call, one unpack launch (exceptions
        # inside it, or after it for "wg" and "wg_direct") and cuBLAS
        n, k = packed.shape
        C.check_launch_shapes(cls.name, x2, (n, k), bias=bias)
        if config is not None and config.unpack != "triton":
            from glyd.kernels.dense11.unpack_wg import unpack_wg_launch  # Gluon: imported only where it runs

            launch = unpack_wg_launch(packed, direct=config.unpack == "wg_direct")
            return C.unpack_mm_plan(x2.device, k, [(0, n, launch)])
        return C.unpack_mm_plan(x2.device, k, [(0, n, unpack_launch(packed))])
