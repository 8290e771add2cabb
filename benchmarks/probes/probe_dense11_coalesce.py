#!/usr/bin/env python3
"""Issue 35: does dense11 version 2's fused GEMV get fast when each warp load is fully coalesced? Times
version 2's arrays relaid block-wise (``dense11_coalesce.py``: a block's c0 words, then c1, then c2;
its runs' first 16-byte ``sm`` halves, then the second halves) against version 2's own order, before
anyone changes the file format.

On the merged Qwen2.5-7B shapes (qkv 4608 x 3584, o 3584 x 3584, gate_up 37888 x 3584, down 3584 x
18944; random weights, std 0.02) at M = 1 and 16: bf16 ``F.linear``, the version-2 GEMV
(``Dense11V2GemvKernel.launch``) with prefetch off and on, and the relaid copy (``dense11_coalesce.gemv``)
with prefetch off and on, and (since format version 3 is in src/) ``v3``: ``Dense11V3GemvKernel`` on a
version-3 pack of the same weights, each with ``--gemv`` configs (default: the default tile, bn 16 x bk 256 on 4
warps). Checked first on each shape's first copy: every product within 5e-3 (relative norm) of float64,
the relaid GEMV equal to version 2's bit for bit (same config), prefetch on equal to off. Timing: one
CUDA graph over enough copies of the matrix that the packed bytes pass ~300 MB (far beyond the H200's
L2; ``benchmarks/sweep_shapes.py``'s rule), median of ``--replays`` replays (``glyd.timing.cuda_graph_ms``)
divided by the copies; the table (us a matrix, x bf16, and a layer's sum) is printed last.

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python3 benchmarks/probes/probe_dense11_coalesce.py \\
        [--ms 1,16] [--gemv bn=16,bk=256 ...] [--replays 30] [--out DIR]

``--tiny``: the whole probe on the CPU under ``TRITON_INTERPRET=1`` on tiny shapes (ragged N and K,
K splits, whole tiles, exceptions; times NaN). ``--sass``: both GEMVs compiled for sm_90 on the CPU
with the 7B shapes' launch arguments (Triton's own specialization: M = 1 and a split's one block
become constants as on the GPU; default compile options, as the launcher): registers, stack, spill
instructions, and a K step's global loads by width and by source (weights, escape digits, x, block
offsets), ``LDGSTS`` (``cp.async``) apart; static counts only.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if "--tiny" in sys.argv:
    import warnings

    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    # the interpreter runs uint32 arithmetic in numpy, whose wrap-around (meant) warns
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import glyd  # noqa: E402
import dense11_coalesce as DC  # noqa: E402
from glyd.codec import dense11  # noqa: E402
from glyd.kernels.dense11.gemv_v2 import (Dense11V2GemvConfig, Dense11V2GemvKernel, Dense11V3GemvConfig,  # noqa: E402
                                          Dense11V3GemvKernel)
from glyd.kernels.gpu_pack import pack_dense11  # noqa: E402

SHAPES = [("qkv", 4608, 3584), ("o", 3584, 3584), ("gate_up", 37888, 3584), ("down", 3584, 18944)]
#: --tiny: ragged N and K, a split's partial block, whole tiles with a last block of 16 runs, exceptions
TINY = [("qkv", 48, 1536, "crowded"), ("o", 40, 200, "wide"), ("gate_up", 64, 512, "normal"),
        ("down", 32, 1056, "crowded")]
H200_SMS = 132


def gemv_spec(spec: str) -> Dense11V2GemvConfig:
    """``Dense11V2GemvConfig`` of ``"bn=32,bk=128,warps=4,dot=tile"`` (``prefetch`` is the probe's own axis).

    >>> gemv_spec("bn=32,bk=128")  # doctest: +NORMALIZE_WHITESPACE
    Dense11V2GemvConfig(bn=32, bk=128, mb=64, split=0, warps=4, dot='tile', prefetch=False, prefetch_depth=1,
                        x_prefetch=False)
    """
    kw: dict = {}
    for part in filter(None, spec.split(",")):
        key, _, val = part.partition("=")
        kw[key] = val if key == "dot" else int(val)
    return Dense11V2GemvConfig(**kw)


#: the GEMVs: version 2's, the relaid copy with decode_words unchanged, and with its digit gathers 1-D, and
#: format version 3's own (src: ``Dense11V3GemvKernel``, relaid1d promoted, on a version-3 pack of the weights)
KINDS = ("v2", "relaid", "relaid1d", "v3")


def variants(specs: list[str]) -> dict:
    """{label: (kind, config)}: for each spec, each of ``KINDS`` with prefetch off and on."""
    out = {}
    for s in specs:
        cfg = gemv_spec(s)
        tag = f" {s}" if s else ""
        for kind in KINDS:
            for pf in (False, True):
                c = Dense11V2GemvConfig(**{**cfg.__dict__, "prefetch": pf})
                out[f"{kind}{'+pf' if pf else ''}{tag}"] = (kind, c)
    return out


def product(x: torch.Tensor, mat: tuple, kind: str, cfg: Dense11V2GemvConfig, out: torch.Tensor) -> torch.Tensor:
    """One GEMV of ``x`` with ``mat`` = (bf16 W, Packed v2, Relaid, Packed v3) into ``out``."""
    if kind == "v2":
        return Dense11V2GemvKernel.launch(x, mat[1], None, cfg, out)
    if kind == "v3":
        return Dense11V3GemvKernel.launch(x, mat[3], None, Dense11V3GemvConfig(**cfg.__dict__), out)
    return DC.gemv(x, mat[2], None, cfg, out, win1d=kind == "relaid1d")


def build(n: int, k: int, copies: int, dev: str, kind: str) -> list[tuple]:
    """``copies`` matrices (bf16 W, version-2 Packed, Relaid, version-3 Packed) on ``dev``, packed there."""
    mats = []
    for i in range(copies):
        if dev == "cpu":
            w = DC.weights(n, k, seed=n + k + i, kind=kind)
        else:
            w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        p = pack_dense11(w, version=2) if dev != "cpu" else dense11.pack_v2(w)
        p3 = pack_dense11(w, version=3) if dev != "cpu" else dense11.pack_v3(w)
        assert (p.version, p3.version) == (2, 3)
        mats.append((w, p, DC.Relaid(p), p3))
    return mats


def check(name: str, mat: tuple, xs: dict, vs: dict) -> list[str]:
    """Failures on one matrix: float64 within 5e-3, relaid == version 2 and prefetch on == off bit for bit."""
    fails = []
    w, p, r, _ = mat
    c, s = DC.restore(r.code, r.sm)
    if not (torch.equal(c, p.arrays["code"]) and torch.equal(s, p.arrays["sm"])):
        fails.append(f"{name}: the relayout does not round-trip")
    for m, x in xs.items():
        want = F.linear(x.double(), w.double())
        bits = {}
        for label, (kind, cfg) in vs.items():
            y = product(x, mat, kind, cfg, torch.empty(m, w.shape[0], dtype=torch.bfloat16, device=x.device))
            err = ((y.double() - want).norm() / want.norm()).item()
            if not err < 5e-3 or not torch.isfinite(y).all():
                fails.append(f"{name} M={m} {label}: rel err {err:.3g}")
            bits[label] = y.view(torch.int16)
        for label, b in bits.items():
            twin = re.sub(r"^(relaid1d|relaid|v3)", "v2", label).replace("+pf", "")  # v2, prefetch off
            if twin != label and not torch.equal(b, bits[twin]):
                fails.append(f"{name} M={m} {label}: bits differ from {twin}")
    return fails


def timed_us(fn, copies: int, replays: int, dev: str) -> float:
    """Microseconds a matrix: median graph replay over all copies / copies (NaN on the CPU: one eager run)."""
    if dev != "cuda":
        fn()
        return float("nan")
    from glyd.timing import cuda_graph_ms

    return cuda_graph_ms(fn, replays) / copies * 1e3


def run_shape(name: str, n: int, k: int, kind: str, args, vs: dict, dev: str) -> tuple[list[str], dict]:
    """Checks then times one shape: (failures, {M: {variant: us}})."""
    copies = max(2, min(28, -(-300_000_000 // (n * k * 3 // 2)))) if dev == "cuda" else 1
    t0 = time.time()
    mats = build(n, k, copies, dev, kind)
    xs = {m: torch.randn(m, k, device=dev).to(torch.bfloat16) for m in args.ms}
    fails = check(name, mats[0], xs, vs)
    logline(f"{name} {n}x{k}: {copies} copies, built and checked in {time.time() - t0:.0f} s, "
            f"{len(fails)} failures")
    res: dict = {}
    if fails:
        return fails, res
    for m, x in xs.items():
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device=dev) for _ in mats]
        row = {"bf16": timed_us(lambda: [F.linear(x, mt[0]) for mt in mats], copies, args.replays, dev)}
        for label, (gemv, cfg) in vs.items():
            def fn(gemv=gemv, cfg=cfg):
                return [product(x, mt, gemv, cfg, o) for mt, o in zip(mats, outs)]
            row[label] = timed_us(fn, copies, args.replays, dev)
        res[m] = row
        logline(f"{name} M={m}: " + ", ".join(f"{v} {t:.1f}" for v, t in row.items()))
    del mats
    if dev == "cuda":
        torch.cuda.empty_cache()
    return fails, res


def logline(s: str) -> None:
    print(s, flush=True)


def table(res: dict, labels: list[str]) -> str:
    """Markdown: us a matrix and x bf16 for each shape and M, then each M's layer sum (the four shapes)."""
    lines = ["| shape | M | bf16 us | " + " | ".join(f"{v} us (x bf16)" for v in labels) + " |",
             "|---|---|---|" + "---|" * len(labels)]
    sums: dict = {}
    for name, by_m in res.items():
        for m, row in by_m.items():
            lines.append(f"| {name} | {m} | {row['bf16']:.1f} | "
                         + " | ".join(f"{row[v]:.1f} ({row[v] / row['bf16']:.3f}x)" for v in labels) + " |")
            acc = sums.setdefault(m, collections.Counter())
            for v, t in row.items():
                acc[v] += t
    for m, row in sums.items():
        lines.append(f"| layer | {m} | {row['bf16']:.1f} | "
                     + " | ".join(f"{row[v]:.1f} ({row[v] / row['bf16']:.3f}x)" for v in labels) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# --sass: static sm_90 counts


LOC = re.compile(r'//## File "([^"]+)", line (\d+)')
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
BRA = re.compile(r"BRA\s+`\(\.(L_x_\d+)\)")
LABEL = re.compile(r"^\s*\.(L_x_\d+):")
#: the function a global load sits in -> what it reads
SOURCES = {"load_step": "weights", "load_step_c": "weights", "_window": "esc digits", "_window_1d": "esc digits",
           "_fma_half": "x",
           "_dot_tile": "x", "_dot_half": "x", "block_start": "offsets", "_exceptions": "exceptions",
           "_exceptions_c": "exceptions"}


def launch_args(kernel, m: int, n: int, k: int, cfg: Dense11V2GemvConfig, sms: int = H200_SMS,
                win1d: bool | None = None) -> tuple[dict, dict]:
    """(signature, constexprs) of the launch ``Dense11V2GemvKernel.launch`` (or ``DC.gemv``) makes on an
    H200 for x [m, k] and a [n, k] matrix with exceptions: Triton's own specialization of each argument
    (ints of 1 become constants, multiples of 16 get ``tt.divisibility``); pointers 16-byte aligned."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from glyd.kernels.dense11.gemv_v2 import x_rows

    kp = -(-k // 64) * 64
    nbr = -(-kp // DC.BLOCK)
    mb = x_rows(m, cfg.mb)
    tiles = -(-n // cfg.bn) * -(-m // mb)
    split = cfg.split or (nbr if tiles < 2 * sms else 1)
    per = -(-nbr // max(1, min(split, nbr)))
    bk = min(cfg.bk, 1 << (kp - 1).bit_length())
    ints = dict(M=m, N=n, K=k, KP=kp, NBR=nbr, NESCW=12345, BLOCKS_SPLIT=per, stride_xm=k)
    const = dict(BN=cfg.bn, BK=bk, MB=mb, HW=True, HAS_BIAS=False, HAS_EXC=True, PARTIAL=-(-nbr // per) > 1,
                 X32=k % 2 == 0, FULL=n % cfg.bn == 0 and k == kp and kp % bk == 0, TILE_DOT=cfg.dot != "lanes",
                 W_FIRST=cfg.dot == "tile_wx", PREFETCH=cfg.prefetch)
    if win1d is not None:  # the relaid kernel's own constexpr
        const["WIN1D"] = win1d
    ptrs = dict(x_ptr="*bf16", x32_ptr="*i32", sm_ptr="*i32", sm8_ptr="*u8", code_ptr="*i32", esc_ptr="*i32",
                ebase_ptr="*i32", eoff_ptr="*u16", rowptr_ptr="*i32", eidx_ptr="*i64", eexp_ptr="*u8",
                bias_ptr="*bf16", out_ptr="*fp32" if const["PARTIAL"] else "*bf16")
    sig, attrs = {}, {}
    for i, a in enumerate(kernel.arg_names):
        if a in const:
            sig[a] = "constexpr"
        elif a in ptrs:
            sig[a], attrs[(i,)] = ptrs[a], [["tt.divisibility", 16]]
        elif a in ints and a != "NESCW":
            ty, key = native_specialize_impl(BaseBackend, ints[a], False, True, True)
            sig[a] = ty
            if ty == "constexpr":
                const[a] = key
            elif key == "D":
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:  # do_not_specialize: the tables and the stream's length
            sig[a] = "i32"
    return {"sig": sig, "attrs": attrs}, const


def _sass(kernel, m: int, n: int, k: int, cfg: Dense11V2GemvConfig, win1d: bool | None) -> tuple[str, str, str]:
    # (nvdisasm -g: SASS with each instruction's source line, cuobjdump -res-usage, TTGIR) of one launch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec, const = launch_args(kernel, m, n, k, cfg, win1d=win1d)
    compiled = triton.compile(ASTSource(kernel, spec["sig"], const, spec["attrs"]), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=cfg.warps))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(tool, "nvdisasm"), "-g", "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([os.path.join(tool, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    return sass, res, compiled.asm["ttgir"]


_FUNCS: dict = {}


def function_at(path: str, line: int) -> str:
    """The innermost Python function of ``path`` holding ``line`` ("?" when none)."""
    if path not in _FUNCS:
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"))
            _FUNCS[path] = [(f.lineno, f.end_lineno, f.name) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        except (OSError, SyntaxError):
            _FUNCS[path] = []
    spans = [s for s in _FUNCS[path] if s[0] <= line <= s[1]]
    return min(spans, key=lambda s: s[1] - s[0])[2] if spans else "?"


def parse(sass: str) -> list[tuple[int, str, str, str]]:
    """[(address, opcode, source function, line)] of the SASS listing; labels as (-address, label, ...)."""
    rows, where, labels = [], "?", []
    for ln in sass.splitlines():
        loc = LOC.search(ln)
        if loc:
            where = function_at(loc.group(1), int(loc.group(2)))
            continue
        lab = LABEL.match(ln)
        if lab:
            labels.append(lab.group(1))
            continue
        ins = INSN.search(ln)
        if ins:
            a = int(ins.group(1), 16)
            rows += [(a, "LABEL", lb, "") for lb in labels]
            labels = []
            rows.append((a, ins.group(3), where, ln))
    return rows


def width(op: str) -> int:
    """A load's width in bits from its SASS opcode (LDG.E.128, LDGSTS.E.BYPASS.LTC128B.128, LDG.E.U16 ...)."""
    parts = op.split(".")
    for tok, bits in (("128", 128), ("64", 64), ("U16", 16), ("S16", 16), ("U8", 8), ("S8", 8)):
        if tok in parts:
            return bits
    return 32


def step_counts(sass: str, res: str, weights_per_thread: float) -> dict:
    """A K step's counts: the smallest loop holding a weight load (its instructions, global loads by
    source and width, LDGSTS apart, shared-memory and barrier instructions), registers, stack, spills."""
    rows = parse(sass)
    at = {r[2]: r[0] for r in rows if r[1] == "LABEL"}
    insns = [r for r in rows if r[1] != "LABEL"]
    loops = []
    for a, op, _, ln in insns:
        m = BRA.search(ln) if op.startswith("BRA") else None
        if m and at.get(m.group(1), a + 1) <= a:  # a backward branch: a loop
            loops.append((at[m.group(1)], a))

    def inside(lp):
        return [r for r in insns if lp[0] <= r[0] <= lp[1]]
    holds = [lp for lp in loops
             if any(SOURCES.get(w) == "weights" and op.startswith("LDG") for _, op, w, _ in inside(lp))]
    step = min(holds, key=lambda lp: lp[1] - lp[0]) if holds else None
    body = inside(step) if step else []
    loads = collections.Counter()
    for _, op, w, _ in body:
        if op.startswith("LDG"):
            loads[(SOURCES.get(w, w), "LDGSTS" if op.startswith("LDGSTS") else "LDG", width(op))] += 1
    # the weight loads before the loop (prefetch's first step, a pipeliner's prologue)
    outside = sum(1 for a, op, w, _ in insns if op.startswith("LDG") and SOURCES.get(w) == "weights"
                  and not (step and step[0] <= a <= step[1]))

    def count(*pfx):
        return sum(1 for _, op, _, _ in body if op.startswith(pfx))
    return {"regs": int(re.search(r"REG:(\d+)", res).group(1)), "stack": int(re.search(r"STACK:(\d+)", res).group(1)),
            "spill": sum(1 for _, op, _, _ in insns if op.startswith(("STL", "LDL"))), "step": len(body),
            "per_weight": len(body) / weights_per_thread, "loads": dict(loads), "LDS": count("LDS", "LDSM"),
            "STS": count("STS"), "BAR": count("BAR"), "weights_outside": outside}


BLOCKED = re.compile(r"#(\w+) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\], "
                     r"warpsPerCTA = \[([\d, ]+)\], order = \[([\d, ]+)\]\}>")
WLOAD = re.compile(r"%(c0|c1|c2|s4a|s4b)_\d+ = (?:tt\.load|ttg\.async_copy_global_to_local) .*?"
                   r": tensor<([\dx]+)x!tt\.ptr<i32>, #(\w+)>")


def _ints(t: str) -> list[int]:
    return [int(v) for v in t.split(",")]


def lanes_of(layout: tuple, shape: list[int], warp: int) -> list[list[tuple]]:
    """Each lane of ``warp``: the coordinates it holds of a ``shape`` tensor in a blocked ``layout``."""
    spt, tpw, wpc, order = layout
    base, rem = [0] * len(shape), warp
    for d in order:
        base[d] = (rem % wpc[d]) * tpw[d] * spt[d]
        rem //= wpc[d]
    lanes = []
    for lane in range(32):
        at, rem = list(base), lane
        for d in order:
            at[d] += (rem % tpw[d]) * spt[d]
            rem //= tpw[d]
        pts = [()]
        for d in range(len(shape)):
            pts = [p + ((at[d] + i) % shape[d],) for p in pts for i in range(spt[d])]
        lanes.append(pts)
    return lanes


def address(kind: str, name: str, pt: tuple, kp: int) -> int:
    """Byte offset of element ``pt`` of load ``name`` (c0-c2: [BN, W]; s4a/b: [BN, W, 4], relaid [BN, 4 W])
    at a block's first step (row 0 first): version 2's order or the relaid one."""
    runs = kp // 32
    r, rest = pt[0], pt[1:]
    if name.startswith("c"):
        x, w = int(name[1]), rest[0]
        return 4 * (r * 3 * runs + (3 * w + x if kind == "v2" else x * 32 + w))
    h = name == "s4b"
    if kind == "v2":
        return 4 * (r * kp // 4 + 8 * rest[0] + rest[1] + 4 * h)
    return 4 * (r * kp // 4 + 128 * h + rest[0])


def sectors(ttgir: str, kind: str, kp: int) -> dict:
    """{load: (sectors a warp request, the ideal, lanes along rows x runs)} of the step's weight loads, from
    the layouts the compiler gave them (TTGIR) and the arrays' order: what Nsight Compute calls excessive."""
    lays = {m.group(1): tuple(_ints(m.group(i)) for i in range(2, 6)) for m in BLOCKED.finditer(ttgir)}
    out = {}
    for m in WLOAD.finditer(ttgir):
        name, shape, lay = m.group(1), _ints(m.group(2).replace("x", ",")), lays.get(m.group(3))
        if name in out or lay is None:
            continue
        warps = lay[2][0] * lay[2][1] * (lay[2][2] if len(lay[2]) > 2 else 1)
        per = [lanes_of(lay, shape, w) for w in range(warps)]
        vec = len(per[0][0])
        secs = sum(len({address(kind, name, p, kp) // 32 for pts in lanes for p in pts}) for lanes in per) / warps
        rows = len({p[0] for pts in per[0] for p in pts})
        out[name] = (secs, 32 * 4 * vec // 32, f"{rows}x{32 * vec // rows // (4 if len(shape) == 3 else 1)}")
    return out


def _loads(counts: dict, source: str) -> str:
    return " ".join(f"{kind}.{bits}x{n}" for (src, kind, bits), n in sorted(counts.items()) if src == source) or "-"


def sass_report(specs: list[str], ms: list[int], shapes: list) -> int:
    """Static sm_90 counts of both GEMVs, prefetch off and on, at each 7B shape and M (compiled on the CPU)."""
    import triton

    from glyd.kernels.dense11 import gemv_v2 as G

    logline(f"static sm_90 SASS (Triton {triton.__version__}, the launch's own specialization and default options): "
            "step = the K loop's instructions (the smallest loop holding a weight load), /w = a step's instructions "
            "a weight a thread; loads of a step by source as KIND.BITSxCOUNT; pre = weight loads before the loop")
    head = (f"{'shape':8s} {'M':>2s} {'kernel':22s} {'regs':>4s} {'stack':>5s} {'spill':>5s} {'step':>5s} {'/w':>5s} "
            f"{'LDS':>3s} {'STS':>3s} {'BAR':>3s} {'pre':>3s}  weights | esc digits | x | offsets")
    logline(head)
    fails = 0
    for spec in specs:
        base = gemv_spec(spec)
        for name, n, k in shapes:
            for m in ms:
                for label, kern, w1 in (("v2", G._gemv_v2_kernel, None), ("relaid", DC._gemv_c_kernel, False),
                                        ("relaid1d", DC._gemv_c_kernel, True)):
                    for pf in (False, True):
                        cfg = Dense11V2GemvConfig(**{**base.__dict__, "prefetch": pf})
                        tag = f"{label}{'+pf' if pf else ''}{' ' + spec if spec else ''}"
                        try:
                            sass, res, ttgir = _sass(kern, m, n, k, cfg, w1)
                            r = step_counts(sass, res, cfg.bn * cfg.bk / (32 * cfg.warps))
                            sec = sectors(ttgir, "v2" if label == "v2" else "relaid", -(-k // 64) * 64)
                        except Exception as exc:  # a variant that does not compile is a finding
                            fails += 1
                            logline(f"{name:8s} {m:2d} {tag:22s} failed: {type(exc).__name__}: {str(exc)[:300]}")
                            continue
                        ld = r["loads"]
                        logline(f"{name:8s} {m:2d} {tag:22s} {r['regs']:4d} {r['stack']:5d} {r['spill']:5d} "
                                f"{r['step']:5d} {r['per_weight']:5.2f} {r['LDS']:3d} {r['STS']:3d} {r['BAR']:3d} "
                                f"{r['weights_outside']:3d}  {_loads(ld, 'weights')} | {_loads(ld, 'esc digits')} | "
                                f"{_loads(ld, 'x')} | {_loads(ld, 'offsets')} || sectors/request "
                                + " ".join(f"{a} {v[0]:g}/{v[1]}" for a, v in sec.items())
                                + f" (a warp: {next(iter(sec.values()))[2] if sec else '?'} rows x runs)")
    return 1 if fails else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--gemv", action="append", default=None, metavar="SPEC",
                    help="a GEMV config (bn=..,bk=..,warps=..,mb=..,dot=..) timed with prefetch off and on, "
                         "version 2 and relaid (repeatable; default: the default config)")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--tiny", action="store_true", help="CPU check under TRITON_INTERPRET=1 on tiny shapes (no timing)")
    ap.add_argument("--sass", action="store_true", help="static sm_90 SASS counts of the GEMVs (CPU)")
    ap.add_argument("--out", default=None, help="a folder for dense11_coalesce.json")
    args = ap.parse_args(argv)
    args.ms = [int(m) for m in args.ms.split(",")]
    specs = args.gemv or [""]
    if args.sass:
        return sass_report(specs, args.ms, [s for s in SHAPES if s[0] in args.shapes.split(",")])
    dev = "cpu" if args.tiny else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run --tiny (CPU interpreter) or --sass (static counts)")
    vs = variants(specs)
    shapes = [(n_, n, k, "normal") for n_, n, k in SHAPES if n_ in args.shapes.split(",")]
    if args.tiny:
        shapes = [s for s in TINY if s[0] in args.shapes.split(",")]
    torch.manual_seed(0)
    logline(f"glyd {glyd.__version__}, torch {torch.__version__}, triton {__import__('triton').__version__}, device "
            f"{torch.cuda.get_device_name() if dev == 'cuda' else 'cpu (TRITON_INTERPRET=1)'}; "
            f"variants: {', '.join(vs)}")
    t0 = time.time()
    fails, res = [], {}
    for name, n, k, kind in shapes:
        f, r = run_shape(name, n, k, kind, args, vs, dev)
        fails += f
        res[name] = r
        if args.out:  # after each shape: a call cut short keeps what it measured
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "dense11_coalesce.json").write_text(json.dumps(
                {"shapes": shapes, "ms": args.ms, "variants": {v: str(c) for v, (_, c) in vs.items()},
                 "us": res, "failures": fails}, indent=1))
    logline(f"\nfailures: {len(fails)}" + "".join(f"\n  FAIL {f}" for f in fails))
    logline(f"total {time.time() - t0:.0f} s; us a matrix (median graph replay / copies), x bf16 F.linear in this run:")
    logline(table({k: v for k, v in res.items() if v}, list(vs)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
