"""The static pool's attention kernel (``glyd.kv._triton_fixed``, issue 34) counted whole, not just its hot loop:
static sm_90 SASS, compiled on any machine (no GPU), split by region and modelled a page and a program.

    PYTHONPATH=src python3 benchmarks/probes/pool_sass_regions.py [--variant 4,32,96,1,2] [--functions]

Regions, from the loops of the SASS (backward branches): the prologue (before the page loop), the page loop
outside its sub-tiles (block-table entry, window bases, exception range), a sub-tile without exceptions (the
hot loop of ``pool_sass.py``; at ``sub_tile=64`` it is the page loop and holds the page's work), the exception patch loops (an entry outside the sub-tile: the shortest path
through the loop; an entry in it: the mean of the other paths), the raw page (only the split that holds it)
and the epilogue (the partials for the combine kernel). The model: a page costs its region once, its
sub-tiles ``P / sub_tile`` times and, for each of a block's exception entries, the skip path every sub-tile
plus the patch once (``--kexc``/``--vexc`` entries a page: the Qwen-shaped rates of docs/kv.md, 0.0479% of a
key page's 8192 values and 0.0157% of a value page's); a program costs the prologue and the epilogue once,
spread over the pages a program takes at ``--tokens`` x ``--seqs`` on ``--sms`` SMs. Nsight Compute measured
about 196K thread-instructions a page at 16K x 1 on the H100 (2026-12-05) for the table's variant.
``--functions``: each region's instructions by the kernel function their line info names. A static count: it
says where the instructions go, not how long they take.
"""

from __future__ import annotations

import argparse
import ast
import collections
import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pool_sass  # noqa: E402

from glyd.kv import _triton_fixed  # noqa: E402

LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"^(@!?U?P\w+\s+)?BRA\s+`\((\.L_x_\d+)\)")


def _functions() -> dict[tuple[str, int], str]:
    """(file's base name, line) -> the innermost function of glyd.kv's kernel files that holds it."""
    where = {}
    kv = os.path.dirname(_triton_fixed.__file__)
    for name in ("_triton_fixed.py", "_triton_words.py", "_triton.py"):
        spans = {}
        for node in ast.walk(ast.parse(open(os.path.join(kv, name)).read())):
            if isinstance(node, ast.FunctionDef):
                for ln in range(node.lineno, node.end_lineno + 1):
                    if ln not in spans or spans[ln][1] < node.lineno:
                        spans[ln] = (node.name, node.lineno)
        where.update({(name, ln): f for ln, (f, _) in spans.items()})
    return where


def disassemble(kernel) -> list[dict]:
    """The kernel's instructions: address, text, the labels that name it, the kernel function of its line info."""
    funcs = _functions()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        dis = subprocess.run([os.path.join(pool_sass.BIN, "nvdisasm"), "-g", "-c", path], capture_output=True,
                             text=True, check=True).stdout
    rows, pending, where = [], [], "?"
    for ln in dis.splitlines():
        m = LINE.search(ln)
        if m:
            base = os.path.basename(m.group(1))
            where = funcs.get((base, int(m.group(2))), f"({base})")
            continue
        m = LABEL.match(ln)
        if m:
            pending.append(m.group(1))
            continue
        m = INSN.search(ln)
        if m:
            rows.append({"addr": int(m.group(1), 16), "text": m.group(2), "labels": pending, "func": where})
            pending = []
    last = max(i for i, r in enumerate(rows) if r["text"].split()[-1] == "EXIT")
    return rows[: last + 1]  # after the last EXIT: a branch to itself and NOP padding, never run


def _targets(rows) -> tuple[dict[str, int], list[tuple[int, int]]]:
    """Label -> index; loops as (index of the head, index of the backward branch)."""
    at = {lab: i for i, r in enumerate(rows) for lab in r["labels"]}
    loops = []
    for i, r in enumerate(rows):
        m = BRANCH.match(r["text"])
        if m and at[m.group(2)] <= i:
            loops.append((at[m.group(2)], i))
    return at, loops


