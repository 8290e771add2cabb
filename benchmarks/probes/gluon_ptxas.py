"""Compile fixed12's warp-specialized wgmma tile (a Gluon kernel) for sm_90a on the CPU and print what ptxas says
about it: registers, spills, and its wgmma advisories ("wgmma.mma_async instructions are serialized ...": ptxas then
waits for every wgmma before the next, whatever the kernel asks). No GPU needed.

    PYTHONPATH=src .venv/bin/python benchmarks/probes/gluon_ptxas.py --bm 256 --bn 64 --stages 2 [--pipe]
"""

from __future__ import annotations

import argparse
import os
import re
import sys


def compile_ws(bm: int, bn: int, stages: int, pipe: bool, warps: int, maxnreg: int, exc: bool, m: int, n: int,
               k: int, chunk: int = 16, xt: bool = False, pre: bool = False,
               corr: bool = False):
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import create_function_from_signature

    from glyd.kernels.fixed12 import wgmma_warpspec as W
    from glyd.kernels.fixed12.wgmma import exc_layout

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    ll, cl, mma, a_op, ol, (lsl, csl, xsl) = W.layouts(bn, bm, warps)
    lo = torch.zeros(n, k, dtype=torch.uint8)
    code = torch.zeros(n, k // 2, dtype=torch.uint8)
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    lo_d = TensorDescriptor.from_tensor(lo.view(torch.int32), [bn, 32], lsl)
    co_d = TensorDescriptor.from_tensor(code.view(torch.int32), [bn, 16], csl)
    x_d = TensorDescriptor.from_tensor(x, [bm, 64], xsl)
    base = torch.zeros(16, dtype=torch.uint8)
    out = torch.zeros(m, n, dtype=torch.bfloat16)
    ring = torch.zeros(16, dtype=torch.float32)
    cnt = torch.zeros(16, dtype=torch.int32)
    idx = torch.zeros(16, dtype=torch.int32)
    args = (lo_d, co_d, x_d, x, base, out, out, ring, cnt, m, n, k, k, k // W.BK, 1, 1000)
    kw = dict(BN=bn, BT=bm, NS=stages, LL=ll, CL=cl, ML=mma, AL=a_op, OL=ol, HAS_BIAS=False, EXC=exc,
              EL=exc_layout(warps, xt) if exc else None, rowptr_ptr=idx if exc else None, eidx_ptr=idx if exc else None,
              ehi_ptr=base if exc else None,
              lo8_ptr=(torch.zeros(16, dtype=torch.int16) if pre else lo) if exc else None, CS=4,
              NBYTES=W.slot_bytes(bn, bm), PIPE=pipe, XE=chunk,
              XT=xt and exc, PRE=pre if exc else 0,
              CORR=corr, corr_ptr=ring if corr else None)
    jf = W._ws_kernel
    binder = create_function_from_signature(jf.signature, jf.params, backend)
    bound, spec, _ = binder(*args, **kw)
    opts = {"num_warps": warps}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    _, sig, consts, attrs = jf._pack_args(backend, dict(opts), bound, spec, {})
    return triton.compile(GluonASTSource(jf, sig, consts, attrs), target=target, options=opts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bm", type=int, default=256)
    ap.add_argument("--bn", type=int, default=64)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--maxnreg", type=int, default=0)
    ap.add_argument("--pipe", action="store_true")
    ap.add_argument("--exc", action="store_true", help="with the exception step where a tile is finished")
    ap.add_argument("--exc-chunk", type=int, default=16, help="exceptions a one-hot MMA (WsConfig.exc_chunk)")
    ap.add_argument("--xt", action="store_true", help="their x columns from x transposed (WsConfig.exc_xt)")
    ap.add_argument("--pre", action="store_true", help="their values prepared, a round ahead (WsConfig.exc_pre)")
    ap.add_argument("--vals", action="store_true", help="their values prepared, in the round (WsConfig.exc_vals)")
    ap.add_argument("--rows", action="store_true", help="by the accumulator's own threads a row at a time (WsConfig.exc_rows)")
    ap.add_argument("--corr", action="store_true", help="a correction from their own pass added (WsConfig.exc_corr)")
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--sass", default=None, help="write the SASS here")
    args = ap.parse_args()
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    k = compile_ws(args.bm, args.bn, args.stages, args.pipe, args.warps, args.maxnreg, args.exc, args.m, args.n,
                   args.k, args.exc_chunk, args.xt or args.rows, 3 if args.rows else 1 if args.pre else 2 if args.vals else 0,
                   args.corr)
    print(f"shared {k.metadata.shared} B, warps {k.metadata.num_warps}")
    ptx = k.asm["ptx"]
    print("wgmma in PTX:", len(re.findall(r"wgmma\.mma_async", ptx)), " wait_group:",
          re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx))
    if args.sass:  # Triton's "sass" needs a GPU's tools path: disassemble the cubin with the bundled nvdisasm
        import subprocess
        import tempfile
        import triton.backends.nvidia as nv
        tool = os.path.join(os.path.dirname(nv.__file__), "bin", "nvdisasm")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            sass = subprocess.run([tool, "-c", "-g", f.name], capture_output=True, text=True, check=True).stdout
        with open(args.sass, "w") as f:
            f.write(sass)
    return 0


if __name__ == "__main__":
    sys.exit(main())
