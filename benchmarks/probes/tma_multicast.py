"""(issue 38) Does this Triton's Gluon give a TMA copy multicast to a cluster? CPU only: compiles a one-copy kernel
for sm_90 with ``num_ctas`` CTAs a cluster and its x layout broadcast to every CTA (``cga_layout`` bases of zeros), and
prints the PTX's bulk tensor copies. The ws tile reads x from L2 again for every weight tile; cuBLAS's kernel shares one
operand between a cluster's two CTAs by a multicast copy (benchmarks/history/2026-12-07-h100-29.md).

    PYTHONPATH=src python3 benchmarks/probes/tma_multicast.py              # 2 CTAs, x broadcast
    PYTHONPATH=src python3 benchmarks/probes/tma_multicast.py "[[0, 0], [0, 0]]"  # 4 CTAs

Triton 3.6.0 (2026-12-07): the cluster launch is there (``.reqnctapercluster``), but each CTA copies the broadcast box
itself (``cp.async.bulk.tensor ... shared::cluster`` without ``.multicast::cluster``), and Gluon's Python has no
cluster rank or shared-memory address for a hand-written multicast copy.
"""

from __future__ import annotations

import argparse
import ast

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma


@gluon.jit
def _copy(x_desc, out_ptr, SL: gl.constexpr, BL: gl.constexpr):
    # one [128, 64] box of x into shared memory by TMA, then out = that box
    s = gl.allocate_shared_memory(gl.bfloat16, [128, 64], SL)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, 128 * 64 * 2)
    tma.async_copy_global_to_shared(x_desc, [0, 0], bar, s)
    mbarrier.wait(bar, 0)
    v = s.load(BL)
    r = gl.arange(0, 128, layout=gl.SliceLayout(1, BL))[:, None]
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, BL))[None, :]
    gl.store(out_ptr + r * 64 + c, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cga", nargs="?", default="[[0, 0]]",
                    help="the layouts' cga_layout bases (one a doubling of the CTAs; zeros: broadcast)")
    cga = ast.literal_eval(ap.parse_args().cga)
    sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, cga_layout=cga)
    bl = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=cga)
    sig = {"x_desc": f"tensordesc<bf16[128, 64],{sl!r}>", "out_ptr": "*bf16", "SL": "constexpr", "BL": "constexpr"}
    k = triton.compile(GluonASTSource(_copy, sig, {"SL": sl, "BL": bl}, {}), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_ctas=2 ** len(cga)))
    ptx = k.asm["ptx"].splitlines()
    print(f"triton {triton.__version__}, {2 ** len(cga)} CTAs a cluster, cga_layout {cga}")
    print("cluster:", [ln.strip() for ln in ptx if "cluster" in ln and ln.strip().startswith(".")])
    print("copies:", [ln.strip() for ln in ptx if "cp.async.bulk.tensor" in ln])
    print("multicast copies:", [ln.strip() for ln in ptx if ".multicast::cluster" in ln])


if __name__ == "__main__":
    main()
