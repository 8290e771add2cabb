"""Profile the fixed12 decode-step kernels with Nsight Compute, against bf16 F.linear.

Runs each kernel once (after a warm-up outside the profiled range) on one 18944 x 3584 matrix
(Qwen2.5-7B's gate/up shape) at M = 1, 2 and 8, so ``ncu --profile-from-start off`` sees only
those launches:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SchedulerStats \\
        python3 benchmarks/profile_ncu.py

Without ncu it just checks each variant against float64 F.linear and prints its name.
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.nn.functional as F

from glyd import kernels
from glyd.kernels import _common as C

log = logging.getLogger("profile_ncu")

VARIANTS = {
    # name: (M, Config or None for the default, or "bf16")
    "bf16 M=1": (1, "bf16"),
    "f12 default M=1": (1, None),
    "f12 gv bm1 bn32 bk256 wv8 M=1": (1, C.Config(bm=1, bn=32, bk=256, dot=False, group_major=True, stages=1,
                                                  waves=8)),
    "bf16 M=2": (2, "bf16"),
    "f12 gv bm2 bn32 bk256 wv8 M=2": (2, C.Config(bm=2, bn=32, bk=256, dot=False, group_major=True, stages=1,
                                                  waves=8)),
    "bf16 M=8": (8, "bf16"),
    "f12 gv bm8 bn32 bk128 wv8 M=8": (8, C.Config(bm=8, bn=32, bk=128, dot=False, group_major=True, stages=1,
                                                  waves=8)),
}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    n, k = 18944, 3584
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    p = kernels.pack(w, "fixed12")
    runs = []
    for name, (m, cfg) in VARIANTS.items():
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        if cfg == "bf16":
            fn = (lambda x=x: F.linear(x, w))
        else:
            fn = (lambda x=x, cfg=cfg: kernels.linear(x, p, None, cfg))
            ref = F.linear(x.double(), w.double())
            err = ((fn().double() - ref).norm() / ref.norm()).item()
            if not err < 5e-3:
                raise SystemExit(f"{name}: relative error {err:.3g} against float64 F.linear")
        fn()
        runs.append((name, fn))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in runs:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    for name, _ in runs:
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
