#!/usr/bin/env python3
"""Issue 38 probe: unpack + cuBLAS at long M with the bf16 weight kept in L2 (H200).

Today's long-M path (``fixed12_unpack_cublas``) unpacks the whole matrix into a bf16 scratch (reads
12 bits a weight, writes 16 to HBM) and cuBLAS reads the 16 bits back. Here the matrix is unpacked a
chunk at a time into a small reused buffer meant to stay in L2, and cuBLAS multiplies each chunk
(``long_m_chunks.py``: N-chunks in modes s1 / p2 / l2 / l4, K-chunks with fp32 accumulation).

Variants, each (shape, M): ``bf16`` (``F.linear``, the reference), ``table`` (``glyd.kernels.linear``),
``whole`` (today's unpack + cuBLAS, ``LongConfig()``), ``src8`` (src's ``LongConfig(chunk=~8 MB)``:
byte tiles, host-indexed exceptions; runs 25 and 43 timed it), ``c<MB>.<mode>`` (N-chunks of about
that many MB of bf16), ``kc<MB>.s1`` (K-chunks, M <= ``--kchunk-max-m``), and to take the time apart:
``c<MB>.slices`` (bf16 cuBLAS on W's row slices in HBM: what narrowing the GEMM alone costs) and
``c<MB>.l2gemm`` (the chunk GEMMs all reading one resident buffer, no unpack: timing only, its values
are wrong by design). Per matrix: the unpack alone, whole (into HBM) and in ~8 MB chunks (into L2);
once: L2 and HBM copy bandwidth.

Checks: every chunk of every plan unpacks bit for bit against W (copy 0, exceptions on chunk
edges in --tiny); every variant's output (its buffer filled with NaN first) within
tests/kernels/test_linear.py's float64 bound, and against ``whole``'s bits (cuBLAS on a narrower N
may pick another kernel: the max difference is reported then). Timing: one CUDA graph over distinct
copies of the matrix and x whose packed bytes exceed 3x L2, median of ``--replays`` replays, ratio to
bf16 in the same run; host microseconds of one eager call; a torch.profiler kernel breakdown at
``--kernels-at``. ``--budget-s`` stops timing in time to print the table (7B shapes come first).

    PYTHONPATH=src python3 benchmarks/probes/probe_long_m.py --out $OUT                  # H200
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/probes/probe_long_m.py --tiny    # CPU check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import glyd  # noqa: E402
from glyd import kernels  # noqa: E402
from glyd.kernels.fixed12.exceptions import prepare  # noqa: E402
from glyd.kernels.fixed12.unpack_cublas import LongConfig  # noqa: E402
from long_m_chunks import (MODES, Sched, chunk_len, col_plan, gemm_resident, gemm_slices,  # noqa: E402
                           linear_cols, linear_rows, row_plan, unpack_chunk)

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944),  # 7B, merged
          "qkv.5": (1152, 896), "o.5": (896, 896), "gate_up.5": (9728, 896), "down.5": (896, 4864)}  # 0.5B
TINY_SHAPES = {"tiny_a": (320, 192), "tiny_b": (96, 448)}
RTOL, ATOL_FRAC = 2.0**-7, 1e-3  # tests/kernels/test_linear.py's bound (plus bf16 F.linear's own error)
MB = 1 << 20


# ---------------------------------------------------------------- checks and timing

def check(y, ref, twin, whole) -> dict:
    """float64 bound of tests/kernels/test_linear.py (row blocks: M x N doubles can be GBs), and
    the bits against ``whole`` (today's unpack + cuBLAS)."""
    excess, num, den, finite = -math.inf, 0.0, 0.0, bool(torch.isfinite(y).all())
    amax = float(ref.abs().max())
    for r0 in range(0, y.shape[0], 512):
        yd, rd, td = y[r0:r0 + 512].double(), ref[r0:r0 + 512], twin[r0:r0 + 512].double()
        err = (yd - rd).abs()
        bound = RTOL * rd.abs() + ATOL_FRAC * amax + (td - rd).abs()
        excess = max(excess, float((err - bound).max()))
        num += float((err * err).sum())
        den += float((rd * rd).sum())
    res = dict(ok=finite and excess <= 0, excess=excess, rel_err=math.sqrt(num / max(den, 1e-300)))
    if whole is not None:
        same = torch.equal(y.view(torch.int16), whole.view(torch.int16))
        res["bits_eq_whole"] = same
        res["max_diff_whole"] = 0.0 if same else float((y.float() - whole.float()).abs().max())
        res["n_diff_whole"] = 0 if same else int((y.view(torch.int16) != whole.view(torch.int16)).sum())
    return res


def graph_us(fn, copies: int, replays: int) -> float:
    from glyd.timing import cuda_graph_ms

    return cuda_graph_ms(fn, replays) / copies * 1e3


def host_us(fn, cuda: bool) -> float:
    """Host microseconds of one eager call (the GPU idle before it; min of 3)."""
    best = math.inf
    for _ in range(3):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t) * 1e6)
    if cuda:
        torch.cuda.synchronize()
    return best


