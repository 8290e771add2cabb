"""Static sm_90 SASS of the dense-decode probe kernels (``dense_decode_kernels.py``) and of
dense11's own unpack and GEMV kernels (format version 1: ``dense11/...``; version 2:
``dense11v2/...``; version 3 as the H200 table runs it and ``dot="mma"``: ``dense11v3/...``), compiled on
any machine (``probe_dense_decode.py --sass``; ``DENSE_SASS_ONLY=dense11v2`` for version 2's alone).

For each kernel: registers, the instructions of a K step (the smallest loop holding the step's
16-byte ``sm`` loads, without the escape rounds nested in it) and of one escape round (the loop
nested in the step that loads a digit), their shared-memory traffic (LDS, STS, BAR: layout
conversions), and the step's instructions a weight a thread. A static count: the escape rounds
run as often as the tile's busiest run has escapes (3-5 times a step at 3-4% escapes).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import dense_decode_kernels as K
import dense_escape_kernels as EK
import dense_escapes as DE

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
BRA = re.compile(r"BRA\s+(?:`\()?(?:0x)?([0-9a-f]+)")

PTRS = dict(code_ptr="*i32", sm_ptr="*i32", sm8_ptr="*u8", esc_ptr="*i32", ebase_ptr="*i32", eoff_ptr="*u16",
            etab_ptr="*i32", x_ptr="*i32", xh_ptr="*bf16", rowptr_ptr="*i32", eidx_ptr="*i64", eexp_ptr="*u8")


def _sass(fn, sig: dict, const: dict, warps: int, divisible: tuple[str, ...]) -> tuple[list, str]:
    names = fn.arg_names
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible if n in names}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=1))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    rows = []
    for ln in sass.splitlines():
        m = INSN.search(ln)
        if m:
            rows.append((int(m.group(1), 16), m.group(3), ln))
    return rows, res


def _loops(rows: list) -> list[tuple[int, int]]:
    out = []
    for a, op, ln in rows:
        m = BRA.search(ln) if op.startswith("BRA") else None
        if m and int(m.group(1), 16) < a:
            out.append((int(m.group(1), 16), a))
    return out


def _within(rows, lo, hi):
    return [r for r in rows if lo <= r[0] <= hi]


def analyse(rows: list, res: str, weights_per_thread: float) -> dict:
    loops = _loops(rows)
    step = [lp for lp in loops if any(op.startswith("LDG.E.128") for _, op, _ in _within(rows, *lp))]
    step = min(step, key=lambda lp: lp[1] - lp[0]) if step else (max(loops, key=lambda lp: lp[1] - lp[0]) if loops
                                                                 else (rows[0][0], rows[-1][0]))
    inner = [lp for lp in loops if step[0] <= lp[0] and lp[1] <= step[1] and lp != step]
    # the escape rounds: ptxas unrolls them (4 a trip) with a remainder loop of one round, the smallest
    rounds = [lp for lp in inner if any(op.startswith("LDG") for _, op, _ in _within(rows, *lp))]
    rnd = min(rounds, key=lambda lp: lp[1] - lp[0]) if rounds else None
    body = _within(rows, *step)
    hot = [r for r in body if not any(lo <= r[0] <= hi for lo, hi in inner)]
    ops = collections.Counter(op.split(".")[0] for _, op, _ in hot)

    def count(rs, *pfx):
        return sum(1 for _, op, _ in rs if op.startswith(pfx))
    return {"regs": int(re.search(r"REG:(\d+)", res).group(1)), "stack": int(re.search(r"STACK:(\d+)", res).group(1)),
            "total": len(rows), "step": len(hot), "per_weight": len(hot) / weights_per_thread,
            "round": len(_within(rows, *rnd)) if rnd else 0, "LDS": count(hot, "LDS"), "STS": count(hot, "STS"),
            "BAR": count(hot, "BAR"), "LDG": count(hot, "LDG"), "top": ops.most_common(8)}


def candidate(layout: str, mode: int, cfg: K.Cfg | None = None) -> dict:
    cfg = cfg or K.DEFAULTS[mode]
    const = dict(BN=cfg.bn, BK=cfg.bk, LAYOUT=K.LAYOUT_IDS[layout], MODE=mode, HW=True)
    ptrs = dict(PTRS, out_ptr="*bf16" if mode >= K.GEMV else "*i32", out16_ptr="*i16" if mode == K.UNPACK else "*i32")
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in K._dense_kernel.arg_names}
    rows, res = _sass(K._dense_kernel, sig, const, cfg.warps, (*ptrs, "KP"))
    return analyse(rows, res, cfg.bn * cfg.bk / (32 * cfg.warps))


def win_candidate(name: str, mode: int, cfg: K.Cfg | None = None, rare: bool = True) -> dict:
    """An escape-scheme kernel (``dense_escape_kernels``); ``rare=False``: without the flagged blocks'
    rounds (straight-line code inside the step that unflagged blocks branch over)."""
    lay, scheme = DE.split(name)
    cfg = cfg or EK.DEFAULTS[mode]
    const = dict(BN=cfg.bn, BK=cfg.bk, LAYOUT=K.LAYOUT_IDS[lay], SCHEME=EK.SCHEME_IDS[scheme], MODE=mode, HW=True,
                 RARE=rare)
    ptrs = dict(PTRS, esub_ptr="*i32", out_ptr="*bf16" if mode >= K.GEMV else "*i32",
                out16_ptr="*i16" if mode == K.UNPACK else "*i32")
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in EK._win_kernel.arg_names}
    rows, res = _sass(EK._win_kernel, sig, const, cfg.warps, (*ptrs, "KP"))
    return analyse(rows, res, cfg.bn * cfg.bk / (32 * cfg.warps))


def _largest_loop(rows: list, res: str, weights_per_thread: float) -> dict:
    # kernels without the candidates' structure: the step is their largest loop (the whole kernel
    # when it has none, as the flat fold kernels)
    loops = _loops(rows)
    step = max(loops, key=lambda lp: lp[1] - lp[0]) if loops else (rows[0][0], rows[-1][0])
    body = _within(rows, *step)
    ops = collections.Counter(op.split(".")[0] for _, op, _ in body)

    def count(*pfx):
        return sum(1 for _, op, _ in body if op.startswith(pfx))
    return {"regs": int(re.search(r"REG:(\d+)", res).group(1)), "stack": int(re.search(r"STACK:(\d+)", res).group(1)),
            "total": len(rows), "step": len(body), "per_weight": len(body) / weights_per_thread, "round": 0,
            "LDS": count("LDS"), "STS": count("STS"), "BAR": count("BAR"), "LDG": count("LDG"), "top": ops.most_common(8)}


def dense11(kind: str) -> dict:
    """dense11's kernels on main with their default configs (unpack: 8 rows, bk 256, 4 warps;
    GEMV: bn 16, bk 256, 1 or 16 x rows, 4 warps). Their escape work is per weight, inside the step."""
    from glyd.kernels.dense11 import gemv as G
    from glyd.kernels.dense11 import unpack as U

    ptrs = dict(x_ptr="*bf16", sm_ptr="*u8", code_ptr="*i32", base_ptr="*u8", etab_ptr="*u8", esc_ptr="*i32",
                ebase_ptr="*i32", eoff_ptr="*u16", rowptr_ptr="*i32", eidx_ptr="*i32", eexp_ptr="*u8",
                bias_ptr="*bf16", out_ptr="*i16" if kind == "unpack" else "*bf16", tile_ptr="*i32", epos_ptr="*i32",
                eval_ptr="*i16")
    if kind == "unpack":
        fn, const, bn, bk, warps = U._unpack_kernel, dict(BN=8, BK=256, HW_POPC=True, HAS_EXC=False, E=16), 8, 256, 4
    else:
        fn, bn, bk, warps = G._gemv_kernel, 16, 256, 4
        const = dict(BN=bn, BK=bk, MB=1 if kind == "gemv1" else 16, HW_POPC=True, HAS_BIAS=False, HAS_EXC=True,
                     PARTIAL=False)
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in fn.arg_names}
    rows, res = _sass(fn, sig, const, warps, (*ptrs, "KP"))
    return _largest_loop(rows, res, bn * bk / (32 * warps))  # unpack: its block loop, gemv: its K loop


def dense11_v2(kind: str, tile: tuple[int, int, int] = (16, 256, 4), v3: bool = False, prefetch: bool = False,
               **extra) -> dict:
    """dense11 format version 2's production kernels (``glyd.kernels.dense11.unpack_v2`` / ``gemv_v2``)
    with their default configs: unpack 8 rows x bk 256 on 2 warps, GEMV bn 16 x bk 256 on 4 warps
    (``tile``: bn, bk, warps) at MB 1 (FMAs) or 16, 32, 64 (``tl.dot``; ``gemv<MB>``, ``-wx``: the
    weights as the dot's first operand); one run of 32 a thread, exceptions compiled in. The step is the
    K loop holding the 16-byte ``sm`` loads, as the candidates'. ``v3``: format version 3's kernel
    (``dense11_v3_gemv``), ``prefetch``: its table's setting; ``extra``: more constexprs of the kernel."""
    from glyd.kernels.dense11 import gemv_v2 as G
    from glyd.kernels.dense11 import unpack_v2 as U

    wfirst = kind.endswith("-wx")  # the tile dot as tile @ x^T (order="wx"), else x @ tile^T
    kind = kind.removesuffix("-wx")
    lanes = kind.endswith("-lanes")  # the M = 2-16 dots a byte lane (dot="lanes"), else one dot a step
    kind = kind.removesuffix("-lanes")
    kind, full = kind.removesuffix("-full"), kind.endswith("-full")  # -full: whole tiles (no masks), x as pairs
    ptrs = dict(x_ptr="*bf16", x32_ptr="*i32", sm_ptr="*i32", sm8_ptr="*u8", code_ptr="*i32", esc_ptr="*i32",
                ebase_ptr="*i32",
                eoff_ptr="*u16", rowptr_ptr="*i32", eidx_ptr="*i32", eexp_ptr="*u8", bias_ptr="*bf16",
                out_ptr="*i32" if kind == "unpack" else "*bf16", out16_ptr="*i16", tile_ptr="*i32", epos_ptr="*i32",
                eval_ptr="*i16")
    if kind == "unpack":
        fn, bn, bk, warps = U._unpack_v2_kernel, 8, 256, 2
        const = dict(BN=bn, BK=bk, EVEN=True, HW=True, HAS_EXC=True, E=16, FULL=full)
    else:
        fn, (bn, bk, warps) = G._gemv_v2_kernel, tile
        const = dict(BN=bn, BK=bk, MB=int(kind.removeprefix("gemv")), HW=True, HAS_BIAS=False, HAS_EXC=True,
                     PARTIAL=False, X32=full, FULL=full, TILE_DOT=not lanes, W_FIRST=wfirst,
                     PREFETCH=prefetch, V3=v3, **extra)  # every constexpr given: one left out compiles as an i32
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in fn.arg_names}
    rows, res = _sass(fn, sig, const, warps, (*ptrs, "KP", "K", "stride_xm"))
    return analyse(rows, res, bn * bk / (32 * warps))


