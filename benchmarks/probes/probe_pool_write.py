"""Issue 34/38: the static pool's write, keys and values as two launches (``write_triton`` a side) against one
(``write_pair_triton``), in a CUDA graph, at a decode step (one token: a raw row, and the row that fills a page)
and a prompt (512 and 2048 tokens from position 0), for the KV shapes of Qwen2.5-0.5B (2 heads x 64) and 7B
(4 x 128) at 1 and 16 sequences; ``--warps`` times the kernels at other warp counts. Every variant's pages are
compared byte for byte with the two-launch write's first (the arenas' order of blocks may differ: counts and
decoded values are compared). ``--tiny`` runs the checks on the CPU (interpreter), timing nothing.

    PYTHONPATH=src python3 benchmarks/probes/probe_pool_write.py --out $OUT/pool_write
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probes/probe_pool_write.py --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kv import cuda_graph_time  # noqa: E402

from glyd.kv._triton_pool import write_pair_triton, write_triton  # noqa: E402
from glyd.kv.pool import FixedPagePool  # noqa: E402

SHAPES = {"0.5b": (2, 64), "7b": (4, 128)}
PAGE = 64


def planes(pool, side):
    s = getattr(pool, side)
    lo, code, base, meta, exc, raw = s.layer(0)
    return lo, code, base, meta, exc, s.used[0], raw


def fresh(batch, heads, d, context, dev, lens):
    pool = FixedPagePool(1, batch, heads, d, context, page=PAGE, device=dev)
    pool.lens.fill_(lens)
    return pool


def run(pool, k, v, variant, warps):
    kp, vp = planes(pool, "k"), planes(pool, "v")
    if variant == "two":
        write_triton(k, pool.lens, pool.block_index, *kp, num_warps=warps)
        write_triton(v, pool.lens, pool.block_index, *vp, num_warps=warps)
    else:
        write_pair_triton(k, v, pool.lens, pool.block_index, kp, vp, num_warps=warps)


def same(a, b, n):
    blk = a.block_index[:, :, : n // PAGE].reshape(-1).long()
    for side in ("k", "v"):
        pa, pb = getattr(a, side), getattr(b, side)
        for i in range(3):
            if not torch.equal(pa.layer(0)[i][blk], pb.layer(0)[i][blk]):
                return False
        if not torch.equal(pa.meta[0][blk][:, 1], pb.meta[0][blk][:, 1]) or int(pa.used[0]) != int(pb.used[0]):
            return False
        r = n % PAGE
        if not torch.equal(pa.raw[0][:, :, :r].view(torch.int16), pb.raw[0][:, :, :r].view(torch.int16)):
            return False
    return True


def cases(tiny):
    if tiny:
        return [("7b", 1, "step raw", 1, 2 * PAGE + 1), ("0.5b", 2, "step pack", 1, 2 * PAGE), ("0.5b", 1, "prompt", 130, 130)]
    out = []
    for shape in SHAPES:
        for batch in (1, 16):
            out += [(shape, batch, "step raw", 1, 4097), (shape, batch, "step pack", 1, 4096)]
            out += [(shape, batch, "prompt", t, t) for t in (512, 2048)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--warps", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    if dev == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("no GPU: run with TRITON_INTERPRET=1 and --tiny", file=sys.stderr)
        return 2
    gen = torch.Generator(device=dev).manual_seed(0)
    rows, ok = [], True
    for shape, batch, what, t, lens in cases(args.tiny):
        heads, d = SHAPES[shape]
        k = torch.randn(batch, heads, t, d, device=dev, generator=gen).to(torch.bfloat16)
        v = torch.randn(batch, heads, t, d, device=dev, generator=gen).to(torch.bfloat16)
        k[:, :, ::17, 3] = 1e-30  # exceptions
        context = lens + PAGE
        ref = fresh(batch, heads, d, context, dev, lens)
        if what != "prompt":  # the step's page already holds its earlier rows in raw
            for side in ("k", "v"):
                getattr(ref, side).raw[0].copy_(torch.randn_like(getattr(ref, side).raw[0], dtype=torch.float32).to(
                    torch.bfloat16))
        base = {side: getattr(ref, side).raw[0].clone() for side in ("k", "v")}
        run(ref, k, v, "two", 4)
        row = {"shape": shape, "batch": batch, "what": what, "tokens": t}
        for variant in ("two", "pair"):
            for w in args.warps:
                pool = fresh(batch, heads, d, context, dev, lens)
                for side in ("k", "v"):
                    getattr(pool, side).raw[0].copy_(base[side])
                run(pool, k, v, variant, w)
                good = same(ref, pool, lens)
                ok &= good
                # replays write the same pages again (the arena fills: later exceptions are counted, not stored)
                us = cuda_graph_time(lambda: run(pool, k, v, variant, w)) if dev == "cuda" else float("nan")  # noqa: B023
                row[f"{variant} w{w}"] = us
                row[f"{variant} w{w} ok"] = good
        rows.append(row)
    keys = [f"{v} w{w}" for v in ("two", "pair") for w in args.warps]
    lines = ["| shape | seqs | write | tokens | " + " | ".join(f"{k} us" for k in keys) + " | pair w4 / two w4 |",
             "|---|---|---|---|" + "---|" * (len(keys) + 1)]
    for r in rows:
        ratio = r["pair w4"] / r["two w4"] if r["two w4"] == r["two w4"] else float("nan")
        lines.append(f"| {r['shape']} | {r['batch']} | {r['what']} | {r['tokens']} | "
                     + " | ".join(f"{r[k]:.1f}{'' if r[k + ' ok'] else ' (WRONG)'}" for k in keys) + f" | {ratio:.2f} |")
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)"
    print(f"{name}; torch {torch.__version__}; CUDA graph, median of 50 replays; pages of {PAGE}")
    print("\n".join(lines))
    print("all pages equal to the two-launch write's" if ok else "SOME PAGES DIFFER")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "pool_write.json").write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
