"""Ran against commit 497582d (check that commit out to run it).
Probe: where the fixed12 tensor-core (mma) tile kernel loses time, on one GPU.

Times 28 distinct 18944 x 3584 matrices (one CUDA graph, no L2 reuse) at M = 1 and 16 for a grid
of tile shapes, each in two modes: the real decode (glyd.kernels.fixed12's mma kernel) and
"loads only" (the same loads, pipelining and MMAs, with the decode replaced by one OR), against
bf16 F.linear in the same run. Prints a table last.

    PYTHONPATH=src python benchmarks/probe_mma.py
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from glyd import kernels
from glyd.kernels import _common as C
from glyd.kernels import fixed12 as kf
from glyd.timing import cuda_graph_ms


@triton.jit
def _loads_only(x_ptr, code_ptr, lo_ptr, out_ptr, M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
                BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    rnl = tl.minimum(rn, N - 1)
    rml = tl.minimum(rm, M - 1)
    j = tl.arange(0, 32)
    code_off = rnl[:, None] * stride_code + j[None, :]
    lo_off = rnl[:, None] * stride_lo + j[None, :]
    x_off = rml[None, :] * stride_xm + j[:, None]
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for kb in range(k0, k1, 64 * G):
        for g in tl.static_range(G):
            kg = kb + 64 * g
            c = tl.load(code_ptr + code_off + kg // 2).to(tl.uint16)
            la = tl.load(lo_ptr + lo_off + kg).to(tl.uint16)
            lb = tl.load(lo_ptr + lo_off + kg + 32).to(tl.uint16)
            xa = tl.load(x_ptr + x_off + kg)
            xb = tl.load(x_ptr + x_off + kg + 32)
            acc = tl.dot((la | (c << 8)).to(tl.bfloat16, bitcast=True), xa, acc)
            acc = tl.dot((lb | (c << 8)).to(tl.bfloat16, bitcast=True), xb, acc)
    tl.store(out_ptr + pid_k * M * N + rm[None, :] * N + rn[:, None], acc, mask=(rn < N)[:, None] & (rm < M)[None, :])


def main() -> int:
    n, k, reps = 18944, 3584, 28
    ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(reps)]
    ps = [kernels.pack(w, "fixed12") for w in ws]
    rows = []
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        t16 = cuda_graph_ms(lambda: [F.linear(x, w) for w in ws], 20) / reps * 1e3
        rows.append((m, "bf16 F.linear", "", t16, 1.0))
        tgm = cuda_graph_ms(lambda: [kernels.linear(x, p) for p in ps], 20) / reps * 1e3
        rows.append((m, "default", "", tgm, tgm / t16))
        for bn, g, st, w, wv in [(64, 1, 4, 4, 8), (64, 4, 3, 4, 4), (64, 8, 2, 4, 4), (32, 2, 4, 4, 8),
                                 (32, 4, 3, 4, 8), (32, 8, 3, 4, 8), (16, 4, 4, 4, 8), (16, 8, 3, 4, 8),
                                 (16, 16, 2, 4, 8), (32, 8, 3, 4, 16)]:
            cfg = C.Config(bm=16, bn=bn, mma=True, g=g, stages=st, warps=w, waves=wv)
            name = f"bn{bn} g{g} s{st} w{w} wv{wv}"
            try:
                ref = F.linear(x.double(), ws[0].double())
                err = ((kernels.linear(x, ps[0], None, cfg).double() - ref).norm() / ref.norm()).item()
                assert err < 5e-3, f"rel err {err}"
                t = cuda_graph_ms(lambda: [kernels.linear(x, p, None, cfg) for p in ps], 20) / reps * 1e3
                split, per = C.choose_split(triton.cdiv(n, bn), k, 64 * g, x.device, 0, wv)
                part = torch.empty(split, m, n, device="cuda")

                def lo(p=None):
                    for p in ps:
                        a = p.arrays
                        _loads_only[(triton.cdiv(n, bn), split)](x, a["code"], a["lo"], part, m, n, k, k, k, per,
                                                                   k // 2, k, BM=16, BN=bn, G=g, num_warps=w,
                                                                   num_stages=st)
                tl_ = cuda_graph_ms(lo, 20) / reps * 1e3
                rows.append((m, "mma " + name, f"split {split}", t, t / t16, tl_, tl_ / t16))
            except Exception as exc:  # report, keep going
                rows.append((m, "mma " + name, f"FAILED {str(exc)[:80]}", float("nan"), float("nan")))
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print("18944x3584, 28 copies, us a matrix (12-bit floor at 4.3 TB/s: 23.7 us; bf16: 31.6 us)")
    print("| M | kernel | grid | us | ratio to bf16 | loads-only us | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