def breakdown(fn) -> dict:
    """GPU kernel time of one call by kind (torch.profiler): unpack, exceptions, gemm, other."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kinds: dict = {}
    for e in prof.key_averages():  # kernels only (a CPU op's device time is its kernels' again)
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if not us:
            continue
        nm = e.key
        kind = ("unpack" if "unpack" in nm else "exceptions" if ("index" in nm or "scatter" in nm)
                else "gemm" if any(s in nm for s in ("gemm", "nvjet", "xmma", "cutlass", "sm90", "splitK"))
                else "other")
        d = kinds.setdefault(kind, dict(us=0.0, calls=0, names=[]))
        d["us"] += us
        d["calls"] += e.count
        if len(d["names"]) < 3:
            d["names"].append(nm[:70])
    return kinds


# ---------------------------------------------------------------- one shape

@dataclasses.dataclass
class Mat:
    name: str
    n: int
    k: int
    ws: list
    ps: list
    row_plans: dict  # label -> [Plan a copy]
    col_plans: dict
    bufs: list
    src_rows: int


def make_weights(n, k, dev, gen, tiny):
    w = torch.randn(n, k, device=dev, generator=gen) * 0.02
    flat = w.view(-1)
    pick = torch.randint(0, n * k, (max(8, n * k // 10000),), device=dev, generator=gen)
    flat[pick] = 1e-30  # far below the 16-exponent window: an exception
    if tiny:  # exceptions on every 32-row and 64-column boundary (the chunk edges)
        w[::32, 0] = 1e-30
        w[31::32, -1] = 1e-30
        w[1, 64::64] = 1e-30
        w[2, 63::64] = 1e-30
    return w.to(torch.bfloat16)


def build_plans(p0s, n, k, chunks_b, align, kchunks):
    rows_seen, cols_seen = {n}, {k}
    row_plans, col_plans = {}, {}
    for label, nb in chunks_b:
        rows = chunk_len(nb, n, k, align)
        if rows not in rows_seen:
            rows_seen.add(rows)
            row_plans[label] = [row_plan(p, rows) for p in p0s]
        cols = chunk_len(nb, k, n, 64)
        if kchunks and k % 64 == 0 and cols not in cols_seen:
            cols_seen.add(cols)
            col_plans[label] = [col_plan(p, cols) for p in p0s]
    return row_plans, col_plans


def setup_shape(name, n, k, dev, args, l2, chunks_b, align) -> Mat:
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(name.encode()))
    copies = 1 if args.tiny else max(1, math.ceil(3 * l2 / (n * k * 1.5)))
    ws = [make_weights(n, k, dev, gen, args.tiny) for _ in range(copies)]
    ps = [glyd.pack(w) for w in ws]
    for p in ps:
        kernels.prepare(p)
    row_plans, col_plans = build_plans(ps, n, k, chunks_b, align, args.kchunk_max_m > 0)
    elems = max([pl[0].elems for pl in [*row_plans.values(), *col_plans.values()]] or [64])
    bufs = [torch.empty(elems, dtype=torch.bfloat16, device=dev) for _ in range(4)]
    src_rows = chunk_len(8 * MB if not args.tiny else chunks_b[0][1], n, k, 64)
    mat = Mat(name, n, k, ws, ps, row_plans, col_plans, bufs, src_rows)
    verify_plans(mat)
    print(f"== {name} {n}x{k}: {copies} copies; N-chunks " +
          ", ".join(f"{lb}={pl[0].size} rows x {len(pl[0].chunks)} ({pl[0].elems * 2 / MB:.1f} MB)"
                    for lb, pl in row_plans.items()) + "; K-chunks " +
          ", ".join(f"{lb}={pl[0].size} cols x {len(pl[0].chunks)}" for lb, pl in col_plans.items()), flush=True)
    return mat


def verify_plans(mat: Mat) -> None:
    """Every chunk of every plan unpacks bit for bit (copy 0); exceptions must be in play."""
    w, p = mat.ws[0], mat.ps[0]
    if not prepare(p).nexc:
        raise AssertionError(f"{mat.name}: no exceptions in the checked copy: the check would prove nothing")
    for label, plans in [*mat.row_plans.items(), *mat.col_plans.items()]:
        plan = plans[0]
        for c in plan.chunks:
            got = unpack_chunk(p, plan, c, mat.bufs[0].fill_(7.0))
            want = w[c.a0:c.a1] if plan.axis == "n" else w[:, c.a0:c.a1]
            if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                raise AssertionError(f"{mat.name} {plan.axis}-plan {label}: chunk {c.a0}:{c.a1} is not bit-exact")


def variants(mat: Mat, m: int, xs, outs, accs, args, sched: Sched) -> dict:
    """name -> (fn(i) -> output of copy i, checked?)."""
    ws, ps, bufs = mat.ws, mat.ps, mat.bufs
    v = {"bf16": (lambda i: F.linear(xs[i], ws[i]), True),
         "table": (lambda i: kernels.linear(xs[i], ps[i]), True),
         "whole": (lambda i: kernels.linear(xs[i], ps[i], config=LongConfig()), True)}
    if mat.src_rows < mat.n:
        v["src8"] = (lambda i: kernels.linear(xs[i], ps[i], config=LongConfig(chunk=mat.src_rows)), True)
    for lb, plans in mat.row_plans.items():
        for mode in args.modes:
            v[f"{lb}.{mode}"] = (lambda i, pl=plans, md=mode: linear_rows(xs[i], ps[i], pl[i], md, outs[i], bufs,
                                                                          sched), True)
        v[f"{lb}.slices"] = (lambda i, pl=plans: gemm_slices(xs[i], ws[i], pl[i], outs[i]), True)
        v[f"{lb}.l2gemm"] = (lambda i, pl=plans: gemm_resident(xs[i], pl[i], outs[i], bufs[0]), False)
    if m <= args.kchunk_max_m:
        for lb, plans in mat.col_plans.items():
            v[f"k{lb}.s1"] = (lambda i, pl=plans: linear_cols(xs[i], ps[i], pl[i], outs[i], bufs, accs,
                                                              sched.cuda), True)
    return v


def sweep_m(mat: Mat, m: int, args, sched: Sched, t_end: float) -> list:
    if time.time() > t_end:
        print(f"budget spent: {mat.name} M={m} skipped", flush=True)
        return [dict(shape=mat.name, n=mat.n, k=mat.k, m=m, variant="*", ok=False, skipped="budget")]
    dev = mat.ws[0].device
    cuda = dev.type == "cuda"
    copies = len(mat.ws)
    gen = torch.Generator(device=dev).manual_seed(m)
    xs = [torch.randn(m, mat.k, device=dev, generator=gen).to(torch.bfloat16) for _ in range(copies)]
    outs = [torch.empty(m, mat.n, dtype=torch.bfloat16, device=dev) for _ in range(copies)]
    accs = [torch.empty(m, mat.n, dtype=torch.float32, device=dev) for _ in range(2)] if (
        m <= args.kchunk_max_m and mat.col_plans) else None
    ref = xs[0].double() @ mat.ws[0].double().T
    twin = F.linear(xs[0], mat.ws[0])
    whole = kernels.linear(xs[0], mat.ps[0], config=LongConfig())
    rows, base = [], math.nan
    for name, (fn, checked) in variants(mat, m, xs, outs, accs, args, sched).items():
        row = dict(shape=mat.name, n=mat.n, k=mat.k, m=m, variant=name, copies=copies)
        if time.time() > t_end:
            rows.append(dict(row, ok=False, skipped="budget"))
            continue
        try:
            outs[0].fill_(math.nan)  # a chunk left unwritten must not pass on the last variant's values
            y = fn(0)
            row.update(check(y, ref, twin, whole) if checked else dict(ok=True, unchecked=True))
            if cuda and row["ok"]:
                row["us"] = graph_us(lambda: [fn(i) for i in range(copies)], copies, args.replays)
                row["host_us"] = host_us(lambda: fn(0), cuda)
                if m in args.kernels_at and (name in ("bf16", "whole") or name.endswith(".s1")):
                    row["kernels"] = breakdown(lambda: fn(0))
        except Exception as exc:  # a variant that cannot run here is a finding, not the end of the sweep
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        if name == "bf16":
            base = row.get("us", math.nan)
        row["ratio"] = row.get("us", math.nan) / base
        rows.append(row)
        print(f"{mat.name:9s} M={m:5d} {name:13s} ok={row['ok']!s:5s} "
              f"exc={row.get('excess', math.nan):9.2e} rel={row.get('rel_err', math.nan):.2e} "
              f"bits={'=' if row.get('bits_eq_whole') else row.get('max_diff_whole', '-')} "
              f"{row.get('us', math.nan):9.1f} us {row['ratio']:.3f}x host {row.get('host_us', math.nan):7.0f} us"
              + (f"  {row['error']}" if "error" in row else ""), flush=True)
        if "kernels" in row:
            print("    kernels: " + "; ".join(f"{kd} {d['us']:.1f} us / {d['calls']} ({', '.join(d['names'][:2])})"
                                           for kd, d in row["kernels"].items()), flush=True)
    return rows


# ---------------------------------------------------------------- the unpack alone, copy bandwidth

def copy_bandwidth(replays: int) -> dict:
    """GB/s of a bf16 ``copy_`` (read + write counted) within L2 (2 x 8 MB, 50 copies a replay) and
    through HBM (2 x 1 GiB)."""
    res = {}
    for what, nbytes, reps in (("l2_copy_GBs", 8 * MB, 50), ("hbm_copy_GBs", 1 << 30, 1)):
        a = torch.randn(nbytes // 2, device="cuda").to(torch.bfloat16)
        b = torch.empty_like(a)
        us = graph_us(lambda: [b.copy_(a) for _ in range(reps)], reps, replays)
        res[what] = 2 * nbytes / (us * 1e-6) / 1e9
        del a, b
    print("copy bandwidth:", {k: round(v) for k, v in res.items()}, flush=True)
    return res


def unpack_alone(mat: Mat, replays: int) -> dict:
    """us a matrix: the whole unpack into one [N, K] scratch (HBM) and the same in chunks of the
    plan closest to 8 MB into one buffer (the writes stay in L2), over all copies."""
    copies = len(mat.ps)
    scratch = torch.empty(mat.n, mat.k, dtype=torch.bfloat16, device="cuda")
    res = dict(shape=mat.name, packed_MB=mat.n * mat.k * 1.5 / MB)
    res["whole_us"] = graph_us(lambda: [kernels.unpack(p, out=scratch) for p in mat.ps], copies, replays)
    if mat.row_plans:
        lb = min(mat.row_plans, key=lambda s: abs(mat.row_plans[s][0].elems * 2 - 8 * MB))
        plans = mat.row_plans[lb]
        res["chunks"] = lb
        res["chunks_us"] = graph_us(lambda: [unpack_chunk(p, pl, c, mat.bufs[0]) for p, pl in zip(mat.ps, plans)
                                             for c in pl.chunks], copies, replays)
    for key in ("whole_us", "chunks_us"):
        if key in res:
            res[key.replace("_us", "_packed_GBs")] = mat.n * mat.k * 1.5 / (res[key] * 1e-6) / 1e9
    print("unpack alone:", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items()}, flush=True)
    del scratch
    return res


# ---------------------------------------------------------------- the short table

def _ratio(r) -> float:
    x = r.get("ratio", math.nan)
    return x if math.isfinite(x) else math.inf


def _best(rs: list, suffix: str):
    ok = [r for r in rs if r["variant"].endswith(suffix) and r.get("ok")]
    return min(ok, key=_ratio) if ok else None


def _cell(r) -> str:
    if r is None:
        return "-"
    if not r.get("ok"):
        return "FAIL"
    label = r["variant"].split(".")[0]
    at = f"@{label}" if label.lstrip("k").startswith("c") else ""
    return (f"{r['ratio']:.2f}" if math.isfinite(_ratio(r)) else "ok") + at


def _product(r) -> bool:
    """A checked fixed12 product: today's whole unpack or a chunked variant (not slices, not l2gemm)."""
    v = r["variant"]
    return v == "whole" or (v.startswith(("c", "kc")) and v.split(".")[-1] in MODES)


