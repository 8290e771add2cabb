#!/usr/bin/env python3
"""Issue 36 probe: the experts product of a mixture-of-experts prompt at Qwen3-30B-A3B's shapes (128
experts, top-8, hidden 2048, moe_intermediate 768: gate_up [128, 1536, 2048], down [128, 2048, 768])
for 512 and 2048 tokens x 8 rows (and a decode step of 9 and 64 tokens, where the grouped GEMV runs
too): bf16 ``torch._grouped_mm`` on bf16 experts (transformers' grouped path), ``experts_loop`` (one
fused product a chosen expert), ``experts_unpack_grouped`` (one unpack of the experts with rows, one
grouped GEMM) and its two stages apart, ``fixed12_experts_gemv`` (up to 512 rows),
``fixed12_experts_mma`` (the grouped tensor-core product, up to its 4096 rows). The variants that
never sync with the host are also timed as one CUDA graph (``graph ms``: a captured step takes the
GEMV up to 16 rows, the MMA at 17-4096 and ``experts_unpack_grouped`` above; the defaults put the MMA
before ``experts_unpack_grouped`` above 64 rows, a guess that 72-4096 rows here decide).

Each variant is checked once against float64 on a sample of rows (the tolerance of
tests/kernels/test_experts_kernels.py) before it is timed: eager calls, host time included (the
loop's cost is host time), CUDA events around each call, median of the repeats. The table is last.

    PYTHONPATH=src python3 benchmarks/probes/probe_moe_prompt.py --out $OUT/moe_probe.json   # H200
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/probes/probe_moe_prompt.py --tiny  # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import glyd.ops  # noqa: E402,F401  (registers torch.ops.glyd)
from glyd.kernels import experts as EK  # noqa: E402
from glyd.kernels.fixed12.experts import ExpertsGemvConfig  # noqa: E402
from glyd.kernels.fixed12.experts_mma import MAX_ROWS as MMA_ROWS, ExpertsMmaConfig  # noqa: E402
from glyd.kernels.fixed12.experts_unpack import unpack_experts  # noqa: E402
from glyd.ops.experts import pack_experts  # noqa: E402

RTOL, ATOL_FRAC = 2.0**-7, 1e-3  # tests/kernels/test_experts_kernels.py
SYNC_FREE = ("bf16 grouped_mm", "experts_unpack_grouped", "fixed12_experts_gemv", "fixed12_experts_mma")
SHAPES = {"gate_up": (128, 1536, 2048), "down": (128, 2048, 768)}  # (E, N, K)
TINY = {"gate_up": (4, 64, 128), "down": (4, 128, 64)}


def bf16_grouped(x, ids, w):
    """transformers' grouped path on bf16 experts: sort, offsets, one grouped GEMM, rows put back."""
    sorted_ids, order = torch.sort(ids, stable=True)
    offs = torch.searchsorted(sorted_ids, torch.arange(w.shape[0], device=x.device), right=True, out_int32=True)
    y = torch._grouped_mm(x.index_select(0, order), w.transpose(-2, -1), offs=offs)
    return torch.empty_like(y).index_copy_(0, order, y)


def stages(p, x, ids):
    """The grouped family's two stages, each alone: its unpack, its grouped GEMM on the unpacked scratch."""
    e, n, k = p.shape
    sorted_ids, order = torch.sort(ids, stable=True)
    offs = torch.searchsorted(sorted_ids, torch.arange(e, device=x.device), right=True, out_int32=True)
    w = torch.empty(e, n, k, dtype=torch.bfloat16, device=x.device)
    unpack_experts(p, w, offs)
    xs = x.index_select(0, order)
    return (lambda: unpack_experts(p, w, offs)), (lambda: torch._grouped_mm(xs, w.transpose(-2, -1), offs=offs))


def check(y, x, ids, w, sample):
    """Worst excess over the tests' tolerance on ``sample`` rows (<= 0 passes), against float64."""
    ref = torch.stack([w[ids[r]].double() @ x[r].double() for r in sample.tolist()])
    got = y[sample].double()
    if not torch.isfinite(got).all():
        return float("inf")
    bound = RTOL * ref.abs() + ATOL_FRAC * ref.abs().max()
    return float(((got - ref).abs() - bound).max())