def _paths(rows, at, lo: int, hi: int) -> list[int]:
    """Instructions on each acyclic path through the loop body rows[lo..hi] (head to the backward branch)."""
    out = []

    def walk(i: int, n: int, seen: frozenset) -> None:
        while True:
            if i in seen or len(out) > 4096:
                return
            n += 1
            m = BRANCH.match(rows[i]["text"])
            if i == hi:
                out.append(n)
                return
            if m:
                t = at[m.group(2)]
                if lo <= t <= hi and t > i:
                    walk(t, n, seen | {i})
                if not m.group(1):  # unconditional: no fall-through
                    return
            i += 1

    walk(lo, 0, frozenset())
    return sorted(out)


def regions(rows) -> dict:
    """Instructions by region (see the module's docstring) and the patch loops' skip and hit paths."""
    at, loops = _targets(rows)
    has = {lp: any("HMMA" in rows[k]["text"] for k in range(lp[0], lp[1] + 1)) for lp in loops}
    kids = {lp: [c for c in loops if c != lp and lp[0] <= c[0] and c[1] <= lp[1]] for lp in loops}
    tile = min((lp for lp in loops if has[lp] and kids[lp]), key=lambda lp: lp[1] - lp[0])
    parents = [lp for lp in loops if has[lp] and lp != tile and lp[0] <= tile[0] and tile[1] <= lp[1]]
    page = min(parents, key=lambda lp: lp[1] - lp[0]) if parents else tile
    patches = kids[tile]
    region = ["prologue"] * len(rows)
    for i in range(page[0], page[1] + 1):
        region[i] = "page" if tile[0] > i or i > tile[1] else "sub-tile"
    for lo, hi in patches:
        for i in range(lo, hi + 1):
            region[i] = "patch"
    skip = None  # the raw page: the first forward branch after the page loop that jumps over dots
    for i in range(page[1] + 1, len(rows)):
        m = BRANCH.match(rows[i]["text"])
        if m and at[m.group(2)] > i and any("HMMA" in rows[k]["text"] for k in range(i, at[m.group(2)])):
            skip = (i + 1, at[m.group(2)])
            break
    for i in range(page[1] + 1, len(rows)):
        region[i] = "raw page" if skip and skip[0] <= i < skip[1] else "epilogue"
    paths = [_paths(rows, at, lo, hi) for lo, hi in patches]
    # entries a trip: the entry loads on the skip path (the loop may take several entries a trip)
    per = [max(1, sum(1 for i in range(lo, hi + 1) if re.match(r"(@!?P\d+ )?LDG\.E R", rows[i]["text"])
                      and not BRANCH.match(rows[i]["text"]))) for lo, hi in patches]
    return {"region": region, "patch_paths": paths, "per_trip": per}


def model(counts, paths, per_trip, ts: int, kexc: float, vexc: float) -> dict:
    """Warp instructions a page (without and with exceptions) and a program, from the region counts. A patch loop
    taking ``k`` entries a trip runs ``n / k`` trips a sub-tile (and half a trip of padding on average); an entry
    in the sub-tile adds the mean of the paths that patch one entry (the shortest increments) to its trip."""
    tiles = 64 // ts
    base = counts["page"] + tiles * counts["sub-tile"]
    exc = 0.0
    for p, k, n in zip(paths, per_trip, (kexc, vexc)):  # the key side's loop comes first in the SASS
        d = [x - p[0] for x in p[1:]] or [0]
        one = [x for x in d if x < 1.5 * min(d)]
        trips = n / k + (k - 1) / (2 * k) if n else 0.0
        exc += tiles * trips * p[0] + n * sum(one) / len(one)
    return {"page": base, "page_exc": base + exc, "program": counts["prologue"] + counts["epilogue"]}