def summary(rows: list, shapes, ms) -> str:
    cols = ["table", "whole", "src8", ".s1", ".p2", ".l2", ".l4", "k", ".slices", ".l2gemm"]
    lines = ["ratio to bf16 (median of graph replays); chunk variants: best over chunk sizes, @c<MB>",
             f"{'shape':9s} {'M':>5s} {'bf16 us':>9s} " + " ".join(f"{c.strip('.'):>10s}" for c in cols)]
    for s in shapes:
        for m in ms:
            rs = [r for r in rows if r["shape"] == s and r["m"] == m]
            if not rs:
                continue
            bf = next((r.get("us", math.nan) for r in rs if r["variant"] == "bf16"), math.nan)
            cells = []
            for c in cols:
                if c == "k":
                    cells.append(_cell(_best([r for r in rs if r["variant"].startswith("k")], ".s1")))
                elif c.startswith("."):
                    cells.append(_cell(_best([r for r in rs if not r["variant"].startswith("k")], c)))
                else:
                    cells.append(_cell(next((r for r in rs if r["variant"] == c), None)))
            lines.append(f"{s:9s} {m:5d} {bf:9.1f} " + " ".join(f"{c:>10s}" for c in cells))
    lines.append("sums over a model's four matrices (a merged layer): bf16 us; table, whole and the best checked "
                 "chunk variant of each matrix (any mode, any size) against bf16")
    for group, names in (("7B", ("qkv", "o", "gate_up", "down")), ("0.5B", ("qkv.5", "o.5", "gate_up.5", "down.5"))):
        for m in ms:
            rs = [r for r in rows if r["shape"] in names and r["m"] == m and r.get("ok")
                  and math.isfinite(r.get("us", math.nan))]
            got = {r["shape"] for r in rs}
            if got != set(names):
                continue
            tot = {v: sum(r["us"] for r in rs if r["variant"] == v) for v in ("bf16", "table", "whole")}
            best = sum(min(r["us"] for r in rs if r["shape"] == s and _product(r)) for s in names)
            lines.append(f"{group:5s} M={m:5d} bf16 {tot['bf16']:9.1f} us  table {tot['table'] / tot['bf16']:.3f}x  "
                         f"whole {tot['whole'] / tot['bf16']:.3f}x  best chunked (or whole) {best / tot['bf16']:.3f}x")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="65,128,256,512,1024,2048,4608")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--chunks-mb", default="2,4,8,16", help="N-chunk (and K-chunk) sizes of bf16 in MB")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--kchunk-max-m", type=int, default=512, help="K-chunk variants up to this M (0: none)")
    ap.add_argument("--kernels-at", default="128,2048",
                    help="M values with a torch.profiler kernel breakdown of bf16, whole and the s1 variants")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop timing after this many seconds")
    ap.add_argument("--tiny", action="store_true", help="CPU check of the logic (TRITON_INTERPRET=1, tiny shapes)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t0 = time.time()
    args.modes = [s for s in args.modes.split(",") if s]
    bad = [s for s in args.modes if s not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; choose from {MODES}")
    args.kernels_at = {int(v) for v in args.kernels_at.split(",") if v}
    if args.tiny:
        if os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--tiny runs the Triton unpack on the CPU: set TRITON_INTERPRET=1")
        dev, shapes, ms, align = "cpu", dict(TINY_SHAPES), [65, 130], 32
        chunks_b = [("c24k", 24 << 10), ("c48k", 48 << 10)]  # 64 / 128 rows of tiny_a; 128 / 256 cols of tiny_b
        args.kernels_at = set()
    else:
        if not torch.cuda.is_available():
            ap.error("needs a CUDA GPU (or --tiny)")
        dev, align = "cuda", 64
        unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
        if unknown:
            ap.error(f"unknown shapes {unknown}; choose from {list(SHAPES)}")
        shapes = {s: SHAPES[s] for s in args.shapes.split(",")}
        ms = [int(v) for v in args.ms.split(",")]
        chunks_b = [(f"c{v}", int(float(v) * MB)) for v in args.chunks_mb.split(",")]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 * MB) if dev == "cuda" else 60 * MB
    env = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
               l2_MB=l2 / MB, argv=sys.argv[1:])
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    print("env:", env, flush=True)
    sched = Sched(dev == "cuda")
    extras = dict(copy=copy_bandwidth(args.replays) if dev == "cuda" else {}, unpack=[])
    rows = []
    t_end = t0 + args.budget_s
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for name, (n, k) in shapes.items():
        if time.time() > t_end:
            print(f"budget spent: {name} skipped", flush=True)
            continue
        mat = setup_shape(name, n, k, dev, args, l2, chunks_b, align)
        if dev == "cuda":
            extras["unpack"].append(unpack_alone(mat, args.replays))
        for m in ms:
            rows += sweep_m(mat, m, args, sched, t_end)
        del mat
        if dev == "cuda":
            torch.cuda.empty_cache()
        if out:  # after every shape: a run cut short still leaves its rows
            (out / "long_m.json").write_text(json.dumps(dict(env=env, extras=extras, rows=rows), indent=1))
    failed = [r for r in rows if not r.get("ok") and not r.get("skipped")]
    for r in failed:
        print("FAILED:", r["shape"], r["m"], r["variant"], r.get("error") or f"excess {r.get('excess')}")
    print(f"\n{len(rows)} variants, {len(failed)} failed, "
          f"{sum(1 for r in rows if r.get('skipped'))} skipped (budget); {time.time() - t0:.0f} s\n")
    table = summary(rows, shapes, ms)
    print(table)
    if out:
        (out / "table.txt").write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
