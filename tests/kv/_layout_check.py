"""Run by test_kv_kernel_layout with TRITON_INTERPRET=0: compile the decode kernel for sm_90 (no GPU
needed) and print, for every ``tl.cumsum`` in it, the rows its layout covers against the rows it has."""

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
    sig = {"q_ptr": "*bf16", "lens_ptr": "*i32", "starts_ptr": "*i32"}
    for pre in "kv":
        sig.update({f"{pre}_sm": "*i32", f"{pre}_dig": "*i32", f"{pre}_top": "*u8", f"{pre}_meta": "*i32",
                    f"{pre}_tailw": "*i32", f"{pre}_tail": "*u8", f"{pre}_raw": "*bf16"})
    sig.update({"m_out": "*fp32", "l_out": "*fp32", "acc_out": "*fp32", "qk_scale": "fp32", "H": "i32",
                "K_CAP": "i32", "V_CAP": "i32", "PAGES_PER_SPLIT": "i32", "S": "i32"})
    for arg in sys.argv[1:]:
        d, g = (int(v) for v in arg.split(","))
        const = dict(G=g, GP=16, P=64, D=d, DV=d, F32=False, TS=32)
        s = dict(sig)
        s.update({k: "constexpr" for k in const})
        k = triton.compile(ASTSource(fn=kt._kv_decode_split_kernel, signature=s, constexprs=const),
                           target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": kt.kernel_warps(4, d, d), "num_stages": 1})
        ttgir = k.asm["ttgir"]
        layouts = blocked(ttgir)
        scans = re.findall(r'"tt.scan"\(%\w+\) <\{axis = (\d) : i32.*?\}\) : \(tensor<(\d+)x(\d+)xi32, #(blocked\d*)>',
                           ttgir, re.S)
        for axis, rows, cols, lay in scans:
            spt, tpw, wpc = layouts[lay]
            ax = int(axis)
            print(f"SCAN d={d} axis={ax} shape={rows}x{cols} covered={spt[ax] * tpw[ax] * wpc[ax]} "
                  f"size={(int(rows), int(cols))[ax]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