def dense11_mma(mb: int, tile: tuple[int, int] = (64, 4), prefetch: int = 1, full: bool = True,
                v3: bool = True, xpf: int = 0) -> dict:
    """``dot="mma"`` (``glyd.kernels.dense11.gemv_mma``): the decoded lane words as the A operand of
    ``mma.sync.m16n8k16`` in registers, ``mb`` x rows (8-64) a program, ``tile`` = (bn, warps) at bk 128 (two
    runs of 32 a thread); exceptions compiled in. The step is the K loop, as ``dense11_v2``'s; ``prefetch`` 2
    (``prefetch_depth=2``): the loop is a trip of two steps, counted as two; ``xpf`` 2: ``x_prefetch``."""
    from glyd.kernels.dense11 import gemv_mma as G

    bn, warps = tile
    ptrs = dict(x_ptr="*bf16", x32_ptr="*i32", sm_ptr="*i32", sm8_ptr="*u8", code_ptr="*i32", esc_ptr="*i32",
                ebase_ptr="*i32", eoff_ptr="*u16", rowptr_ptr="*i32", eidx_ptr="*i32", eexp_ptr="*u8",
                bias_ptr="*bf16", out_ptr="*bf16")
    const = dict(BN=bn, MB=mb, HW=True, HAS_BIAS=False, HAS_EXC=True, PARTIAL=False, FULL=full, PREFETCH=prefetch,
                 V3=v3, XPF=xpf)
    fn = G._gemv_mma_kernel
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in fn.arg_names}
    rows, res = _sass(fn, sig, const, warps, (*ptrs, "KP", "K", "stride_xm"))
    return analyse(rows, res, bn * 128 / (32 * warps) * (2 if prefetch == 2 else 1))


