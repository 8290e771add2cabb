"""Where the fixed12 decode step's time goes: kernels by kind, and the idle time between them.

The same unmerged Qwen2.5-7B-shaped step as ``benchmarks/kernels.py`` (all linears of 28 layers
plus the lm_head, one CUDA graph), fixed12 only. For each M it

1. times bf16 ``F.linear`` and the fixed12 default (medians of graph replays, as kernels.py);
2. times the fixed12 step with the split-K reduce (``_common.finalize``) replaced by nothing:
   the outputs are then wrong (never checked), the difference to (1) is what the reduce kernels
   cost the step, launch gaps included;
3. records three replays of the fixed12 graph under ``torch.profiler`` and sums every GPU
   kernel's duration by kind (tile / GEMV kernels, the reduce, exception passes, other), and the
   idle time between kernels on the stream.

    python benchmarks/step_parts.py --out DIR [--ms 1,2,4,8,16] [--layers 28] [--fixup]

Writes DIR/step_parts.json and prints a short table last. Timing-only: correctness is
``kernels.py``'s job (and the GPU tests'). The configs are the registry's choices (``--fixup``:
with ``fixup=True`` where the config has it; the wg, ws and long configs have not); the table's
header gives their ``pdl`` settings (the default comes from ``GLYD_PDL``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import glyd
from glyd import kernels
from glyd.kernels import _common as C
from glyd.kernels import registry
from glyd.timing import cuda_graph_ms

log = logging.getLogger("step_parts")

H, I, KV, VOCAB, LAYERS = 3584, 18944, 512, 152064, 28
UNMERGED = [("q", H, H), ("k", KV, H), ("v", KV, H), ("o", H, H), ("gate", I, H), ("up", I, H), ("down", H, I)]


def kind(name: str) -> str:
    """A kernel's kind from its name."""
    if "finalize" in name:
        return "reduce"
    if "_exception_kernel" in name:
        return "exceptions"
    if "_gl_kernel" in name or "_wg_kernel" in name or "_ws_kernel" in name:
        return "gluon tile"
    if any(k in name for k in ("_gemv_gm_kernel", "_tc_kernel", "_mma_kernel", "_tile_kernel")):
        return "triton tile/gemv"
    return "other: " + name[:40]


def build(layers: int):
    mats = []
    for name, n, k in UNMERGED + [("lm_head", VOCAB, H)]:
        for _ in range(1 if name == "lm_head" else layers):
            w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
            mats.append((w, glyd.pack(w, "fixed12")))
    torch.cuda.synchronize()
    return mats


def step(mats, xs, which: int):
    def run():
        for trip in mats:
            obj = trip[which]
            x = xs[obj.shape[1]]
            F.linear(x, obj) if which == 0 else kernels.linear(x, obj)
    return run


def step_pdl(mats, xs) -> list[str]:
    """The ``pdl`` settings of the configs the step's fixed12 products run with."""
    return sorted({getattr(kernels.choose(xs[p.shape[1]], p)[1], "pdl", "") for _, p in mats})


def with_fixup(choose):
    """``registry.choose`` with ``fixup=True`` in every config that has the field."""
    def pick(problem, device):
        kc, cfg = choose(problem, device)
        return kc, (dataclasses.replace(cfg, fixup=True) if hasattr(cfg, "fixup") else cfg)
    return pick


