"""(issue 35, prompts) dense11 version 3's unpack on the wgmma tile's decode (``kernels/dense11/unpack_wg.py``) against
the Triton unpack the long-M path runs (``kernels.unpack``: ``unpack_v2``) and a bf16 copy of the same bytes, and
as ``direct`` with its stores from the decode's own layout (``direct_layout``: no shared memory, half-sector stores),
on the merged Qwen2.5-7B matrices (qkv, o, gate_up, down, lm_head) with 0.1% of the weights exceptions (real
weights: 0.01-0.13%). Each unpack is compared with the weights bit for bit first; then timed (median of 30 CUDA-graph replays,
``glyd.timing.cuda_graph_ms``) with TB/s over the packed bytes read and the bf16 bytes written.

    PYTHONPATH=src python3 benchmarks/probes/dense11_unpack_wg.py [--exc 0.001] [--shapes gate_up,down] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import glyd
from glyd import kernels
from glyd.timing import cuda_graph_ms

SHAPES = [("qkv", 4608, 3584), ("o", 3584, 3584), ("gate_up", 37888, 3584), ("down", 3584, 18944),
          ("lm_head", 152064, 3584)]


def weights(n: int, k: int, exc: float, seed: int) -> torch.Tensor:
    """Normal(0, 0.02) bf16 weights with ``exc`` of them 1e-30 (dense11's exceptions)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    if exc:
        hit = torch.rand(n, k, device="cuda", generator=g) < exc
        w[hit] = 1e-30
    return w


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exc", type=float, default=0.001)
    ap.add_argument("--shapes", default=",".join(n for n, _, _ in SHAPES),
                    help="comma-separated shapes to run (e.g. gate_up: one shape under Nsight Compute)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("needs a Hopper GPU (the wgmma tile's decode is Gluon: no interpreter)")
        return 2
    from glyd.kernels.dense11.unpack_wg import unpack_wg

    rows, fails = [], []
    pick = args.shapes.split(",")
    if bad := [s for s in pick if s not in {n for n, _, _ in SHAPES}]:
        ap.error(f"unknown shapes {bad}; known: {', '.join(n for n, _, _ in SHAPES)}")
    for i, (name, n, k) in enumerate(SHAPES):
        if name not in pick:
            continue
        w = weights(n, k, args.exc, i)
        p = glyd.pack(w, "dense11")
        kernels.prepare(p)
        for label, fn in (("unpack_v2", lambda: kernels.unpack(p)), ("unpack_wg", lambda: unpack_wg(p)),
                          ("direct", lambda: unpack_wg(p, direct=True))):
            if not torch.equal(fn().view(torch.int16), w.view(torch.int16)):
                fails.append(f"{label} {name} is not bit-exact")
        if fails:
            break
        out = torch.empty_like(w)
        moved = p.nbytes + w.numel() * 2
        t = {"bf16 copy": cuda_graph_ms(lambda: out.copy_(w), 30),
             "unpack_v2": cuda_graph_ms(lambda: kernels.unpack(p, out=out), 30),
             "unpack_wg": cuda_graph_ms(lambda: unpack_wg(p, out), 30),
             "direct": cuda_graph_ms(lambda: unpack_wg(p, out, direct=True), 30)}
        rows.append({"shape": name, "n": n, "k": k, "packed_bytes": p.nbytes, "ms": t,
                     "tb_s": {v: (w.numel() * 4 if v == "bf16 copy" else moved) / ms / 1e9 for v, ms in t.items()}})
        print(f"{name} {n}x{k}: " + ", ".join(f"{v} {ms:.3f} ms ({rows[-1]['tb_s'][v]:.2f} TB/s)"
                                               for v, ms in t.items()), flush=True)
        del w, p, out
        torch.cuda.empty_cache()
    if fails:
        print("\n".join(f"FAIL {f}" for f in fails))
        return 1
    tot = {v: sum(r["ms"][v] for r in rows) for v in rows[0]["ms"]}
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, exceptions {args.exc:.2%}")
    print("| shape | bf16 copy ms | unpack_v2 ms (TB/s) | unpack_wg ms (TB/s) | direct ms (TB/s) | wg / v2 | "
          "direct / v2 |\n|---|---|---|---|---|---|---|")
    for r in rows:
        m, s = r["ms"], r["tb_s"]
        print(f"| {r['shape']} | {m['bf16 copy']:.3f} | {m['unpack_v2']:.3f} ({s['unpack_v2']:.2f}) | "
              f"{m['unpack_wg']:.3f} ({s['unpack_wg']:.2f}) | {m['direct']:.3f} ({s['direct']:.2f}) | "
              f"{m['unpack_wg'] / m['unpack_v2']:.3f} | {m['direct'] / m['unpack_v2']:.3f} |")
    print(f"| all | {tot['bf16 copy']:.3f} | {tot['unpack_v2']:.3f} | {tot['unpack_wg']:.3f} | {tot['direct']:.3f} | "
          f"{tot['unpack_wg'] / tot['unpack_v2']:.3f} | {tot['direct'] / tot['unpack_v2']:.3f} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "dense11_unpack_wg.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "exc": args.exc,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