def pages_per_program(tokens: int, seqs: int, heads: int, sms: int, pps: int) -> float:
    """Pages a program (the launcher's split of a pool of ``tokens + 64`` a sequence, as ``kv.py speed`` makes)."""
    jcap = tokens // 64 + 1
    splits = max(1, min(jcap, math.ceil(pps * sms / (seqs * heads))))
    per = max(1, math.ceil(jcap / splits))
    splits = math.ceil(jcap / per)
    return tokens / 64 / splits


def report(variant, args) -> None:
    w, ts, mr, swar, st = variant
    k = pool_sass.compile_kernel(w, ts, mr, bool(swar), st, args.valid)
    _, regs = pool_sass.sass_of(k)
    rows = disassemble(k)
    r = regions(rows)
    counts = collections.Counter(r["region"])
    m = model(counts, r["patch_paths"], r["per_trip"], ts, args.kexc, args.vexc)
    ppp = pages_per_program(args.tokens, args.seqs, 4, args.sms, args.pps)
    th = 32 * w
    name = f"w{w} s{ts} r{mr or '-'}" + (" swar" if swar else "") + (f" n{st}" if st else "")
    print(f"\n## {name}: {regs} registers, {k.metadata.shared / 1024:.1f} KB shared, {len(rows)} instructions")
    print("\n| region | instructions | by kind (int, mem, move, float, sync, mma, uniform) |\n|---|---|---|")
    for reg in ("prologue", "page", "sub-tile", "patch", "raw page", "epilogue"):
        ins = [rows[i]["text"] for i in range(len(rows)) if r["region"][i] == reg]
        kinds = collections.Counter(map(pool_sass.kind, ins))
        parts = ", ".join(str(kinds[x]) for x in ("int", "mem", "move", "float", "sync", "mma", "uniform"))
        print(f"| {reg} | {len(ins)} | {parts} |")
    for side, p, k in zip(("key", "value"), r["patch_paths"], r["per_trip"]):
        print(f"\n{side} patch loop, {k} entries a trip, paths (instructions): {p}")
    per_page = m["page_exc"] + m["program"] / ppp
    print(f"\nwarp instructions: a page {m['page']:.0f} without exceptions, {m['page_exc']:.0f} with "
          f"{args.kexc} key / {args.vexc} value entries; a program {m['program']}; {ppp:.2f} pages a program at "
          f"{args.tokens} x {args.seqs} ({args.sms} SMs, {args.pps} programs an SM)")
    print(f"thread-instructions a page: sub-tiles {64 // ts * counts['sub-tile'] * th:,}, page region "
          f"{counts['page'] * th:,}, exceptions {(m['page_exc'] - m['page']) * th:,.0f}, prologue + epilogue "
          f"{m['program'] / ppp * th:,.0f}; all {per_page * th:,.0f}")
    if args.functions:
        for reg in ("prologue", "page", "sub-tile", "patch", "epilogue"):
            f = collections.Counter(rows[i]["func"] for i in range(len(rows)) if r["region"][i] == reg)
            print(f"  {reg}: " + ", ".join(f"{n} {c}" for n, c in f.most_common()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=None,
                    help="warps,sub_tile,maxnreg,swar,num_stages (default: the H100 table's 4,32,96,1,2)")
    ap.add_argument("--valid", action="store_true", help="with the attention mask's row read")
    ap.add_argument("--kexc", type=float, default=3.9, help="exception entries a key page (default 3.9)")
    ap.add_argument("--vexc", type=float, default=1.3, help="exception entries a value page (default 1.3)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--pps", type=int, default=4, help="programs an SM (the H100 table's 4)")
    ap.add_argument("--functions", action="store_true", help="each region's instructions by kernel function")
    args = ap.parse_args()
    print(f"triton, sm_90, G=7 (GP 16), pages of 64, head dim 128, mask row read: {args.valid}")
    for v in args.variant or ["4,32,96,1,2"]:
        report(tuple(int(x) for x in v.split(",")), args)


if __name__ == "__main__":
    main()
