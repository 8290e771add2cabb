"""Run by test_kv_attention under TRITON_INTERPRET=1 (Triton reads it when the kernels are defined)."""

from __future__ import annotations

import sys

import torch

from glyd.kv import PageStore, decode_attention, decode_attention_reference
from glyd.kv._triton import decode_attention_triton


def kv_like(gen, b, h, t, d):
    # Per-channel scales and a few outlier channels, as real keys have: every tier gets used.
    scale = torch.exp(torch.randn(h, d, generator=gen) * 1.5)
    x = torch.randn(b, h, t, d, generator=gen) * scale[None, :, None, :]
    x[..., 0] += 8.0
    return x.to(torch.bfloat16)


def main(every_variant: bool = False) -> int:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    # (B, H, G, D, page, lens)
    cases = [
        (1, 1, 1, 16, 16, [1]),
        (1, 1, 2, 16, 64, [200]),
        (2, 2, 3, 32, 16, [50, 16]),
        (3, 1, 4, 16, 32, [33, 64, 100]),
        (2, 2, 1, 64, 16, [47, 5]),
    ]
    variants = ((None, 32), (1, 16), (3, 32), (2, 64))  # (num_splits, sub_tile)
    for i, (b, h, g, d, p, lens) in enumerate(cases):
        t = max(lens)
        k, v = kv_like(gen, b, h, t, d), kv_like(gen, b, h, t, d)
        q = torch.randn(b, h * g, d, generator=gen).to(torch.bfloat16)
        lens_t = torch.tensor(lens)
        ks, vs = PageStore.from_bf16(k, lens_t, page=p), PageStore.from_bf16(v, lens_t, page=p)
        ref = decode_attention_reference(q, ks, vs, upcast=True).float()
        # one variant a case, in turn, so that every variant meets a shape (the interpreter is slow:
        # two a case took over a minute of CI); every_variant (the slow test): all four on every case
        for splits, ts in variants if every_variant else (variants[(i + 2) % 4],):
            out = decode_attention_triton(q, ks, vs, lens_t, num_splits=splits, sub_tile=ts).float()
            if not torch.isfinite(out).all():
                print("non-finite output", (b, h, g, d, p, lens, splits, ts))
                return 1
            rel = float((out - ref).norm() / ref.norm())
            worst = max(worst, rel)
            if rel > 1e-2:
                print("too far", (b, h, g, d, p, lens, splits, ts), rel)
                return 1
    # A uniform store (as GlydCache holds): all sequences of one length, raw tail included.
    k, v = kv_like(gen, 2, 2, 40, 16), kv_like(gen, 2, 2, 40, 16)
    ks, vs = PageStore(2, 2, 16, page=16), PageStore(2, 2, 16, page=16)
    ks.append(k), vs.append(v)
    q = torch.randn(2, 4, 16, generator=gen).to(torch.bfloat16)
    ref = decode_attention_reference(q, ks, vs, upcast=True).float()
    rel = float((decode_attention(q, ks, vs, backend="triton").float() - ref).norm() / ref.norm())
    worst = max(worst, rel)
    if rel > 1e-2:
        print("uniform store too far", rel)
        return 1
    # Left padding: tokens before starts[b] are masked (what the fused generate path passes).
    starts = torch.tensor([0, 21])
    ref = decode_attention_reference(q, ks, vs, upcast=True, starts=starts).float()
    for splits in (None, 1):
        out = decode_attention_triton(q, ks, vs, torch.tensor([40, 40]), num_splits=splits, starts=starts).float()
        rel = float((out - ref).norm() / ref.norm())
        worst = max(worst, rel)
        if not rel <= 1e-2:
            print("starts too far", splits, rel)
            return 1
    print(f"OK worst relative error {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] == ["every-variant"]))
