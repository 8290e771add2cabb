"""(issue 36) The expert products of a Qwen3-30B-A3B decode step (E = 128, top-8, hidden 2048,
moe_intermediate 768: gate_up [128, 1536, 2048], down [128, 2048, 768]; random normal(0, 0.02) bf16
experts, packed fixed12 on the GPU) at 8, 64, 256 and 512 rows (1, 8, 32, 64 sequences x top-8,
random routing), each variant in a CUDA graph (median of replays, each replay ``--inner`` calls that
cycle over ``--layers`` copies of the weights, so that no layer's experts stay in L2 between its calls):

* ``bf16``: transformers' grouped path a product (sort by expert, gather, ``histc`` offsets,
  ``grouped_mm`` on the sorted rows, scatter back; transformers sorts once a layer for both products,
  so this is one sort a product dearer); ``bf16 mm``: the grouped_mm alone on rows sorted before;
  a loop of ``F.linear`` over the experts (counts taken before the capture) where torch has no
  grouped_mm;
* ``gemv``: ``fixed12_experts_gemv`` (one program a row and N tile);
* ``mma bm/bn/bk/w/s``: ``fixed12_experts_mma`` at the configs of ``--configs``;
* ``unpack_grouped``: ``experts_unpack_grouped`` (the experts with rows unpacked into a bf16 scratch,
  one grouped_mm): the defaults' second choice above 64 rows, after the MMA (a guess this decides).

Every variant is checked against float64 on its rows first (one bf16 rounding plus 1e-3 of the
largest output, as tests/kernels/test_experts_kernels.py); a table (us, x bf16) comes last.

    PYTHONPATH=src python3 benchmarks/probes/probe_moe_decode.py --out $OUT/moe_decode.txt
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probes/probe_moe_decode.py --tiny   # CPU check
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from glyd.kernels import experts as kernels
from glyd.kernels.experts import ExpertsGroupedConfig
from glyd.kernels.fixed12.experts import ExpertsGemvConfig
from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig
from glyd.ops.experts import pack_experts

RTOL = 2.0**-7
ATOL_FRAC = 1e-3
FULL = dict(e=128, topk=8, hidden=2048, inter=768, tokens=(1, 8, 32, 64))
TINY = dict(e=8, topk=2, hidden=64, inter=32, tokens=(1, 8, 32))
CONFIGS = "16,64,128,4,3;16,128,128,4,3;16,64,256,4,2"
TINY_CONFIGS = "16,16,64,1,1;16,32,128,2,1"


def _routing(tokens: int, e: int, topk: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """[tokens * topk] expert ids: each token's top-k of random scores (distinct experts a token)."""
    return torch.rand(tokens, e, generator=gen).topk(topk, dim=1).indices.reshape(-1).to(device)


def _reference(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 [S, N]: each expert's rows times its matrix transposed (expert by expert: no [S, N, K] gather)."""
    ref = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64, device=x.device)
    for e in torch.unique(ids).tolist():
        rows = (ids == e).nonzero().squeeze(1)
        ref[rows] = x[rows].double() @ w[e].double().T
    return ref


