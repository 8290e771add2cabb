"""Ran against commit 497582d (check that commit out to run it).
Probe of the fused KV decode-attention kernel: what each part of the page decode costs.

Times ``decode_attention_triton`` as it is and with parts of the decode taken out
(``glyd.kv._triton.PROBE``: 1 every raw exponent read as 0 without its load, 2 every value as its
tier-1 digit: no tier windows, no raw loads; those outputs are wrong and not checked), the same
loop over plain bf16 pages, and bf16 SDPA, one layer of a Qwen2.5-7B-shaped decode step (28
query heads, 4 KV heads, head dim 128, pages of 64), Gaussian keys with per-channel scales or
(``--pool``) real pages. ``--gluon`` adds the Gluon kernel (``glyd.kv._gluon``) and, for its first
variant, its probes (2 tier 1 only, 3 no window loads, 4 one escape level: tiers 2 and 3 skipped,
about 1 value in 60 sent down the raw path). Each call is captured in a CUDA graph; median of the
replays. Needs a CUDA GPU.

    PYTHONPATH=src python3 benchmarks/probe_kv.py --cases 4096x16,16384x16,16384x1
    PYTHONPATH=src python3 benchmarks/probe_kv.py --pool .carry/kv_pool.pt --gluon 32:168 --no-triton-probes
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from glyd.kv import _triton as kt
from glyd.kv.pages import PageStore
from glyd.timing import cuda_graph_ms

PAGE = 64


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="4096x16,16384x16,16384x1", help="tokens x sequences, comma-separated")
    ap.add_argument("--gluon", default="", help="also the Gluon kernel (glyd.kv._gluon): variants to time, "
                    "comma-separated, each PROGRAMS_PER_SM[:MAXNREG] (e.g. 16,32:200); the first also with tier 1 only")
    ap.add_argument("--no-triton-probes", action="store_true", help="time the Triton kernel as shipped only")
    ap.add_argument("--pool", default="", help="real pages: a pool written by `benchmarks/kv.py pool` (default: "
                    "Gaussian pages)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_kv.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    hq, h, d = 28, 4, 128
    kscale = torch.exp(torch.randn(1, h, 1, d, device=dev, generator=gen))
    pool = {n: x.to(dev) for n, x in torch.load(args.pool).items()} if args.pool else None
    rows = []
    for case in args.cases.split(","):
        t, b = (int(v) for v in case.split("x"))
        if pool is not None:  # whole real pages drawn at random (benchmarks/kv.py)
            from kv import fill

            k, v = fill(b, t, pool["k"], gen, None), fill(b, t, pool["v"], gen, None)
        else:
            k = (torch.randn(b, h, t, d, device=dev, generator=gen) * kscale).to(torch.bfloat16)
            v = torch.randn(b, h, t, d, device=dev, generator=gen).to(torch.bfloat16)
        q = torch.randn(b, hq, d, device=dev, generator=gen).to(torch.bfloat16)
        lens = torch.full((b,), t, device=dev)
        ks, vs = PageStore.from_dense(k, page=PAGE), PageStore.from_dense(v, page=PAGE)
        q4 = q[:, :, None, :]
        ref = F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)[:, :, 0].float()
        out = kt.decode_attention_triton(q, ks, vs, lens).float()
        err = float((out - ref).norm() / ref.norm())
        if not err <= 1e-2:
            raise RuntimeError(f"T={t} B={b}: the kernel's relative error {err}")
        times = {"bf16 SDPA": cuda_graph_ms(lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True), 50),
                 "same loop, bf16 pages": cuda_graph_ms(lambda: kt.decode_attention_bf16_pages(q, k, v, page=PAGE), 50)}
        probes = ((0, "fused (as shipped)"),) if args.no_triton_probes else (
            (0, "fused (as shipped)"), (1, "no raw-exponent loads"), (2, "tier 1 only"))
        for probe, name in probes:
            kt.PROBE = probe
            try:
                times[name] = cuda_graph_ms(lambda: kt.decode_attention_triton(q, ks, vs, lens), 50)
            finally:
                kt.PROBE = 0
        for i, spec in enumerate(x for x in args.gluon.split(",") if x):
            from glyd.kv._gluon import decode_attention_gluon

            pps, mr = (int(v) for v in (spec + ":0").split(":")[:2])
            kw = dict(programs_per_sm=pps, maxnreg=mr or None)
            gerr = float((decode_attention_gluon(q, ks, vs, lens, **kw).float() - ref).norm() / ref.norm())
            if not gerr <= 1e-2:
                raise RuntimeError(f"T={t} B={b}: the Gluon kernel's relative error {gerr} ({spec})")
            times[f"gluon {spec}"] = cuda_graph_ms(lambda: decode_attention_gluon(q, ks, vs, lens, **kw), 50)
            if i == 0:
                times[f"gluon {spec} tier 1 only"] = cuda_graph_ms(
                    lambda: decode_attention_gluon(q, ks, vs, lens, probe=2, **kw), 50)
                times[f"gluon {spec} no window loads"] = cuda_graph_ms(
                    lambda: decode_attention_gluon(q, ks, vs, lens, probe=3, **kw), 50)
                times[f"gluon {spec} one escape level"] = cuda_graph_ms(
                    lambda: decode_attention_gluon(q, ks, vs, lens, probe=4, **kw), 50)
        rows.append((t, b, err, (ks.nbytes + vs.nbytes) / (2 * k.numel() * 2), times))
        del k, v, ks, vs
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; us a call (ratio to SDPA)")
    names = list(rows[0][4])
    print("| tokens | seqs | cache / bf16 | rel. err | " + " | ".join(names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for t, b, err, ratio, times in rows:
        sd = times["bf16 SDPA"]
        cells = " | ".join(f"{times[n] * 1e3:.1f} ({times[n] / sd:.2f})" for n in names)
        print(f"| {t} | {b} | {ratio:.3f} | {err:.1e} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
