"""Tiered kernels on a Qwen2.5-7B-shaped decode step (issue 3), against bf16 F.linear in the same run.

Every linear of 28 layers (q, k, v, o, gate, up, down; unmerged) plus the 152064 x 3584 lm_head, one
CUDA graph a step, median of its replays (glyd.timing). ``--distinct`` layers get their own random
weights (std 0.02) and the step cycles through them: 4 distinct layers hold ~1.2 GB of tiered weights
between two uses of one matrix, far more than the 50 MB L2, so no matrix is read from L2. It checks
first (fresh random inputs): GPU unpack bit-exact against the weights, every fused variant against
float64 F.linear (relative Frobenius error < 5e-3, as benchmarks/kernels.py), then times and prints
a table last.

    PYTHONPATH=src python3 benchmarks/tiered_step.py [--out DIR] [--distinct 4] [--quick]

Variants are ``glyd.kernels.TieredGemvConfig`` (the fused GEMV) and ``TieredLongConfig`` (unpack +
cuBLAS); "fused default" is the registry's choice. The variants of removed code (``FAST_DEEP``,
``SPARSE_DEEP``, the stage timings with tiers cut off) are in this script's 497582d version.
Without a CUDA GPU it is a smoke run under ``TRITON_INTERPRET=1`` on tiny shapes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch
import torch.nn.functional as F

import glyd
from glyd import kernels
from glyd.kernels import TieredGemvConfig, TieredLongConfig, TieredUnpackConfig
from glyd.kernels.tiered.unpack import AREA_REG_BYTES
from glyd.timing import cuda_graph_ms

log = logging.getLogger("tiered_step")

H, I, KV, VOCAB, LAYERS = 3584, 18944, 512, 152064, 28
if not torch.cuda.is_available():  # smoke run of this script on the CPU (TRITON_INTERPRET=1), tiny shapes
    H, I, KV, VOCAB, LAYERS = 1024, 1024, 16, 16, 1
SHAPES = [("q", H, H), ("k", KV, H), ("v", KV, H), ("o", H, H), ("gate", I, H), ("up", I, H), ("down", H, I)]
if DEV_SMOKE := not torch.cuda.is_available():
    SHAPES = [("k", KV, H), ("down", KV, I)]
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def timer(fn, replays):
    if DEV == "cuda":
        return cuda_graph_ms(fn, replays)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def cfg(bn=4, bb=1, warps=1, mb=16, long=False):
    return TieredLongConfig() if long else TieredGemvConfig(bn=bn, bb=bb, mb=mb, warps=warps)


def variants(m: int, quick: bool):
    """name -> config (None: the registry's choice)."""
    v = {"fused default": None, "unpack+cuBLAS": cfg(long=True)}
    if quick:
        return v
    if m == 1:
        v["fused bn2 w1"] = cfg(2, 1, 1)
        for bn in (2, 4, 8):
            v[f"fused bn{bn} w2"] = cfg(bn, 1, 2)
    else:
        v["fused bn4 w2"] = cfg(4, 1, 2)
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--distinct", type=int, default=4)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds after which only defaults are timed")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    import triton

    torch.manual_seed(0)
    t0 = time.time()
    mats = {}
    for name, n, k in SHAPES + [("lm_head", VOCAB, H)]:
        mats[name] = []
        for _ in range(1 if name == "lm_head" else args.distinct):
            w = (torch.randn(n, k, device=DEV) * 0.02).to(torch.bfloat16)
            mats[name].append((w, glyd.pack(w, "tiered")))
    if DEV == "cuda":
        torch.cuda.synchronize()
    log.info("packed in %.1f s", time.time() - t0)
    order = [(name, (layer % args.distinct)) for layer in range(args.layers) for name, _, _ in SHAPES]
    order.append(("lm_head", 0))
    wbytes = sum(mats[nm][i][0].numel() * 2 for nm, i in order)
    tbytes = sum(mats[nm][i][1].nbytes for nm, i in order)
    log.info("step: bf16 %.2f GB, tiered %.2f GB (%.2f bits)", wbytes / 1e9, tbytes / 1e9, 16 * tbytes / wbytes)

    ms = [int(v) for v in args.ms.split(",")]
    fails = []
    # correctness: unpack bit-exact on the first copy of every shape; every variant at every M
    for name, reps in mats.items():
        w, p = reps[0]
        if not torch.equal(kernels.unpack(p).view(torch.int16), w.view(torch.int16)):
            fails.append(f"unpack {name} not bit-exact")
        for bb, warps, reg in ((1, 1, AREA_REG_BYTES), (1, 1, 0), (1, 2, AREA_REG_BYTES)):
            ucfg = TieredUnpackConfig(blocks=bb, warps=warps, area_reg_bytes=reg)
            if not torch.equal(kernels.unpack(p, None, ucfg).view(torch.int16), w.view(torch.int16)):
                fails.append(f"unpack bb{bb} w{warps} area_reg_bytes={reg} {name} not bit-exact")
    for m in ms:
        for vname, c in variants(m, args.quick).items():
            for name in [nm for nm in ("q", "k", "down", "lm_head") if nm in mats]:
                w, p = mats[name][0]
                x = torch.randn(m, w.shape[1], device=DEV).to(torch.bfloat16)
                # a bias only on the default (each HAS_BIAS value is one more compile)
                b = torch.randn(w.shape[0], device=DEV).to(torch.bfloat16) if c is None and m == 1 else None
                ref = F.linear(x.double(), w.double(), None if b is None else b.double())
                y = kernels.linear(x, p, b, c)
                err = ((y.double() - ref).norm() / ref.norm()).item()
                if not err < 5e-3 or not torch.isfinite(y).all():
                    fails.append(f"{vname} {name} M={m}: rel err {err:.3g}")
    if DEV == "cuda":
        torch.cuda.synchronize()
    log.info("checks done: %d failures", len(fails))

    res = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter smoke run)", "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M"), "bytes": {"bf16": wbytes, "tiered": tbytes}, "rows": {}}
    # unpack of the whole step (every matrix), per (blocks, warps)
    for bb, warps, reg in ((1, 1, AREA_REG_BYTES), (1, 1, 0), (1, 2, AREA_REG_BYTES)):
        def run(ucfg=TieredUnpackConfig(blocks=bb, warps=warps, area_reg_bytes=reg)):
            for nm, i in order:
                kernels.unpack(mats[nm][i][1], None, ucfg)
        key = f"bb{bb} w{warps}" + ("" if reg else " memory-windows")
        res.setdefault("unpack_step_ms", {})[key] = timer(run, 20)
        log.info("unpack step %s: %.3f ms", key, res["unpack_step_ms"][key])
    for m in ms:
        xs = {k: torch.randn(m, k, device=DEV).to(torch.bfloat16) for k in (H, I)}

        def bf16():
            for nm, i in order:
                w = mats[nm][i][0]
                F.linear(xs[w.shape[1]], w)

        row = {"bf16": timer(bf16, 30)}
        for vname, c in variants(m, args.quick or time.time() - t0 > args.budget).items():
            def run(c=c):
                for nm, i in order:
                    p = mats[nm][i][1]
                    kernels.linear(xs[p.shape[1]], p, None, c)
            try:
                row[vname] = timer(run, 20)
            except Exception as exc:  # a variant that fails is reported, not fatal
                log.warning("%s M=%d failed: %s", vname, m, exc)
                row[vname] = None
        res["rows"][m] = row
        log.info("M=%d %s", m, {k: (round(v, 3) if v else v) for k, v in row.items()})
        with open(os.path.join(args.out, "tiered_step.json"), "w") as f:
            json.dump(res, f, indent=1)
    res["failures"] = fails
    with open(os.path.join(args.out, "tiered_step.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("\nFAILURES:\n" + "\n".join(fails) if fails else "\nall correctness checks passed")
    print(f"{res['device']}  torch {res['torch']}  triton {res['triton']}  {res['date']}")
    print(f"step bytes: bf16 {wbytes / 1e9:.2f} GB, tiered {tbytes / 1e9:.2f} GB; unpack step ms: "
          + ", ".join(f"{k} {v:.2f}" for k, v in res["unpack_step_ms"].items()))
    print("| M | bf16 ms | variant | ms | ratio to bf16 |")
    print("|---|---|---|---|---|")
    for m, row in res["rows"].items():
        for k, v in row.items():
            if k != "bf16":
                print(f"| {m} | {row['bf16']:.3f} | {k} | {v:.3f} | {v / row['bf16']:.2f} |" if v else f"| {m} | | {k} | failed | |")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
