"""Profile the fixed12 decode-step kernels with Nsight Compute, against bf16 F.linear.

Runs each kernel once (after a warm-up outside the profiled range) on one 18944 x 3584 matrix
(Qwen2.5-7B's gate/up shape) at M = 1, 2 and 8, so ``ncu --profile-from-start off`` sees only
those launches:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SchedulerStats \\
        python3 benchmarks/profile_ncu.py

``--shape q/o --ms 16,64`` profiles bf16 and the default config at those M on another shape
instead of the fixed variant list; ``--dense11`` packs the weights as dense11 instead (the registry's choice at each
M, and each ``--wg11 SPEC``: ``dense11_wgmma`` with ``dense11_step.wg_spec(SPEC)``); ``--exc 0.001`` gives the weights real weights' share of exceptions. Without ncu it just checks each variant against float64 F.linear and prints its name.
The variants are kernel family configs (``glyd.kernels.GemvConfig``, ``GluonConfig``, ``WgConfig``,
``WsConfig``); the default is the registry's choice. ``--ws`` no longer runs the ws kernel's probes
(``fixed12_ws.PROBE_LOADS``: its TMA stream alone, its warpgroup alone, both with no handoff): they
are gone, and this script's 497582d version has them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

import torch
import torch.nn.functional as F

import glyd
from glyd import kernels
from glyd.kernels import GemvConfig, GluonConfig, WgConfig, WsConfig

log = logging.getLogger("profile_ncu")

VARIANTS = {
    # name: (M, Config or None for the default, or "bf16")
    "bf16 M=1": (1, "bf16"),
    "f12 default M=1": (1, None),
    "f12 gv bm1 bn32 bk256 wv8 M=1": (1, GemvConfig(bm=1, bn=32, bk=256, waves=8)),
    "bf16 M=2": (2, "bf16"),
    "f12 gv bm2 bn32 bk256 wv8 M=2": (2, GemvConfig(bm=2, bn=32, bk=256, waves=8)),
    "bf16 M=8": (8, "bf16"),
    "f12 gv bm8 bn32 bk128 wv8 M=8": (8, GemvConfig(bm=8, bn=32, bk=128, waves=8)),
}

# --set gluon: the Gluon tile against the GEMV at M = 1 (the same bytes; the GEMV is 0.78x bf16 on
# gate/up, the tile 0.96x in sweep round 19) and the M = 8 default
GLUON_VARIANTS = {
    "bf16 M=1": (1, "bf16"),
    "f12 default M=1": (1, None),
    "f12 gluon bn64 w4 exc_tile M=1": (1, GluonConfig(bm=16, bn=64, bk=128, warps=4, waves=8, prefetch=True,
                                                      exc_tile=True)),
    "f12 gluon bn64 w4 ring3 exc_tile M=1": (1, GluonConfig(bm=16, bn=64, bk=128, warps=4, waves=8, prefetch=True,
                                                            ring=3, ring_x=True, exc_tile=True)),
    "f12 gluon bn64 w4 step exc_tile M=1": (1, GluonConfig(bm=16, bn=64, bk=128, warps=4, waves=8, prefetch=True,
                                                           exc_tile=True, x_ahead=False)),
    "f12 gluon bn64 w4 step x8 r96 exc_tile M=1": (1, GluonConfig(bm=16, bn=64, bk=128, warps=4, waves=8,
                                                                  prefetch=True, exc_tile=True, x_ahead=False,
                                                                  x_rows8=True, maxnreg=96)),
    "bf16 M=8": (8, "bf16"),
    "f12 default M=8": (8, None),
}

SHAPES = {"gate/up": (18944, 3584), "q/o": (3584, 3584), "k/v": (512, 3584), "down": (3584, 18944),
          "lm_head": (152064, 3584), "gate_up": (37888, 3584), "qkv": (4608, 3584)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="profile fixed12 kernels under ncu (see the module docstring)")
    ap.add_argument("--shape", default="gate/up", choices=list(SHAPES))
    ap.add_argument("--ms", default=None, help="comma-separated M: bf16 and the default config at each "
                    "(instead of the fixed variant list)")
    ap.add_argument("--set", default="gemv", choices=("gemv", "gluon"), help="the fixed variant list")
    ap.add_argument("--fixup", action="store_true", help="with --ms: also the default with fixup=True (where "
                    "its config has the field: not wg, ws or long)")
    ap.add_argument("--gluon64", action="store_true",
                    help="with --ms: also the bm 64 Gluon tile (x tiles in the async ring, exceptions in the tile)")
    ap.add_argument("--wg", action="store_true",
                    help="with --ms: also the wgmma tile (fixed12_wg: bn 64 4 warps, bn 128 8 warps; waves 4)")
    ap.add_argument("--ws", action="store_true",
                    help="with --ms: also the warp-specialized wgmma tile (fixed12_ws: the defaults' ring 2, "
                    "3 programs an SM)")
    ap.add_argument("--long", action="store_true",
                    help="with --ms: also the ws tile past M = 64 (bm 128 and 256, bn 128, 8 warps, exc_rows with x "
                    "transposed: sweep round 47's), beside the default (unpack + cuBLAS there)")
    ap.add_argument("--exc", type=float, default=0.0,
                    help="this share of the weights set to 1e-30 (fixed12 exceptions), at random places: real "
                    "weights have 0.01-0.13%% (normal ones about 0.008%%)")
    ap.add_argument("--dense11", action="store_true",
                    help="with --ms: the weights packed as dense11 (the default config is dense11's at each M)")
    ap.add_argument("--wg11", action="append", default=[], metavar="SPEC",
                    help="with --dense11: also dense11_wgmma with this config (dense11_step.py's --wg SPEC)")
    args = ap.parse_args(argv)
    if (args.dense11 or args.wg11) and not (args.ms and args.dense11):
        ap.error("--dense11 needs --ms, and --wg11 needs --dense11")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    n, k = SHAPES[args.shape]
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    if args.exc:
        w.view(-1)[torch.randint(0, w.numel(), (int(w.numel() * args.exc),), device="cuda")] = torch.tensor(
            1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "dense11" if args.dense11 else "fixed12")
    variants = GLUON_VARIANTS if args.set == "gluon" else VARIANTS
    if args.ms:
        variants = {}
        for m in (int(v) for v in args.ms.split(",")):
            variants[f"bf16 M={m}"] = (m, "bf16")
            variants[f"{'d11' if args.dense11 else 'f12'} default M={m}"] = (m, None)
            for spec in args.wg11:
                from dense11_step import wg_spec

                variants[f"d11 wg {spec} M={m}"] = (m, wg_spec(spec))
            if args.gluon64:
                variants[f"f12 gluon bm64 bn64 ring2 M={m}"] = (m, GluonConfig(
                    bm=64, bn=64, bk=128, warps=4, waves=8, prefetch=True, ring=2, ring_x=True, exc_tile=True))
            if args.wg:
                bt = 16 if m <= 16 else 32 if m <= 32 else 64
                for bn, warps in ((64, 4), (128, 8)):
                    variants[f"f12 wg bm{bt} bn{bn} w{warps} wv4 M={m}"] = (m, WgConfig(
                        bm=bt, bn=bn, warps=warps, waves=4))
            if args.ws:  # runs 76-77 profiled ring 4 (3 at bm 64), 2 an SM, 128 registers
                bt = 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64
                cfg = WsConfig(bm=bt, bn=64, stages=2, waves=3, maxnreg=80)  # the defaults' settings (round 29)
                variants[f"f12 ws bm{bt} s2 wv3 r80 M={m}"] = (m, cfg)
            if args.long:  # round 47 (2026-12-06, an H100): 1.94-2.18x bf16 at M = 256-512 with normal weights
                for bm, bn in ((128, 128), (256, 128), (128, 256)):  # round 48: bn 256, x read once for 256 rows
                    variants[f"f12 ws bm{bm} bn{bn} w8 exc rows M={m}"] = (m, WsConfig(
                        bm=bm, bn=bn, warps=8, stages=2, waves=1, exc_xt=True, exc_rows=True))  # round 47's (its exc_chunk)
                # round 48's pipe at bm 256 (h140: no spills in the step loop), and exc_pre (with h141: the rounds a
                # round ahead)
                pipe = WsConfig(bm=256, bn=128, warps=8, stages=2, waves=1, exc_xt=True, exc_rows=True, pipe=True)
                variants[f"f12 ws bm256 bn128 w8 exc rows pipe M={m}"] = (m, pipe)
                # x tiles outer (h142): the weight tile's words from DRAM once for all x tiles (DRAM bytes, L2 hits)
                variants[f"f12 ws bm256 bn128 w8 exc rows x outer M={m}"] = (m, dataclasses.replace(
                    pipe, pipe=False, x_outer=True))
                # the H100 table's M = 256-511 row (2026-12-07): bm 128, 3 stages, x outer (1.59x bf16 at M = 512 with
                # normal weights, 1.91x with 0.1% exceptions: what its step and its finish spend)
                variants[f"f12 ws bm128 bn128 w8 s3 exc rows x outer M={m}"] = (m, dataclasses.replace(
                    pipe, bm=128, stages=3, pipe=False, x_outer=True))
                # ... with a consumer partition a warpgroup (the H100 table's row since round 52, 2026-12-07: 1.755x
                # bf16 at M = 512 with 0.1% exceptions, x outer alone 1.906x)
                variants[f"f12 ws bm128 bn128 w8 s3 exc rows x outer wg parts M={m}"] = (m, dataclasses.replace(
                    pipe, bm=128, stages=3, pipe=False, x_outer=True, wg_parts=True))
                # ... and a slot freed by halves (h143: its copies a step and a half to land)
                variants[f"f12 ws bm256 bn128 w8 exc rows halves x outer M={m}"] = (m, dataclasses.replace(
                    pipe, pipe=False, x_outer=True, halves=True))
                if args.exc:
                    variants[f"f12 ws bm256 bn128 w8 exc rows exc_pre M={m}"] = (m, dataclasses.replace(
                        pipe, pipe=False, exc_pre=True))
            if args.fixup:
                _, d = kernels.choose(torch.empty(m, k, device="cuda", dtype=torch.bfloat16), p)
                if hasattr(d, "fixup"):
                    variants[f"f12 default fixup M={m}"] = (m, dataclasses.replace(d, fixup=True))
                else:
                    log.info("M=%d: the default (%s) has no fixup setting", m, type(d).__name__)
    runs = []
    for name, (m, cfg) in variants.items():
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        if cfg == "bf16":
            fn = (lambda x=x: F.linear(x, w))
        else:
            fn = (lambda x=x, cfg=cfg: kernels.linear(x, p, None, cfg))
            ref = F.linear(x.double(), w.double())
            err = ((fn().double() - ref).norm() / ref.norm()).item()
            if not err < 5e-3:
                raise SystemExit(f"{name}: relative error {err:.3g} against float64 F.linear")
        fn()
        runs.append((name, fn))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in runs:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    for name, _ in runs:
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
