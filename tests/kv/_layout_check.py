"""Run by test_kv_kernel_layout with TRITON_INTERPRET=0: compile the decode kernel for sm_90 (no GPU
needed) as the launcher would, and print

* for every ``tl.cumsum``: the rows its layout covers against the rows it has (``SCAN`` lines);
* for every bf16 ``tl.dot`` on tensor cores: its reduction length ``K`` and the operands' ``kWidth``
  (``DOT`` lines). Triton 3.6 lowers a 16-bit mma-v2 dot wrongly when ``K < 4 * kWidth``: 4 lanes x
  ``kWidth`` values span more than ``K``, so some k slots repeat channels and others are never read
  (head dim 16 gave 0.58 relative error on the H200, 2026-11-30).

Arguments: ``D,G[,P[,TS]]`` (head dim, query heads a KV head, page, sub-tile; P=64, TS=32 by default).
"""

from __future__ import annotations

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from glyd.kv import _triton as kt


def blocked(ttgir: str) -> dict[str, list[list[int]]]:
    out = {}
    pat = (r"^#(blocked\d*) = #ttg.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\], "
           r"warpsPerCTA = \[([\d, ]+)\]")
    for m in re.finditer(pat, ttgir, re.M):
        out[m.group(1)] = [[int(v) for v in m.group(i).split(",")] for i in (2, 3, 4)]
    return out


def main() -> int:
    sig = {"q_ptr": "*bf16", "lens_ptr": "*i32", "starts_ptr": "*i32", "valid_ptr": "*u8", "VS": "i32"}
    for pre in "kv":
        sig.update({f"{pre}_sm": "*i32", f"{pre}_dig": "*i32", f"{pre}_top": "*u8", f"{pre}_meta": "*i32",
                    f"{pre}_tailw": "*i32", f"{pre}_tail": "*u8", f"{pre}_raw": "*bf16"})
    sig.update({"m_out": "*fp32", "l_out": "*fp32", "acc_out": "*fp32", "qk_scale": "fp32", "H": "i32",
                "K_CAP": "i32", "V_CAP": "i32", "PAGES_PER_SPLIT": "i32", "S": "i32"})
    for arg in sys.argv[1:]:
        vals = [int(v) for v in arg.split(",")]
        d, g, p, ts = (vals + [64, 32][len(vals) - 2:])[:4]
        # with the attention mask's row read (a static cache's decode steps always read it)
        const = dict(G=g, GP=16, P=p, D=d, DV=d, F32=False, TS=min(ts, p), QK_F32=kt.qk_f32(d), HAS_VALID=True)
        s = dict(sig)
        s.update({k: "constexpr" for k in const})
        # the launcher's options: kernel_warps, Triton's default num_stages, maxnreg 128
        k = triton.compile(ASTSource(fn=kt._kv_decode_split_kernel, signature=s, constexprs=const),
                           target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": kt.kernel_warps(4, d, d), "maxnreg": 128})
        ttgir = k.asm["ttgir"]
        layouts = blocked(ttgir)
        scans = re.findall(r'"tt.scan"\(%\w+\) <\{axis = (\d) : i32.*?\}\) : \(tensor<(\d+)x(\d+)xi32, #(blocked\d*)>',
                           ttgir, re.S)
        for axis, rows, cols, lay in scans:
            spt, tpw, wpc = layouts[lay]
            ax = int(axis)
            print(f"SCAN d={d} axis={ax} shape={rows}x{cols} covered={spt[ax] * tpw[ax] * wpc[ax]} "
                  f"size={(int(rows), int(cols))[ax]}")
        dots = re.findall(r"tt\.dot [^\n]*?: tensor<(\d+)x(\d+)x(bf16|f16), #ttg\.dot_op<\{opIdx = 0, "
                          r"parent = #mma\d*, kWidth = (\d+)\}>>", ttgir)
        for m_, k_, _, kw in dots:
            print(f"DOT d={d} page={p} sub_tile={const['TS']} M={m_} K={k_} kWidth={kw}")
        print(f"DOTS d={d} page={p} sub_tile={const['TS']} fp32={ttgir.count('tt.dot ') - len(dots)} mma={len(dots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
