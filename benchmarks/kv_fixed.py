"""The fixed-rate KV page code (``kvf12``): candidates and bytes against bf16, on the CPU.

    python benchmarks/kv_fixed.py [--keep /tmp/kv_real.pt]

Captures real SmolLM2-135M keys and values on tinyshakespeare exactly as ``benchmarks/kv.py sizes``
does (1K, 4K, and "16K" = four consecutive 4K windows concatenated), plus the Qwen2.5-7B-shaped
cache built from them (``kv.qwen_shaped``) and a Gaussian one. Then:

1. candidates: 4-bit codes (sign + 3-bit offset of ``exponent >> 1``) with raw low bytes, the
   window start shared by a whole block (page x head), by 16 channels, by 8, or per channel; bytes
   count the 12 bits a value, one window byte a group, 8 bytes of meta a block and 4 bytes an
   exception; plus the share of values that are exceptions and of blocks with any.
2. the shipped code: every layer packed by ``glyd.kv.fixed.FixedPageStore`` (each page read back
   and compared bit for bit), beside the ``kvtiered`` code (``glyd.kv.pages.PageStore``), bytes as the
   stores count them (``nbytes``: planes, exceptions or tails, raw tokens).

``--keep PATH`` saves the captured tensors (and reuses them when the file exists).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kv  # noqa: E402  (benchmarks/kv.py: the capture and the Qwen-shaped cache)

from glyd.kv.fixed import FixedPageStore  # noqa: E402
from glyd.kv.pages import PageStore  # noqa: E402

PAGE = 64


def capture(keep: str | None):
    if keep and Path(keep).exists():
        d = torch.load(keep)
        return d["w1k"], d["w4k"]
    w1k = kv.smollm2_windows([1024])[0]
    w4k = kv.smollm2_windows([4096] * 4)
    if keep:
        torch.save({"w1k": w1k, "w4k": w4k}, keep)
    return w1k, w4k


def _hi7(x: torch.Tensor) -> torch.Tensor:
    return (x.contiguous().view(torch.int16).to(torch.int32) >> 8) & 0x7F


def _outside_best_window(g: torch.Tensor) -> torch.Tensor:
    """Per row of ``g [G, n]`` (values of exponent>>1): how many fall outside its best 8-wide window."""
    hist = torch.zeros(g.shape[0], 128)
    hist.scatter_add_(1, g.long(), torch.ones(g.shape))
    return g.shape[1] - hist.unfold(1, 8, 1).sum(-1).amax(1)


def candidates(x: torch.Tensor) -> dict[str, tuple[float, float, float]]:
    """x [L, H, T, D] -> {window group: (bytes / bf16, exceptions / values, blocks with any)}."""
    l_, h, t, d = x.shape
    n = t // PAGE
    vals = l_ * h * n * PAGE * d
    shapes = {
        "block (page x head)": lambda e: e.reshape(-1, PAGE * d),
        "16 channels": lambda e: e.reshape(h, n, PAGE, d // 16, 16).permute(0, 1, 3, 2, 4).reshape(-1, PAGE * 16),
        "8 channels": lambda e: e.reshape(h, n, PAGE, d // 8, 8).permute(0, 1, 3, 2, 4).reshape(-1, PAGE * 8),
        "1 channel": lambda e: e.permute(0, 1, 3, 2).reshape(-1, PAGE),
    }
    out = {}
    for name, grp in shapes.items():
        exc = groups = 0.0
        blocks_any = 0
        for layer in x:
            e = _hi7(layer[:, : n * PAGE]).reshape(h, n, PAGE, d)
            o = _outside_best_window(grp(e))
            exc += float(o.sum())
            groups += o.numel()
            blocks_any += int((o.reshape(h * n, -1).sum(1) > 0).sum())
        nbytes = 1.5 * vals + groups + 8 * l_ * h * n + 4 * exc
        out[name] = (nbytes / (2 * vals), exc / vals, blocks_any / (l_ * h * n))
    return out


def stored(x: torch.Tensor, cls) -> int:
    """Pack ``x [L, H, T, D]`` layer by layer as GlydCache does; bytes held (every page checked)."""
    total = 0
    for layer in x:
        st = cls(1, layer.shape[0], layer.shape[2], page=PAGE)
        st.append(layer[None])
        if not kv.bits_equal(st.to_bf16()[0], layer):
            raise SystemExit(f"{cls.__name__} round trip failed")
        total += st.nbytes
    return total


def caches(w1k, w4k):
    cat16 = tuple(torch.cat([w[i] for w in w4k], dim=2) for i in range(2))
    src = {"1K": w1k, "4K": w4k[0], "16K": cat16}
    for label, (k, v) in src.items():
        yield "SmolLM2-135M real K/V (30 x 3 x 64)", label, k, v
    for t, label in ((1024, "1K"), (4096, "4K"), (16384, "16K")):
        k, v = src[label]
        yield "Qwen2.5-7B-shaped, SmolLM2 values (28 x 4 x 128)", label, kv.qwen_shaped(k, t), kv.qwen_shaped(v, t)
    gen = torch.Generator().manual_seed(0)
    for t, label in ((1024, "1K"), (4096, "4K"), (16384, "16K")):
        shape = (kv.QWEN["layers"], kv.QWEN["kv_heads"], t, kv.QWEN["head_dim"])
        scale = torch.exp(torch.randn(kv.QWEN["kv_heads"], 1, kv.QWEN["head_dim"], generator=gen))
        k = (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16)
        v = torch.randn(shape, generator=gen).to(torch.bfloat16)
        yield "Qwen2.5-7B-shaped, Gaussian (not real statistics)", label, k, v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", default=None, help="save (or reuse) the captured SmolLM2 keys and values here")
    ap.add_argument("--skip-candidates", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    w1k, w4k = capture(args.keep)
    print(f"# {platform.node()} python {platform.python_version()} torch {torch.__version__}; page {PAGE}")
    if not args.skip_candidates:
        print("\n## Candidates: 12 bits a value + window bytes + 8 B meta a block + 4 B an exception\n")
        print("| cache | tokens | keys or values | window shared by | bytes / bf16 | exceptions | blocks with any |")
        print("|---|---|---|---|---|---|---|")
        for name, label, k, v in caches(w1k, w4k):
            if "Gaussian" in name and label != "16K":
                continue
            for kind, x in (("keys", k), ("values", v)):
                for grp, (ratio, exc, anyb) in candidates(x).items():
                    print(f"| {name} | {label} | {kind} | {grp} | {ratio:.4f} | {100 * exc:.4f}% | {100 * anyb:.1f}% |",
                          flush=True)
    print("\n## Stored by the caches' page stores (every page read back bit for bit)\n")
    print("| cache | tokens | bf16 MB | kvf12 keys / bf16 | kvf12 values / bf16 | kvf12 total / bf16 | kvtiered total / bf16 |")
    print("|---|---|---|---|---|---|---|")
    for name, label, k, v in caches(w1k, w4k):
        fk, fv = stored(k, FixedPageStore), stored(v, FixedPageStore)
        dk, dv = stored(k, PageStore), stored(v, PageStore)
        b = 2 * (k.numel() + v.numel())
        print(f"| {name} | {label} | {b / 1e6:.1f} | {fk / (b / 2):.4f} | {fv / (b / 2):.4f} | {(fk + fv) / b:.4f} | "
              f"{(dk + dv) / b:.4f} |", flush=True)
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