def _check(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Max excess of |y - ref| over the tolerance (<= 0: within it)."""
    err = (y.double() - ref).abs()
    return float((err - (RTOL * ref.abs() + ATOL_FRAC * ref.abs().max())).max())


def _grouped_mm():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _bf16_grouped(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # transformers' grouped_mm_experts_forward, one product: sort, gather, histc offsets, grouped mm, scatter
    e = w.shape[0]
    sid, perm = torch.sort(ids)
    hist = torch.histc(sid.float() if x.device.type == "cpu" else sid.int(), bins=e, min=0, max=e - 1)
    offs = torch.cumsum(hist, dim=0, dtype=torch.int32)
    yg = _grouped_mm()(x[perm], w.transpose(-2, -1), offs=offs)
    return torch.empty_like(yg).index_copy_(0, perm, yg)


def _bf16_loop(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor):
    # no grouped_mm in this torch: a loop of F.linear over the experts with rows, found before the capture
    groups = [(e, (ids == e).nonzero().squeeze(1)) for e in torch.unique(ids).tolist()]

    def run(x=x, w=w):
        out = torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16, device=x.device)
        for e, rows in groups:
            out[rows] = F.linear(x[rows], w[e])
        return out

    return run


def _time(calls, device: str, reps: int) -> float:
    """Median microseconds a call: a CUDA graph of ``calls`` (run in order), replayed ``reps`` times."""
    if device != "cuda":  # the interpreter: the calls once, timed on the host (a check, not a number)
        t0 = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t0) * 1e6 / len(calls)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    return statistics.median(times)


def _variants(configs):
    """(name, make(x, ids, w_bf16, packed) -> call) of every variant."""
    out = []
    if _grouped_mm() is not None:
        out.append(("bf16", lambda x, ids, w, p: lambda: _bf16_grouped(x, ids, w)))

        def mm_only(x, ids, w, p):
            sid, perm = torch.sort(ids)
            hist = torch.histc(sid.float() if x.device.type == "cpu" else sid.int(), bins=w.shape[0], min=0,
                               max=w.shape[0] - 1)
            offs, xs = torch.cumsum(hist, dim=0, dtype=torch.int32), x[perm].contiguous()
            return lambda: _grouped_mm()(xs, w.transpose(-2, -1), offs=offs)

        out.append(("bf16 mm", mm_only))
    else:
        out.append(("bf16", lambda x, ids, w, p: _bf16_loop(x, ids, w)))
    out.append(("gemv", lambda x, ids, w, p: lambda: kernels.linear(x, ids, p, ExpertsGemvConfig())))
    for c in configs:
        name = f"mma {c.block_m}/{c.block_n}/{c.block_k}/{c.warps}/{c.stages}"
        out.append((name, lambda x, ids, w, p, c=c: lambda: kernels.linear(x, ids, p, c)))
    if hasattr(torch, "_grouped_mm"):
        out.append(("unpack_grouped", lambda x, ids, w, p: lambda: kernels.linear(x, ids, p, ExpertsGroupedConfig())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1): checks the probe")
    ap.add_argument("--configs", default=None, help="block_m,block_n,block_k,warps,stages;... of fixed12_experts_mma")
    ap.add_argument("--layers", type=int, default=None, help="copies of the weights cycled over (default 4; tiny 1)")
    ap.add_argument("--inner", type=int, default=8, help="calls a graph replay")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    a = ap.parse_args()
    shp = TINY if a.tiny else FULL
    device = "cpu" if a.tiny else "cuda"
    layers = a.layers or (1 if a.tiny else 4)
    spec = a.configs or (TINY_CONFIGS if a.tiny else CONFIGS)
    configs = [ExpertsMmaConfig(*map(int, c.split(","))) for c in spec.split(";")]
    gen = torch.Generator().manual_seed(0)
    wgen = torch.Generator(device).manual_seed(1)  # the weights drawn where they live (400M a matrix)
    shapes = {"gate_up": (2 * shp["inter"], shp["hidden"]), "down": (shp["hidden"], shp["inter"])}
    weights = {}
    for name, (n, k) in shapes.items():
        ws = []
        for _ in range(layers):
            w = (torch.randn(shp["e"], n, k, generator=wgen, device=device) * 0.02).to(torch.bfloat16)
            ws.append((w, pack_experts(w, "fixed12")))
        weights[name] = ws
        print(f"{name}: [{shp['e']}, {n}, {k}] x {layers} layers packed", flush=True)
    rows_us: dict[tuple[int, str, str], float] = {}
    variants = _variants(configs)
    for tokens in shp["tokens"]:
        ids = _routing(tokens, shp["e"], shp["topk"], gen, device)
        s = ids.shape[0]
        for name, (n, k) in shapes.items():
            x = (torch.randn(s, k, generator=gen)).to(torch.bfloat16).to(device)
            w0, p0 = weights[name][0]
            ref = _reference(x, ids, w0)
            for vname, make in variants:
                if vname == "bf16 mm":  # its output is in sorted order
                    perm = torch.sort(ids).indices
                    y = torch.empty_like(ref, dtype=torch.bfloat16).index_copy_(0, perm, make(x, ids, w0, p0)())
                else:
                    try:
                        y = make(x, ids, w0, p0)()
                    except ValueError as exc:  # a family that cannot take this shape (the tiny down's K 32)
                        print(f"  {s} rows {name} {vname}: cannot run ({str(exc)[:160]})")
                        continue
                worst = _check(y, ref)
                if worst > 0:
                    print(f"  {s} rows {name} {vname}: WRONG (max excess over tolerance {worst:.3g}); not timed")
                    continue
                calls = [make(x, ids, *weights[name][i % layers]) for i in range(a.inner if device == "cuda" else 1)]
                us = _time(calls, device, a.reps)
                rows_us[(s, name, vname)] = us
                print(f"  {s} rows {name} {vname}: {us:.1f} us (checked: excess {worst:.3g})", flush=True)
    lines = ["", "| rows | variant | gate_up us | down us | sum us | x bf16 |", "|---|---|---|---|---|---|"]
    for tokens in shp["tokens"]:
        s = tokens * shp["topk"]
        base = sum(rows_us.get((s, nm, "bf16"), float("nan")) for nm in shapes)
        for vname, _ in variants:
            g, d = rows_us.get((s, "gate_up", vname), float("nan")), rows_us.get((s, "down", vname), float("nan"))
            lines.append(f"| {s} | {vname} | {g:.1f} | {d:.1f} | {g + d:.1f} | {(g + d) / base:.2f} |")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
