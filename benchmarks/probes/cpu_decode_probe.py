#!/usr/bin/env python3
"""Research probe (issue 39): a fixed12 product at M = 1 on the CPU, four ways, against bf16 ``F.linear``.

``twin``: the op's pure-torch twin (numpy unpack, then ``F.linear``); ``compiled-i16`` and
``compiled-i32``: the decode and the sum written in torch and compiled by ``torch.compile`` (Inductor's
C++; the bf16 word built in int16, or the fp32 bits in int32); ``c``: glyd's C kernel
(``glyd.kernels.fixed12.cpu``). Median ms of ``--reps`` calls per shape of SmolLM2-135M's linears, one
thread unless ``--threads``. Not used by glyd: it is how the C kernel was chosen
(benchmarks/history/2026-12-03-cpu-generation.md).

    python benchmarks/probes/cpu_decode_probe.py --reps 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import glyd  # noqa: E402
from glyd.kernels.fixed12 import cpu as cpu_fixed12  # noqa: E402
from glyd.ops.backends import torch as twin  # noqa: E402

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]


def _half(xh, lo_h, nib, base, int16: bool):
    if int16:
        n16 = nib.to(torch.int16)
        w = ((lo_h.to(torch.int16) | ((n16 & 7) + base) << 8) | ((n16 & 8) << 12)).view(torch.bfloat16).float()
    else:
        hi = ((nib & 8) << 4) | ((nib & 7) + base)
        w = ((hi << 24) | (lo_h.to(torch.int32) << 16)).view(torch.float32)
    return (xh[:, None] * w[None]).sum((-1, -2))


def _gemv(x, lo, code, base, int16: bool):
    n, kp = lo.shape
    g = kp // 64
    lo4 = lo.view(n, g, 2, 32)
    c = code.view(n, g, 32)
    c = c if int16 else c.to(torch.int32)
    xf = x.float().view(x.shape[0], g, 2, 32)
    return _half(xf[:, :, 0], lo4[:, :, 0], c & 15, base, int16) + _half(xf[:, :, 1], lo4[:, :, 1], c >> 4, base, int16)


def _ms(f, reps: int) -> float:
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    compiled = {v: torch.compile(lambda x, lo, c, b, v=v: _gemv(x, lo, c, b, v == "i16")) for v in ("i16", "i32")}
    print("| N x K | bf16 F.linear ms | twin | compiled-i16 | compiled-i32 | C kernel |")
    print("|---|---|---|---|---|---|")
    for n, k in SHAPES:
        w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
        p = glyd.pack(w, "fixed12")
        a = p.arrays
        x = torch.randn(1, k).to(torch.bfloat16)
        base = int(a["base"][0])
        ref = _ms(lambda: F.linear(x, w), args.reps)
        cells = [_ms(lambda: twin.linear(x, "fixed12", [n, k], [a[m] for m in ("lo", "code", "base", "exc_idx", "exc_hi")],
                                          None, p.version), max(3, args.reps // 5))]
        for v in ("i16", "i32"):
            cells.append(_ms(lambda v=v: compiled[v](x, a["lo"], a["code"], base), args.reps))
        cells.append(_ms(lambda: cpu_fixed12.linear(x, p), args.reps) if cpu_fixed12.available() else float("nan"))
        print(f"| {n} x {k} | {ref:.3f} | " + " | ".join(f"{c:.3f} ({c / ref:.2f}x)" for c in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
