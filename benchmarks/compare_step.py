"""Time one decode step's linears (Qwen2.5-7B shapes, merged q|k|v and gate|up, 28 layers and the
lm_head) through ``glyd.kernels.linear``'s default choice and bf16 ``F.linear``, each step one CUDA
graph, median of 20 replays. Run it once under each glyd source tree to compare two versions on
one GPU in one session (``--mode unmerged``: q, k, v, gate and up as separate matrices):

    PYTHONPATH=old/src python3 benchmarks/compare_step.py --out old.json
    PYTHONPATH=src     python3 benchmarks/compare_step.py --out new.json
    python3 benchmarks/compare_step.py --compare old.json new.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

SHAPES = {
    "merged": [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)],  # qkv, o, gate_up, down
    "unmerged": [(3584, 3584), (512, 3584), (512, 3584), (3584, 3584), (18944, 3584), (18944, 3584), (3584, 18944)],
}
LM_HEAD = (152064, 3584)
MS = [1, 2, 4, 8, 16, 32, 64, 512, 2048]


def _graph_ms(fn, replays: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def run(layers: int, out: str, mode: str = "merged") -> None:
    import glyd
    from glyd import kernels

    gen = torch.Generator(device="cuda").manual_seed(0)
    mats = [s for _ in range(layers) for s in SHAPES[mode]] + [LM_HEAD]
    ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16) for n, k in mats]
    ps = [glyd.pack(w, "fixed12").to(w.device) for w in ws]  # on any glyd version
    res = {"glyd": glyd.__file__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "mode": mode, "rows": {}}
    for m in MS:
        xs = {k: torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16) for k in {k for _, k in mats}}
        for p in ps:  # first calls outside the graph: compiles, per-matrix indexes
            kernels.prepare(p)
            kernels.linear(xs[p.shape[1]], p)
        torch.cuda.synchronize()
        t_bf16 = _graph_ms(lambda: [F.linear(xs[w.shape[1]], w) for w in ws])
        t_glyd = _graph_ms(lambda: [kernels.linear(xs[p.shape[1]], p) for p in ps])
        res["rows"][m] = {"bf16_ms": t_bf16, "glyd_ms": t_glyd, "ratio": t_glyd / t_bf16}
        print(f"M={m:5d} bf16 {t_bf16:8.3f} ms  glyd {t_glyd:8.3f} ms  {t_glyd / t_bf16:.3f}x", flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def compare(old: str, new: str) -> None:
    a, b = json.load(open(old)), json.load(open(new))
    print("| M | bf16 ms (old run) | old ms | old ratio | bf16 ms (new run) | new ms | new ratio | new/old ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for m in a["rows"]:
        ra, rb = a["rows"][m], b["rows"].get(m)
        if rb is None:
            continue
        print(f"| {m} | {ra['bf16_ms']:.3f} | {ra['glyd_ms']:.3f} | {ra['ratio']:.3f}x | {rb['bf16_ms']:.3f} | "
              f"{rb['glyd_ms']:.3f} | {rb['ratio']:.3f}x | {rb['ratio'] / ra['ratio']:.3f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--out", default="step.json")
    ap.add_argument("--mode", choices=sorted(SHAPES), default="merged",
                    help="merged: q|k|v and gate|up as one matrix each (as glyd.from_pretrained loads on a GPU)")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        sys.exit(0)
    run(args.layers, args.out, args.mode)
