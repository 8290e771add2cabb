"""The backward product of a packed linear on the CPU: grad_input = grad_out @ W, two ways.

* ``unpack``: unpack the whole W (the codec, ``glyd::unpack``), then one ``grad @ W`` (what
  ``glyd::linear``'s autograd does, and bf16's own product bit for bit);
* ``fused``: decode W a block of rows at a time (``glyd::rows``, the lookup decode) and accumulate
  ``grad[:, rows] @ W[rows]``, never holding the whole bf16 W (the CPU form of a fused product).

Median of ``--reps`` runs, one thread (``--threads``), bf16 bf16 in and out.

    python benchmarks/lora_backward.py --shape 2048x2048 --m 16,512
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import glyd
from glyd import ops


def _median(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="2048x2048,5632x2048,2048x5632", help="N x K of W, comma-separated")
    ap.add_argument("--m", default="16,512", help="rows of grad (tokens), comma-separated")
    ap.add_argument("--block", type=int, default=256, help="rows of W decoded at a time (fused)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), block {args.block}, median of {args.reps}")
    print("| N x K | M | unpack ms | of it unpack | fused ms | fused / unpack |")
    print("|---|---|---|---|---|---|")
    for shape in args.shape.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
        p = glyd.pack(w, "fixed12")
        for m in (int(v) for v in args.m.split(",")):
            g = torch.randn(m, n).to(torch.bfloat16)

            def unpack() -> torch.Tensor:
                return g @ ops.unpack(p)

            def fused() -> torch.Tensor:
                out = torch.zeros(m, k, dtype=torch.float32)
                for r in range(0, n, args.block):
                    idx = torch.arange(r, min(r + args.block, n))
                    out += (g[:, r : r + args.block] @ ops.rows(p, idx)).float()
                return out.to(torch.bfloat16)

            assert torch.equal(unpack().view(torch.int16), (g @ w).view(torch.int16))
            tu, tf, tdec = _median(unpack, args.reps), _median(fused, args.reps), _median(lambda: ops.unpack(p), args.reps)
            print(f"| {n}x{k} | {m} | {tu * 1e3:.1f} | {tdec / tu:.0%} | {tf * 1e3:.1f} | {tf / tu:.2f}x |")


if __name__ == "__main__":
    main()
