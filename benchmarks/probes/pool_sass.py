"""Static sm_90 SASS of the static pool's attention kernel (``glyd.kv._triton_fixed``, issue 34), byte-wise and
word decode (``AttentionConfig.swar``), at the launch shapes ``kv.py speed --pool-variants`` times; compiled on
any machine (no GPU), as the launcher compiles it (16-byte aligned pointers).

    PYTHONPATH=src python3 benchmarks/probes/pool_sass.py [--valid]

For each shape: registers a thread, spilled loads and stores, dynamic shared memory a program, the programs an
SM those allow (65,536 registers, 227 KB), and the hot loop's instructions by kind (the innermost loop that
decodes packed pages: a sub-tile, or a whole page at ``sub_tile=64``; the blocks that run only for pages with
exceptions, left out: where ptxas duplicated the decode into such a block, the copy on the path without
exceptions is the one counted) with the thread-instructions a page of 64 tokens that makes. A static count:
it says where the instructions go, not how long they take.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from glyd.kv import _triton_fixed as kf

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
KINDS = {"mem": ("LDS", "STS", "LDSM", "STSM", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDG", "STG", "LDL", "STL"),
         "sync": ("BAR", "SHFL", "BSSY", "BSYNC"), "mma": ("HMMA",),
         "move": ("MOV", "UMOV", "R2UR", "S2R", "P2R", "R2P", "CS2R", "NOP")}


def signature(swar: bool) -> dict[str, str]:
    s = {"q_ptr": "*bf16", "lens_ptr": "*i32", "starts_ptr": "*i32", "valid_ptr": "*u8", "VS": "i32",
         "bidx_ptr": "*i32"}
    for pre in "kv":
        word = "*i32" if swar else "*u8"
        s.update({f"{pre}_lo": word, f"{pre}_code": word, f"{pre}_base": "*u8", f"{pre}_meta": "*i32",
                  f"{pre}_exc": "*i32", f"{pre}_raw": "*bf16"})
    s.update({"m_out": "*fp32", "l_out": "*fp32", "acc_out": "*fp32", "qk_scale": "fp32", "H": "i32", "J": "i32",
              "CAP": "i32", "PAGES_PER_SPLIT": "i32", "S": "i32"})
    return s


def compile_kernel(warps: int, ts: int, maxnreg: int, swar: bool, stages: int, valid: bool):
    fn = kf._kvf_decode_split_kernel
    const = dict(G=7, GP=16, P=64, D=128, DV=128, F32=False, TS=ts, QK_F32=False, HAS_VALID=valid, SWAR=swar,
                 PRMT=True)
    sig = signature(swar)
    sig.update({k: "constexpr" for k in const})
    names = list(fn.arg_names)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*")}
    opts = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {}),
            **({"num_stages": stages} if stages else {})}
    return triton.compile(ASTSource(fn=fn, signature={n: sig[n] for n in names}, constexprs=const, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def sass_of(kernel) -> tuple[str, int]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", path], capture_output=True, text=True,
                             check=True).stdout
    return sass, int(re.search(r"REG:(\d+)", res).group(1))


def _patches(body) -> set[int]:
    """Addresses of the exception patch blocks in a loop: a forward branch over a block that loads entries."""
    skip = set()
    for a, t in body:
        m = re.match(r"@!?P\d BRA 0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) > a:
            blk = [x for x in body if a < x[0] < int(m.group(1), 16)]
            if len(blk) > 40 and any(re.match(r"LDG\.E R", x[1]) for x in blk):
                skip |= {x[0] for x in blk}
    return skip


def hot_loop(sass: str) -> list[str]:
    """The innermost loop that decodes packed pages (it holds the dots and the patch blocks; the raw page's
    loop has no patch), without the patch blocks."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in map(INSN.search, sass.splitlines()) if m]
    loops = []
    for a, t in ins:
        m = re.search(r"BRA (?:!?U?P\d, )?0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a:
            body = [x for x in ins if int(m.group(1), 16) <= x[0] <= a]
            skip = _patches(body)
            if skip and any("HMMA" in x[1] for x in body):
                loops.append([t for a, t in body if a not in skip])
    return min(loops, key=len)


def kind(t: str) -> str:
    op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
    for name, ops in KINDS.items():
        if op in ops:
            return name
    if op == "IMAD" and ".MOV" in t:
        return "move"
    if op.startswith("F") or op == "MUFU":
        return "float"
    return "uniform" if op.startswith("U") else "int"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--valid", action="store_true", help="with the attention mask's row read (GlydStaticCache's steps)")
    args = ap.parse_args()
    shapes = [(4, 32, 0, False, 0), (4, 32, 128, False, 0), (4, 64, 0, False, 0), (8, 32, 0, False, 0),
              (4, 32, 0, True, 0), (4, 32, 128, True, 0), (4, 32, 96, True, 2), (4, 64, 0, True, 0),
              (4, 64, 128, True, 0),
              (8, 32, 0, True, 2), (8, 64, 0, True, 0)]
    print(f"triton {triton.__version__}, sm_90, G=7 (GP 16), pages of 64, head dim 128, mask row read: {args.valid}\n")
    print("| variant | registers | spills (LDL/STL) | shared KB | programs an SM | hot loop: tokens, instructions "
          "(int, mem, move, float, sync, mma) | thread-instructions a page |")
    print("|---|---|---|---|---|---|---|")
    for w, ts, mr, swar, st in shapes:
        k = compile_kernel(w, ts, mr, swar, st, args.valid)
        sass, regs = sass_of(k)
        hot = hot_loop(sass)
        tokens = ts  # the sub-tile's loop (at sub_tile=64: the page's)
        kinds = collections.Counter(map(kind, hot))
        spills = f"{len(re.findall(r'LDL', sass))}/{len(re.findall(r'STL', sass))}"
        progs = min(65536 // (regs * 32 * w), 227 * 1024 // (k.metadata.shared + 1024), 64 // w)
        name = f"w{w} s{ts} r{mr or '-'}" + (" swar" if swar else "") + (f" n{st}" if st else "")
        parts = ", ".join(str(kinds[x]) for x in ("int", "mem", "move", "float", "sync", "mma"))
        print(f"| {name} | {regs} | {spills} | {k.metadata.shared / 1024:.1f} | {progs} | {tokens}: {len(hot)} "
              f"({parts}) | {len(hot) * 64 // tokens * 32 * w:,} |")


if __name__ == "__main__":
    main()