#: GEMV tiles (bn, bk, warps: a run of 32 a thread) counted at 32 and 64 x rows (``@`` in the report)
TILES = {f"{bn}x{bk}x{w}": (bn, bk, w) for bn, bk, w in ((16, 256, 4), (32, 128, 4), (64, 64, 4), (16, 128, 2),
                                                        (32, 64, 2), (32, 256, 8), (64, 128, 8), (128, 64, 8))}


def fixed12(kind: str) -> dict:
    """fixed12's GEMV as the H200 table runs it at M = 1 on gate/up (bm 1, bn 16, bk 256, 4 warps,
    whole K steps, prmt), and the fold kernel of this probe (16 groups of 64 weights, 2 warps)."""
    if kind == "fold":
        const = dict(BG=K.FIXED12_BG)
        fn = K._fixed12_fold_kernel
        ptrs = dict(code_ptr="*u8", lo_ptr="*u8", base_ptr="*u8", out_ptr="*i32")
        sig = {n: "constexpr" if n in const else ptrs[n] for n in fn.arg_names}
        rows, res = _sass(fn, sig, const, 2, tuple(ptrs))
        return _largest_loop(rows, res, K.FIXED12_BG * 64 / 64)
    from glyd.kernels.fixed12 import gemv as G

    fn = G._gemv_gm_kernel
    const = dict(BM=1, BN=16, BK=256, EVEN=True, PREFETCH=False, PRMT=True, HAS_BIAS=False, HAS_EXC=False,
                 PARTIAL=False, FIXUP=False, PDL=0)
    ptrs = dict(x_ptr="*bf16", x32_ptr="*i32", code_ptr="*i32", lo_ptr="*i32", lo8_ptr="*u8", base_ptr="*u8",
                rowptr_ptr="*i32", eidx_ptr="*i64", ehi_ptr="*u8", bias_ptr="*bf16", out_ptr="*bf16",
                fin_ptr="*bf16", cnt_ptr="*i32")
    sig = {n: "constexpr" if n in const else ptrs.get(n, "i32") for n in fn.arg_names}
    div = (*ptrs, "KP", "K", "K_SPLIT", "stride_xm", "stride_code", "stride_lo")
    rows, res = _sass(fn, sig, const, 4, div)
    return _largest_loop(rows, res, 16 * 256 / 128)


