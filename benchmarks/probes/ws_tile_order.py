"""How far apart in time the ws tile's programs run the copies of one weight tile (one copy for each x tile).

The ws tile (``fixed12_wgmma_warpspec``) is persistent: program p of P takes global K steps p W / P .. (p + 1) W / P
of W = weight tiles x x tiles x S steps, in tile order. With x tiles inner (main) a program takes a weight tile's
copies one after another; with x tiles outer (``WsConfig.x_outer``, the pending h142) and P a multiple of the x tiles,
every copy of a weight step sits at the same offset of its program's range, so the copies run together (if the
programs advance at the same rate) and L2 serves all but the first read of the words. Prints, for the 7B's merged
matrices at prompt sizes, the largest and the mean spread (in a program's K steps) of a weight step's copies.

    python benchmarks/probes/ws_tile_order.py
"""
from __future__ import annotations

import bisect
import math

SHAPES = {"gate_up": (37888, 3584), "down": (3584, 18944), "qkv": (4608, 3584), "lm_head": (152064, 3584)}


def spread(n: int, k: int, m: int, bn: int, bm: int, x_outer: bool, sms: int = 132) -> tuple[int, float, int]:
    """(largest, mean spread of a weight step's copies in local steps, programs) as the launcher would run it."""
    nt, mt, s = math.ceil(n / bn), math.ceil(m / bm), k // 128
    w = nt * mt * s
    p = min(w, sms)
    if x_outer and p > mt:
        p -= p % mt  # the launcher's rule (h142)
    starts = [(i * w) // p for i in range(p + 1)]
    out = []
    for wt in range(0, nt, max(1, nt // 64)):
        for st in (0, s // 2, s - 1):
            offs = []
            for xt in range(mt):
                g = ((xt * nt + wt) if x_outer else (wt * mt + xt)) * s + st
                offs.append(g - starts[bisect.bisect_right(starts, g) - 1])
            out.append(max(offs) - min(offs))
    return max(out), sum(out) / len(out), p


def main() -> None:
    print("| matrix | M | bm | x tiles | x inner: largest / mean spread | x outer: largest / mean (programs) |")
    print("|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        for m in (192, 512, 2048):
            for bm in (128, 256):
                a, b = spread(n, k, m, 128, bm, False), spread(n, k, m, 128, bm, True)
                print(f"| {name} | {m} | {bm} | {math.ceil(m / bm)} | {a[0]} / {a[1]:.1f} | {b[0]} / {b[1]:.1f} ({b[2]}) |")


if __name__ == "__main__":
    main()
