"""How many fixed12 exceptions real weights have with one exponent window a matrix (the format's) against a
window per row or per group of rows (a candidate format change: the kernels would read a base a row).

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/probes/exc_windows.py
"""

from __future__ import annotations

import sys

import torch

from glyd.codec.fixed12 import WINDOW
from realweights import sources


def outside(hi7: torch.Tensor, rows: int) -> int:
    # exceptions when each group of `rows` rows has its own best window of WINDOW values of exponent >> 1
    n = hi7.shape[0]
    total = 0
    for r0 in range(0, n, rows):
        h = torch.bincount(hi7[r0:r0 + rows].reshape(-1).long(), minlength=128)
        best = int(h.unfold(0, WINDOW, 1).sum(dim=1).max())
        total += int(h.sum()) - best
    return total


def main() -> None:
    groups = (None, 64, 16, 1)  # None: the whole matrix (the format now)
    print("| source | matrices | weights | " + " | ".join("a matrix" if g is None else f"{g} rows" for g in groups) + " |")
    print("|---|---|---|" + "---|" * len(groups))
    worst = []
    for src, ts in sources().items():
        counts = [0] * len(groups)
        weights = 0
        for name, w in ts.items():
            hi7 = (w.view(torch.int16).to(torch.int32) >> 8) & 0x7F
            c = [outside(hi7, g or w.shape[0]) for g in groups]
            worst.append((c[0] / w.numel(), src, name, tuple(w.shape), [x / w.numel() for x in c]))
            counts = [a + b for a, b in zip(counts, c)]
            weights += w.numel()
        print(f"| {src} | {len(ts)} | {weights} | " + " | ".join(f"{100 * c / weights:.4f}%" for c in counts) + " |")
    print("\nthe matrices with the most exceptions (a matrix / 64 / 16 / 1 rows):")
    for share, src, name, shape, per in sorted(worst, reverse=True)[:8]:
        print(f"  {src} {name} {shape}: " + " / ".join(f"{100 * x:.4f}%" for x in per))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
