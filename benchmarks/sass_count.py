"""Static sm_90 SASS of the fixed12 `tc` kernel, compiled on any machine (no GPU needed).

Compiles ``_tc_kernel`` (``glyd.kernels.fixed12.word_dot``) for an H100/H200 target with Triton,
disassembles it with the ``cuobjdump`` that ships with Triton, and prints registers, spill stack,
shared memory, the instructions of the whole kernel and of its main loop (the largest backward
branch), and the counts of global loads, async copies and MMA instructions. Each spec is
``bm,bn,bk,warps,stages[,FLAG=0|1...]`` (flags: PREFETCH (Gluon: 0, 1 or 2 steps ahead), ASYNC (Gluon: async-copy
ring stages), XASYNC (Gluon: x rows in the ring); GLUON=1: the explicit-layout kernel of ``fixed12_gluon`` instead,
bm 16, 32 or 64 and 4 warps). tc's pair decode (``PAIRS``, ``TC_PAIRS``) is gone (497582d has it).

    PYTHONPATH=src .venv/bin/python benchmarks/sass_count.py 16,64,256,4,1 16,64,256,4,1,PREFETCH=1 16,64,256,4,1,GLUON=1

``--kv`` does the same for the KV decode-attention kernel of ``glyd.kv._gluon`` (as the
launcher compiles it: one warp, maxnreg 168, 7 query heads a KV head; its timing probes, ``PROBE``,
are gone: this script's 497582d version compiles them), and splits the instructions of
its chunk loop by pipe (a static guess from the opcode: ``alu`` integer and logic, ``fma`` multiply-add
and float, ``lsu`` loads and stores, ``shfl``, ``other``) and by the kernel function they come from
(``nvdisasm`` line info; a function inlined into another counts as itself). The expansion loops run
as many times as a chunk's busiest group has escapes; a static count takes each once.

    PYTHONPATH=src .venv/bin/python benchmarks/sass_count.py --kv
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

from glyd.kernels.fixed12 import word_dot as fixed12_tc

PTRS = {"x_ptr": "*bf16", "code_ptr": "*i32", "lo_ptr": "*i32", "lo8_ptr": "*u8", "base_ptr": "*u8",
        "rowptr_ptr": "*i32", "eidx_ptr": "*i64", "ehi_ptr": "*u8", "bias_ptr": "*bf16", "out_ptr": "*bf16",
        "fin_ptr": "*bf16", "cnt_ptr": "*i32"}
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+[A-Z@]")


def compile_tc(bm: int, bn: int, bk: int, warps: int, stages: int, GLUON: bool = False, **flags) -> dict:
    if GLUON:  # the explicit-layout kernel (bm 16, 32 or 64: one decoded tile for 1, 2 or 4 x tiles; 4 warps)
        from triton.experimental.gluon._runtime import GluonASTSource

        from glyd.kernels.fixed12 import mma_v2 as g

        kern, source = g._gl_kernel, GluonASTSource
        words, xl, mma, a_op, b_op = g.layouts(bn, bk, warps)
        const = {"BN": bn, "BK": bk, "WL": words, "XL": xl, "ML": mma, "AL": a_op, "BL": b_op, "MT": bm // 16,
                 "PREFETCH": int(flags.get("PREFETCH", 0)), "STAGES": int(flags.get("ASYNC", 1)),
                 "SL": g.ring_layout(bn, bk, warps, int(flags["ASYNC"])) if int(flags.get("ASYNC", 1)) > 1 else None,
                 "XASYNC": bool(flags.get("XASYNC", 0))}
        if const["XASYNC"]:
            const["XCL"], const["XSL"] = g.x_ring_layouts(bk, warps)
        # every other constexpr at its default (exceptions in a pass of their own, fp32 partials out): the
        # kernel's signature would otherwise give them an i32 type (GLUON=1 failed so in 497582d too)
        const.update({q.name: q.default for q in kern.params
                      if q.is_constexpr and q.has_default and q.name not in const})
        ptrs = {**PTRS, "lo_ptr": "*i32", "code_ptr": "*i32", "part_ptr": "*fp32"}
    else:
        kern, source = fixed12_tc._tc_kernel, ASTSource
        const = dict(BM=bm, BN=bn, BK=bk, EVEN=True, PRMT=True, HAS_BIAS=False, HAS_EXC=True, PARTIAL=True,
                     F32DOT=False, FIXUP=False, PREFETCH=False)
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


ALU = {"LOP3", "SHF", "PRMT", "ISETP", "SEL", "VIMNMX", "VIMNMX3", "IADD3", "LEA", "POPC", "SGXT", "FSEL", "FMNMX",
       "VIADDMNMX", "FSETP", "BMSK", "FLO", "IABS", "PLOP3", "P2R", "R2P", "MOV", "IMNMX", "CS2R", "BREV"}
FMA = {"IMAD", "FMUL", "FADD", "FFMA", "VIADD", "HMMA", "F2FP", "MUFU"}
LSU = {"LDG", "STG", "LDS", "STS", "LDL", "STL", "LDC"}


def kv_loop() -> dict:
    """Registers and the chunk loop's instructions of the Gluon KV kernel, by pipe and by source function."""
    import ast
    import collections

    from triton.experimental.gluon._runtime import GluonASTSource

    from glyd.kv import _gluon as g

    kern = g._kv_gluon_kernel
    const = dict(g.layouts(), G=7, GP=8, PREFETCH=True)
    ptrs = {"q_ptr": "*bf16", "lens_ptr": "*i32", "starts_ptr": "*i32", "valid_ptr": "*u8", "m_out": "*fp32",
            "l_out": "*fp32", "acc_out": "*fp32"}
    for pre in ("k_", "v_"):
        ptrs.update({pre + n: t for n, t in (("sm", "*i32"), ("dig", "*i32"), ("top", "*i32"), ("meta", "*i32"),
                                             ("tailw", "*i32"), ("tail", "*u8"), ("raw", "*bf16"))})
    names = kern.arg_names
    sig = {n: "constexpr" if n in const else ptrs.get(n, "fp32" if n == "qk_scale" else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in ptrs}
    k = triton.compile(GluonASTSource(kern, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=1, maxnreg=168))
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        dis = subprocess.run([os.path.join(bindir, "nvdisasm"), "-g", "-c", f.name], capture_output=True, text=True,
                             check=True).stdout
        res = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    func = {}  # source line -> innermost function of the kernel file
    for node in ast.walk(ast.parse(open(g.__file__).read())):
        if isinstance(node, ast.FunctionDef):
            for ln in range(node.lineno, node.end_lineno + 1):
                if ln not in func or func[ln][1] < node.lineno:
                    func[ln] = (node.name, node.lineno)
    rows, labels, pending, where = [], {}, [], "?"
    for ln in dis.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
        if m:
            same = os.path.samefile(m.group(1), g.__file__) if os.path.exists(m.group(1)) else False
            where = func.get(int(m.group(2)), ("?", 0))[0] if same else "triton (" + os.path.basename(m.group(1)) + ")"
            continue
        m = re.match(r"\s*(\.L_x_\d+):", ln)
        if m:
            pending.append(m.group(1))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln)
        if m:
            a = int(m.group(1), 16)
            labels.update((p, a) for p in pending)
            pending = []
            rows.append((a, m.group(3).split(".")[0], where, ln))
    lo = hi = 0  # the chunk loop: the longest backward branch
    for a, op, _, ln in rows:
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", ln)
        if m and labels.get(m.group(1), a) < a and a - labels[m.group(1)] > hi - lo:
            lo, hi = labels[m.group(1)], a
    body = [r for r in rows if lo <= r[0] <= hi]
    pipes, funcs = collections.Counter(), collections.Counter()
    for _, op, where, _ in body:
        pipes["alu" if op in ALU else "fma" if op in FMA else "lsu" if op in LSU else "shfl" if op == "SHFL"
              else "other"] += 1
        funcs[where] += 1
    return {"registers": int(re.search(r"REG:(\d+)", res).group(1)), "stack": int(re.search(r"STACK:(\d+)", res).group(1)),
            "loop": len(body), "pipes": dict(pipes), "functions": funcs.most_common()}


def main(argv=None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if argv[:1] == ["--kv"]:
        if argv[1:] not in ([], ["0"]):  # the probes of 497582d (0 was the kernel as shipped)
            raise SystemExit(f"sass_count.py --kv takes no probes any more (got {argv[1]!r}): they are gone with "
                             "glyd.kv's PROBE; check out 497582d for them")
        r = kv_loop()
        print(f"KV Gluon kernel: registers {r['registers']}, stack {r['stack']}, chunk loop "
              f"{r['loop']} instructions ({', '.join(f'{k} {v}' for k, v in sorted(r['pipes'].items()))})")
        print("  by function: " + ", ".join(f"{n} {c}" for n, c in r["functions"]))
        return 0
    specs = argv or ["16,64,256,4,1", "16,64,256,4,1,PREFETCH=1"]
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
