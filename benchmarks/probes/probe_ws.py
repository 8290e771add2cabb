"""Ran against commit 497582d (check that commit out to run it).
Probe of the warp-specialized wgmma tile (``fixed12_ws``) on one matrix shape: the full kernel
against its TMA stream alone (``fixed12_ws.PROBE_LOADS``: 1 with x, 2 plane words only) and its
warpgroup alone (3: decode and MMAs on whatever the ring holds, no copies, no waits), both halves
at once with no handoff between them (4), the full kernel without its per-step proxy fence (5), the x
permutation alone, bf16 ``F.linear`` and the current default, at a few M, ring depths and
programs an SM. One CUDA graph over enough copies of the matrix to exceed L2, median of replays.

    PYTHONPATH=src python benchmarks/probe_ws.py --shape gate/up --ms 16,64
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import glyd
from glyd import kernels
from glyd.kernels import _common as C
from glyd.kernels.fixed12 import wgmma_warpspec as fixed12_ws
from glyd.timing import cuda_graph_ms

SHAPES = {"k/v": (512, 3584), "q/o": (3584, 3584), "gate/up": (18944, 3584), "down": (3584, 18944),
          "lm_head": (152064, 3584)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="gate/up")
    ap.add_argument("--ms", default="16,64")
    ap.add_argument("--rings", default="2.3.80,4.2.128,3.2.128,6.1.0,8.1.0",
                    help="ring depth.programs an SM.register cap (0: none) of each ws variant")
    ap.add_argument("--probes", default="0,1,2,3", help="fixed12_ws.PROBE_LOADS values to time")
    args = ap.parse_args(argv)
    n, k = SHAPES[args.shape]
    copies = max(2, min(28, -(-300_000_000 // (n * k * 3 // 2))))
    ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(copies)]
    ps = [glyd.pack(w, "fixed12") for w in ws]
    nbytes = sum(p.arrays["lo"].numel() + p.arrays["code"].numel() for p in ps) / copies
    rows = []
    for m in (int(v) for v in args.ms.split(",")):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        t16 = cuda_graph_ms(lambda: [F.linear(x, w) for w in ws], 20) / copies * 1e3
        rows.append((m, "bf16 F.linear", t16, n * k * 2))
        t = cuda_graph_ms(lambda: [kernels.linear(x, p) for p in ps], 20) / copies * 1e3
        rows.append((m, "default", t, nbytes))
        t = cuda_graph_ms(lambda: [fixed12_ws.permute_x(x) for _ in ps], 20) / copies * 1e3
        rows.append((m, "permute_x alone", t, 0))
        bt = 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64
        # (2, 3, 80): the defaults (round 29); the rest as timed in run 75
        for st, wv, cap in (tuple(int(v) for v in r.split(".")) for r in args.rings.split(",")):
            if (bt == 64 and st > 3 and cap) or (bt == 64 and st > 6):  # shared memory: 2 or 1 an SM
                continue
            cfg = C.Config(bm=bt, bn=64, bk=128, gluon=True, wg=True, ws=True, stages=st, waves=wv, exc_tile=True,
                           maxnreg=cap)
            for probe in (int(v) for v in args.probes.split(",")):
                fixed12_ws.PROBE_LOADS = probe
                try:
                    t = cuda_graph_ms(lambda cfg=cfg: [kernels.linear(x, p, None, cfg) for p in ps], 20) / copies * 1e3
                finally:
                    fixed12_ws.PROBE_LOADS = 0
                name = (f"ws bm{bt} s{st} wv{wv}" + (f" r{cap}" if cap else "")
                        + ["", " loads", " words only", " compute only", " both, no handoff", " no fence"][probe])
                rows.append((m, name, t, nbytes))
    print(f"\n{args.shape} {n}x{k}, {copies} copies, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| M | variant | us a matrix | ratio to bf16 | GB/s (weights) |")
    print("|---|---|---|---|---|")
    for m, name, t, b in rows:
        t16 = next(r[2] for r in rows if r[0] == m and r[1] == "bf16 F.linear")
        print(f"| {m} | {name} | {t:.2f} | {t / t16:.3f} | {b / t / 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