def profile(fn, graph: bool = True) -> dict:
    """Kernel time by kind and idle time between kernels (us, per replay) of a graph of ``fn``
    (of ``fn`` itself, eagerly, when the profiler sees no kernels inside graphs)."""
    from torch.profiler import ProfilerActivity, profile as tprofile

    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    reps = 3
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay() if graph else fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0]
    del g
    if graph and not evs:
        log.warning("the profiler saw no kernels inside the graph: profiling eagerly (idle time then includes the host)")
        return profile(fn, graph=False)
    out = {"graph": graph, "kernels": len(evs) / reps, "by_kind_us": {}, "count": {}}
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in evs)
    for s, e, name in spans:
        k = kind(name)
        out["by_kind_us"][k] = out["by_kind_us"].get(k, 0.0) + (e - s) / reps
        out["count"][k] = out["count"].get(k, 0) + 1 / reps
    # idle: gaps on the timeline between the end of all work so far and the next kernel's start,
    # inside a replay (gaps over 1 ms are the host between replays)
    idle, end = 0.0, None
    for s, e, _ in spans:
        if end is not None and s > end and s - end < 1000:
            idle += s - end
        end = e if end is None else max(end, e)
    out["idle_us"] = idle / reps
    out["span_us"] = (spans[-1][1] - spans[0][0]) / reps if spans else 0.0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="1,2,4,8,16,32,64")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--fixup", action="store_true",
                    help="also time the step with every default config's split-K summed in the kernel (fixup=True)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    import triton

    t0 = time.time()
    mats = build(args.layers)
    log.info("built in %.1f s", time.time() - t0)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d"), "pdl": [], "rows": {}}
    real_finalize = C.finalize
    for m in [int(v) for v in args.ms.split(",")]:
        xs = {k: torch.randn(m, k, device="cuda").to(torch.bfloat16) for k in (H, I)}
        row = {"bf16_ms": cuda_graph_ms(step(mats, xs, 0)), "fixed12_ms": cuda_graph_ms(step(mats, xs, 1)),
               "pdl": step_pdl(mats, xs)}
        res["pdl"] = sorted(set(res["pdl"]) | set(row["pdl"]))
        C.finalize = lambda part, bias, out, pdl="": None
        try:
            row["no_reduce_ms"] = cuda_graph_ms(step(mats, xs, 1))
        finally:
            C.finalize = real_finalize
        if args.fixup:
            real_choose = registry.choose
            registry.choose = with_fixup(real_choose)  # kernels.linear asks registry.choose each call
            try:
                row["fixup_ms"] = cuda_graph_ms(step(mats, xs, 1))
                row["profile_fixup"] = profile(step(mats, xs, 1))
            finally:
                registry.choose = real_choose
        row["fixed12_again_ms"] = cuda_graph_ms(step(mats, xs, 1))
        row["bf16_again_ms"] = cuda_graph_ms(step(mats, xs, 0))
        row["profile"] = profile(step(mats, xs, 1))
        row["profile_bf16"] = profile(step(mats, xs, 0))
        res["rows"][m] = row
        log.info("M=%d %s", m, json.dumps(row))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "step_parts.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['device']}  torch {res['torch']}  triton {res['triton']}  {res['date']}  pdl={res['pdl']!r}")
    print("| M | bf16 ms | fixed12 ms | no reduce ms | fixup ms | kernels | tile us | reduce us (n) | exc us "
          "| other us | idle us | bf16 idle us | fixup: kernels, tile us, idle us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m, r in res["rows"].items():
        p = r["profile"]["by_kind_us"]
        n = r["profile"]["count"]
        b16 = min(r["bf16_ms"], r["bf16_again_ms"])
        f12 = min(r["fixed12_ms"], r["fixed12_again_ms"])
        tile = p.get("gluon tile", 0) + p.get("triton tile/gemv", 0)
        other = sum(v for k, v in p.items() if k.startswith("other"))
        fx = r.get("profile_fixup")
        fxs = (f"{fx['kernels']:.0f}, {fx['by_kind_us'].get('gluon tile', 0) + fx['by_kind_us'].get('triton tile/gemv', 0):.0f}"
               f", {fx['idle_us']:.0f}") if fx else "-"
        print(f"| {m} | {b16:.3f} | {f12:.3f} | {r['no_reduce_ms']:.3f} | {r.get('fixup_ms', float('nan')):.3f} "
              f"| {r['profile']['kernels']:.0f} | {tile:.0f} "
              f"| {p.get('reduce', 0):.0f} ({n.get('reduce', 0):.0f}) | {p.get('exceptions', 0):.0f} | {other:.0f} "
              f"| {r['profile']['idle_us']:.0f} | {r['profile_bf16']['idle_us']:.0f} | {fxs} |")
    others = {k for r in res["rows"].values() for k in r["profile"]["by_kind_us"] if k.startswith("other")}
    if others:
        print("other kernels:", sorted(others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
