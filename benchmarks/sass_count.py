"""Static sm_90 SASS of the fixed12 `tc` kernel, compiled on any machine (no GPU needed).

Compiles ``_tc_kernel`` for an H100/H200 target with Triton, disassembles it with the
``cuobjdump`` that ships with Triton, and prints registers, spill stack, shared memory, the
instructions of the whole kernel and of its main loop (the largest backward branch), and the
counts of global loads, async copies and MMA instructions. Each spec is
``bm,bn,bk,warps,stages[,FLAG=0|1...]`` (flags: PREFETCH (Gluon: 0, 1 or 2 steps ahead), ASYNC (Gluon: async-copy ring stages), PAIRS; GLUON=1: the explicit-layout
kernel of ``fixed12_gluon`` instead, bm 16, 32 or 64 and 4 warps).

    PYTHONPATH=src .venv/bin/python benchmarks/sass_count.py 16,64,256,4,1 16,64,256,4,1,PAIRS=1 16,64,256,4,1,GLUON=1
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from glyd.kernels import fixed12

PTRS = {"x_ptr": "*bf16", "code_ptr": "*i32", "lo_ptr": "*i32", "lo8_ptr": "*u8", "base_ptr": "*u8",
        "rowptr_ptr": "*i32", "eidx_ptr": "*i64", "ehi_ptr": "*u8", "bias_ptr": "*bf16", "out_ptr": "*bf16",
        "fin_ptr": "*bf16", "cnt_ptr": "*i32"}
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+[A-Z@]")


def compile_tc(bm: int, bn: int, bk: int, warps: int, stages: int, GLUON: bool = False, **flags) -> dict:
    if GLUON:  # the explicit-layout kernel (bm 16, 32 or 64: one decoded tile for 1, 2 or 4 x tiles; 4 warps)
        from triton.experimental.gluon._runtime import GluonASTSource

        from glyd.kernels import fixed12_gluon as g

        kern, source = g._gl_kernel, GluonASTSource
        words, xl, mma, a_op, b_op = g.layouts(bn, bk, warps)
        const = {"BN": bn, "BK": bk, "WL": words, "XL": xl, "ML": mma, "AL": a_op, "BL": b_op, "MT": bm // 16,
                 "PREFETCH": int(flags.get("PREFETCH", 0)), "STAGES": int(flags.get("ASYNC", 1)),
                 "SL": g.ring_layout(bn, bk, warps, int(flags["ASYNC"])) if int(flags.get("ASYNC", 1)) > 1 else None,
                 "XASYNC": bool(flags.get("XASYNC", 0))}
        if const["XASYNC"]:
            const["XCL"], const["XSL"] = g.x_ring_layouts(bk, warps)
        ptrs = {**PTRS, "lo_ptr": "*i32", "code_ptr": "*i32", "part_ptr": "*fp32"}
    else:
        kern, source = fixed12._tc_kernel, ASTSource
        const = dict(BM=bm, BN=bn, BK=bk, EVEN=True, PRMT=True, HAS_BIAS=False, HAS_EXC=True, PARTIAL=True,
                     F32DOT=False, FIXUP=False, PREFETCH=False, PAIRS=False)
        const.update(flags)
        ptrs = PTRS
    names = kern.arg_names
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in names}
    # pointers and row strides divisible by 16, as the launcher's tensors are
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n in ptrs or n.startswith("stride") or n in ("K_SPLIT", "KP")}
    k = triton.compile(source(kern, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in sass.splitlines() if INSN.search(ln)]
    addr = [int(INSN.search(ln).group(1), 16) for ln in lines]
    loop = 0
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\()?0x([0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < addr[i]:
            t = int(m.group(1), 16)
            loop = max(loop, sum(1 for a in addr if t <= a <= addr[i]))
    return {"registers": int(re.search(r"REG:(\d+)", res).group(1)),
            "stack": int(re.search(r"STACK:(\d+)", res).group(1)), "shared": k.metadata.shared,
            "instructions": len(lines), "loop": loop, "LDG": sass.count("LDG"),
            "async": len(re.findall(r"LDGSTS|UBLKCP|UTMALDG", sass)), "LDS": len(re.findall(r"LDS", sass)),
            "BAR": len(re.findall(r"BAR\.SYNC|BAR\.ARV|BAR ", sass)), "mma": len(re.findall(r"HMMA|HGMMA", sass))}


def main(argv=None) -> int:
    specs = (argv if argv is not None else sys.argv[1:]) or ["16,64,256,4,1", "16,64,256,4,1,PAIRS=1"]
    for spec in specs:
        parts = spec.split(",")
        bm, bn, bk, warps, stages = (int(v) for v in parts[:5])
        flags = {p.split("=")[0]: int(p.split("=")[1]) for p in parts[5:]}
        r = compile_tc(bm, bn, bk, warps, stages, **flags)
        per = r["loop"] / (bn * bk / (32 * warps))
        print(f"bm{bm} bn{bn} bk{bk} w{warps} s{stages} {flags or ''}: " + ", ".join(f"{k} {v}" for k, v in r.items())
              + f"; loop instructions a weight a thread {per:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
