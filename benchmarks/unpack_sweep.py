"""Time the fixed12 unpack kernels' tile shapes against a bf16 copy of the same matrices (H200).

Packs ``--copies`` random 18944 x 3584 matrices (Qwen2.5-7B's gate/up; more packed bytes than L2
holds), checks every variant bit for bit against the input, then times one CUDA graph that
unpacks all copies (median of its replays) and reports us a matrix and GB/s of packed reads plus
bf16 writes. The reference rows are ``copy_`` of the same bf16 matrices (2 + 2 bytes a weight) and
of their packed planes (1.5 + 1.5 bytes a weight): what a plain copy reaches on this GPU.

    PYTHONPATH=src python3 benchmarks/unpack_sweep.py --out $OUT

Each variant is a ``glyd.kernels.UnpackConfig``: "bytes" the byte tiles (``flat_groups=0``; rows,
64-weight groups and warps a program), "flat" the flat kernel (groups a program, warps). The
word-tile unpack (``UNPACK_WORDS``) is gone; its last version is in 497582d.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch
import triton

import glyd
from glyd import kernels
from glyd.kernels import UnpackConfig
from glyd.timing import cuda_graph_ms

log = logging.getLogger("unpack_sweep")

# (kind, bn, g, warps): bn = groups a program for "flat"
VARIANTS = [("bytes", 32, 2, 4), ("bytes", 32, 4, 4), ("bytes", 64, 2, 4), ("bytes", 16, 4, 4),
            ("flat", 32, 0, 4), ("flat", 64, 0, 4), ("flat", 128, 0, 4), ("flat", 128, 0, 8), ("flat", 256, 0, 8),
            ("flat", 16, 0, 2)]


def config(kind: str, bn: int, g: int, warps: int) -> UnpackConfig:
    if kind == "flat":
        return UnpackConfig(flat_groups=bn, flat_warps=warps)
    return UnpackConfig(flat_groups=0, rows=bn, groups=g, warps=warps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=24)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    n, k = 18944, 3584
    ws = [(torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(args.copies)]
    ps = [glyd.pack(w, "fixed12") for w in ws]
    outs = [torch.empty_like(w) for w in ws]
    planes = [torch.cat([p.arrays["lo"].reshape(-1), p.arrays["code"].reshape(-1)]) for p in ps]
    pdst = [torch.empty_like(t) for t in planes]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "shape": [n, k], "copies": args.copies, "us": {}, "gbs": {}}
    moved = n * k * 3.5  # packed read (1.5 bytes) + bf16 write (2 bytes)

    def record(name, ms, nbytes):
        us = ms / args.copies * 1e3
        res["us"][name] = round(us, 1)
        res["gbs"][name] = round(nbytes / us / 1e3, 1)

    record("bf16 copy_ (reference)", cuda_graph_ms(lambda: [o.copy_(w) for o, w in zip(outs, ws)], 20), n * k * 4)
    record("packed planes copy_ (reference)",
           cuda_graph_ms(lambda: [d.copy_(t) for d, t in zip(pdst, planes)], 20), n * k * 3)
    for kind, bn, g, w in VARIANTS:
        name = f"{kind} bn{bn} g{g} w{w}" if kind != "flat" else f"flat {bn} groups w{w}"
        cfg = config(kind, bn, g, w)
        try:
            for i in (0, len(ps) - 1):  # bit for bit, fresh output
                outs[i].fill_(0)
                kernels.unpack(ps[i], outs[i], cfg)
                if not torch.equal(outs[i].view(torch.int16), ws[i].view(torch.int16)):
                    raise RuntimeError("not bit-exact")
            record(name, cuda_graph_ms(lambda cfg=cfg: [kernels.unpack(p, o, cfg) for p, o in zip(ps, outs)], 20),
                   moved)
        except Exception as exc:  # a variant that fails is reported, not fatal
            log.warning("%s failed: %s", name, str(exc)[:200])
    print(f"\nunpack, {n} x {k}, {args.copies} copies, one CUDA graph, median:")
    print("| variant | us a matrix | GB/s |\n|---|---|---|")
    for name, us in sorted(res["us"].items(), key=lambda kv: kv[1]):
        print(f"| {name} | {us} | {res['gbs'][name]} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "unpack_sweep.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
