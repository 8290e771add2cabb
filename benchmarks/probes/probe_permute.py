"""Ran against commit 497582d (check that commit out to run it).
Time the ws tile's x permutation (``fixed12_ws.permute_x``) a launch, against ``x.clone()`` and
a one-element Triton kernel (the cost of any launch), each as a CUDA graph of 28 launches on a bf16
[M, 3584] x (a Qwen2.5-7B step runs one before each of its 28 gate_up and its lm_head matrices),
median of 50 replays. Needs a CUDA GPU.

    PYTHONPATH=src python3 benchmarks/probe_permute.py --ms 1,16,64
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

from glyd.kernels.fixed12 import wgmma_warpspec as fixed12_ws
from glyd.timing import cuda_graph_ms


@triton.jit
def _one(x_ptr, o_ptr):
    tl.store(o_ptr, tl.load(x_ptr))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16,64")
    args = ap.parse_args(argv)
    n = 28
    for m in (int(v) for v in args.ms.split(",")):
        x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
        o = torch.empty(1, device="cuda", dtype=torch.bfloat16)
        t_perm = cuda_graph_ms(lambda: [fixed12_ws.permute_x(x) for _ in range(n)], 50) / n * 1e3
        t_clone = cuda_graph_ms(lambda: [x.clone() for _ in range(n)], 50) / n * 1e3
        t_one = cuda_graph_ms(lambda: [_one[(1,)](x, o) for _ in range(n)], 50) / n * 1e3
        print(f"M={m}: permute_x {t_perm:.2f} us, x.clone {t_clone:.2f} us, one-element Triton kernel {t_one:.2f} us "
              f"(a launch in a graph of {n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