def report() -> int:
    print("static sm_90 SASS (Triton " + triton.__version__ + "): step = a K step's instructions without the escape "
          "rounds; /w = step instructions a weight a thread; round = one escape round of a thread (its runs of the "
          "tile: 1 or 2)")
    print(f"{'kernel':18s} {'regs':>4s} {'stack':>5s} {'total':>6s} {'step':>5s} {'/w':>6s} {'round':>5s} "
          f"{'LDG':>4s} {'LDS':>4s} {'STS':>4s} {'BAR':>4s}  top opcodes of the step")
    items = [(f"fixed12/{k}", lambda k=k: fixed12(k)) for k in ("fold", "gemv1")]
    items += [(f"dense11/{k}", lambda k=k: dense11(k)) for k in ("unpack", "gemv1", "gemv16")]
    items += [(f"dense11v2/{k}{f}", lambda k=k + f: dense11_v2(k)) for k in ("unpack", "gemv1", "gemv16")
              for f in ("", "-full")] + [("dense11v2/gemv16-full-lanes", lambda: dense11_v2("gemv16-full-lanes"))]
    # M = 17-64: 32 and 64 x rows a decode, the weights as the dot's first operand (-wx), the H200 table's tile
    items += [(f"dense11v2/{k}", lambda k=k: dense11_v2(k)) for k in ("gemv32", "gemv32-full", "gemv64", "gemv64-full",
                                                                    "gemv16-full-wx", "gemv32-full-wx", "gemv64-full-wx")]
    items += [(f"dense11v2/gemv{mb}-full@{t}", lambda mb=mb, t=t: dense11_v2(f"gemv{mb}-full", TILES[t]))
              for mb in (32, 64) for t in TILES]
    # version 3 as the H200 table runs it (prefetch; M = 1 at 16x256x4, M = 2-64 at 32x128x4) and dot="mma"
    items += [(f"dense11v3/gemv{mb}-full@{t}", lambda mb=mb, t=t: dense11_v2(f"gemv{mb}-full",
                                                                           tuple(map(int, t.split("x"))), True, True))
              for mb, t in ((1, "16x256x4"), (1, "32x256x4"), (16, "16x256x4"), (16, "32x128x4"), (32, "32x128x4"),
                            (64, "32x128x4"))]
    items += [(f"dense11v3/mma{mb}{'' if full else '-masked'}@64x128x4",
               lambda mb=mb, full=full: dense11_mma(mb, full=full)) for mb in (8, 16, 32, 64) for full in (True, False)]
    items += [("dense11v3/mma32-noprefetch@64x128x4", lambda: dense11_mma(32, prefetch=0))]
    items += [(f"dense11v3/mma{mb}{'' if full else '-masked'}-depth2@64x128x4",
               lambda mb=mb, full=full: dense11_mma(mb, prefetch=2, full=full)) for mb in (8, 16, 32, 64)
              for full in (True, False)]
    items += [(f"dense11v3/mma{mb}-depth{d}-xpf@64x128x4", lambda mb=mb, d=d: dense11_mma(mb, prefetch=d, xpf=2))
              for mb in (8, 16) for d in (1, 2)]
    for lay in K.LAYOUT_IDS:
        for mode, m in K.MODES.items():
            for cfg in (K.DEFAULTS[m], K.LARGE[m]):
                items.append((f"{lay}/{mode}@{cfg.bn}x{cfg.bk}", lambda lay=lay, m=m, cfg=cfg: candidate(lay, m, cfg)))
    for lay in DE.LAYOUTS:  # the escape schemes; "-rare": without the flagged blocks' rounds
        for mode, m in K.MODES.items():
            for cfg in (EK.DEFAULTS[m], EK.LARGE[m]):
                for rare in (True, False) if m in (K.FOLD, K.GEMV, K.UNPACK) else (True,):
                    items.append((f"{lay}/{mode}@{cfg.bn}x{cfg.bk}" + ("" if rare else "-rare"),
                                  lambda lay=lay, m=m, cfg=cfg, rare=rare: win_candidate(lay, m, cfg, rare)))
    only = os.environ.get("DENSE_SASS_ONLY")  # a substring: report only the kernels whose name has it
    items = [it for it in items if not only or only in it[0]]
    for name, fn in items:
        try:
            r = fn()
        except Exception as exc:  # a kernel that does not compile is a finding
            print(f"{name:18s} failed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        top = ", ".join(f"{op} {c}" for op, c in r["top"])
        print(f"{name:18s} {r['regs']:4d} {r['stack']:5d} {r['total']:6d} {r['step']:5d} {r['per_weight']:6.2f} "
              f"{r['round']:5d} {r['LDG']:4d} {r['LDS']:4d} {r['STS']:4d} {r['BAR']:4d}  {top}", flush=True)
    return 0
