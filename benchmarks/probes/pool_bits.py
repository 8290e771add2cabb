"""The static pool's attention (``glyd.kv._triton_fixed.attention_triton``) on fixed random pages, its outputs
saved or compared bit for bit: run it on two trees (a branch and main) on the same GPU to check that a change
keeps the output bits (the interpreter's tests cannot run the GPU's code paths: inline ``prmt``, the compiled dots).

    PYTHONPATH=/path/to/main/src python3 benchmarks/probes/pool_bits.py --save $OUT/main_bits.pt
    PYTHONPATH=src python3 benchmarks/probes/pool_bits.py --against $OUT/main_bits.pt

One layer of Qwen2.5-7B's KV shape (4 KV heads, 28 query heads, head dim 128, pages of 64), 4 sequences of 4133
tokens (a partial raw page) written as a prompt and two steps, keys with per-channel scales and exception entries;
launches: the tables' variant (w4 s32 r96 swar n2) at 4 and 16 programs an SM and 1, 3 and 7 splits, with left
padding and an attention-mask row, and the byte-wise decode. Exit status 1 if any output differs. ``--tiny``: 197
tokens and 2 KV heads, for the CPU (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch


def pool_and_query(device: str, tiny: bool):
    from glyd.kv.pool import FixedPagePool

    gen = torch.Generator().manual_seed(34)
    b, h, g, d, p, t = (4, 2, 7, 128, 64, 197) if tiny else (4, 4, 7, 128, 64, 4133)
    pool = FixedPagePool(layers=1, batch=b, heads=h, head_dim=d, max_len=t + p, page=p, device=device)
    for n in (t - 2, 1, 1):
        k = (torch.randn(b, h, n, d, generator=gen) * torch.exp(torch.randn(1, h, 1, d, generator=gen)))
        k[:, :, 3::97, 5] = 1e-30  # far outside their windows: exception entries
        v = torch.randn(b, h, n, d, generator=gen)
        v[:, :, 2::131, d - 3] = -1e-33
        pool.advance(n)
        pool.write(0, k.to(torch.bfloat16).to(device), v.to(torch.bfloat16).to(device))
    q = torch.randn(b, h * g, d, generator=gen).to(torch.bfloat16).to(device)
    valid = torch.rand(b, t, generator=gen) > 0.1
    starts = torch.tensor([0, 3, 70, min(1000, t - 1)], dtype=torch.int32)
    return pool, q, valid.to(device), starts.to(device)


def outputs(device: str, tiny: bool) -> dict[str, torch.Tensor]:
    from glyd.kv._triton_fixed import attention_triton

    pool, q, valid, starts = pool_and_query(device, tiny)
    table = dict(num_warps=4, sub_tile=32, maxnreg=96, swar=True, num_stages=2)
    runs = {f"pps{n}": dict(table, programs_per_sm=n) for n in (4, 16)}
    runs.update({f"splits{n}": dict(table, num_splits=n) for n in (1, 3, 7)})
    runs["starts+valid"] = dict(table, programs_per_sm=4, starts=starts, valid=valid)
    runs["byte"] = dict(num_warps=4, sub_tile=32, maxnreg=128, programs_per_sm=16)
    out = {}
    for name, kw in runs.items():
        kw = dict(kw)
        st = kw.pop("starts", None)
        out[name] = attention_triton(q, pool.lens, st, pool.block_index, pool.k.layer(0), pool.v.layer(0),
                                     1 / math.sqrt(q.shape[-1]), **kw).cpu()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", help="write the outputs here")
    ap.add_argument("--against", help="compare with outputs saved by --save")
    ap.add_argument("--tiny", action="store_true", help="197 tokens, 2 KV heads: a check on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    import glyd

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = outputs(device, args.tiny)
    print(f"glyd from {glyd.__file__}, {device}: {len(out)} launches")
    if args.save:
        torch.save(out, args.save)
    bad = 0
    if args.against:
        ref = torch.load(args.against)
        for name, o in out.items():
            same = name in ref and torch.equal(o.view(torch.int16), ref[name].view(torch.int16))
            diff = "" if same else f" ({(o.float() - ref[name].float()).abs().max().item():.3g} max difference)"
            print(f"{name}: {'same bits' if same else 'DIFFERENT'}{diff}")
            bad += not same
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