def time_ms(fn, dev, reps, warmup=2):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def graph_ms(fn, reps):
    """Median ms of a CUDA graph of ``fn`` (NaN, with the reason, where the capture fails)."""
    from glyd.timing import cuda_graph_ms

    try:
        return cuda_graph_ms(fn, reps)
    except Exception as exc:
        print(f"  graph: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return float("nan")


def run_shape(sname, e, n, k, tokens, topk, dev, reps, warmup, gemv_max):
    g = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(e, n, k, generator=g) * 0.02).to(torch.bfloat16).to(dev)
    w.view(-1)[torch.randint(0, w.numel(), (max(2, w.numel() // 2000),), generator=g).to(dev)] = 4.0  # exceptions
    p = pack_experts(w, "fixed12")
    rows = []
    for t in tokens:
        s = t * topk
        ids = torch.rand(t, e, generator=g).topk(topk, dim=1).indices.reshape(-1).to(dev)
        x = (torch.randn(s, k, generator=g)).to(torch.bfloat16).to(dev)
        sample = torch.randint(0, s, (min(s, 48),), generator=g)
        cands = {"bf16 grouped_mm": lambda: bf16_grouped(x, ids, w),
                 "experts_loop": lambda: EK.linear(x, ids, p, EK.ExpertsLoopConfig()),
                 "experts_unpack_grouped": lambda: EK.linear(x, ids, p, EK.ExpertsGroupedConfig())}
        if s <= gemv_max:
            cands["fixed12_experts_gemv"] = lambda: EK.linear(x, ids, p, ExpertsGemvConfig())
        if s <= MMA_ROWS:
            cands["fixed12_experts_mma"] = lambda: EK.linear(x, ids, p, ExpertsMmaConfig())
        chosen = EK.choose(EK.Problem("fixed12", s, n, k, p.arrays["lo"].shape[1]), EK.registry.Device.of(x.device))
        for vname, fn in cands.items():
            try:
                worst = check(fn(), x, ids, w, sample)
                ms = time_ms(fn, dev, reps, warmup) if worst <= 0 else float("nan")
            except Exception as exc:  # a variant that cannot run is a row of the table, not the end of the probe
                print(f"  {sname} tokens={t} {vname}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                worst, ms = float("nan"), float("nan")
            gms = graph_ms(fn, reps) if dev == "cuda" and vname in SYNC_FREE and worst <= 0 else float("nan")
            rows.append(dict(shape=sname, tokens=t, rows=s, variant=vname, ms=ms, graph_ms=gms, excess=worst,
                             default=chosen[0].name))
            print(f"  {sname} tokens={t} rows={s} {vname}: {ms:.3f} ms, graph {gms:.3f} ms (excess {worst:.2e})",
                  flush=True)
        unpack, mm = stages(p, x, ids)
        for vname, fn in (("  grouped: unpack", unpack), ("  grouped: _grouped_mm", mm)):
            ms = time_ms(fn, dev, reps, warmup)
            rows.append(dict(shape=sname, tokens=t, rows=s, variant=vname, ms=ms, graph_ms=float("nan"), excess=None,
                             default=chosen[0].name))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small shapes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts (default 9,64,512,2048)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shapes, topk = (TINY, 2) if a.tiny else (SHAPES, 8)
    tokens = [int(t) for t in (a.tokens or ("5,40" if a.tiny else "9,64,512,2048")).split(",")]
    reps = a.reps or (1 if a.tiny else 20)
    warmup = 0 if a.tiny else 3  # the check's call compiled the kernels
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}; top-{topk}",
          flush=True)
    rows = []
    for sname, (e, n, k) in shapes.items():
        rows += run_shape(sname, e, n, k, tokens, topk, dev, reps, warmup, gemv_max=512)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    base = {(r["shape"], r["tokens"]): r["ms"] for r in rows if r["variant"] == "bf16 grouped_mm"}
    gbase = {(r["shape"], r["tokens"]): r["graph_ms"] for r in rows if r["variant"] == "bf16 grouped_mm"}
    print(f"\n{'shape':8s} {'tokens':>6s} {'rows':>6s} {'variant':24s} {'ms':>9s} {'x bf16':>7s} {'graph ms':>9s} "
          f"{'x bf16':>7s}  default")
    for r in rows:
        key = (r["shape"], r["tokens"])
        print(f"{r['shape']:8s} {r['tokens']:6d} {r['rows']:6d} {r['variant']:24s} {r['ms']:9.3f} "
              f"{r['ms'] / base[key]:7.2f} {r['graph_ms']:9.3f} {r['graph_ms'] / gbase[key]:7.2f}  {r['default']}")


if __name__ == "__main__":
    main()
