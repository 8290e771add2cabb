#!/usr/bin/env python3
"""Which kernel a GPU's table chooses for a model's merged linears at prefill M (CPU only, no GPU).

For each Qwen2.5 size (``glyd.apps.fit_configs``): the merged shapes a layer runs (q|k|v, o,
gate|up, down; lm_head at M = 1, since a prefill keeps the last position's logits only), their
shape class (``registry.shape_class``) and the family and config the table's first candidate that
can run gives (``registry.choose_uncached`` on a described H200: Gluon, wgmma and TMA present), and
the bytes an unpack + cuBLAS product moves beyond bf16's (the unpack reads 12 bits and writes 16
bits a weight, which cuBLAS then reads as bf16 reads its weights).

    PYTHONPATH=src python3 benchmarks/probes/table_choice.py --sizes qwen2.5-0.5b,qwen2.5-7b,qwen2.5-32b
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from glyd.apps.fit import load_config  # noqa: E402
from glyd.kernels import registry  # noqa: E402

H200 = registry.Device("cuda", "NVIDIA H200", (9, 0), 132, False, frozenset({"gluon", "wgmma", "tma"}))


def merged_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(N, K) of a layer's merged products and the lm_head."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    return {"qkv": ((heads + 2 * kv) * d, h), "o": (h, heads * d), "gate_up": (2 * inter, h), "down": (h, inter),
            "lm_head": (cfg["vocab_size"], h)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="qwen2.5-0.5b,qwen2.5-7b,qwen2.5-32b")
    ap.add_argument("--ms", default="512,2048")
    ap.add_argument("--layout", default="fixed12")
    a = ap.parse_args()
    print(f"{'size':14s} {'product':8s} {'N x K':>13s} {'class':9s} {'M':>5s}  kernel, config")
    for size in a.sizes.split(","):
        cfg = load_config(size)
        layers = cfg["num_hidden_layers"]
        extra = 0.0
        for name, (n, k) in merged_shapes(cfg).items():
            for m in ([1] if name == "lm_head" else [int(v) for v in a.ms.split(",")]):
                kc, conf = registry.choose_uncached(registry.Problem(a.layout, m, n, k, -(-k // 64) * 64), H200)
                print(f"{size:14s} {name:8s} {f'{n}x{k}':>13s} {registry.shape_class(n, k):9s} {m:5d}  {kc.name}, "
                      f"{registry.config_dict(conf)}")
            if name != "lm_head":
                extra += layers * n * k * 3.5  # unpack: read 1.5, write 2 bytes a weight (cuBLAS reads as bf16)
        print(f"{size:14s} unpack bytes a prefill beyond bf16's: {extra / 1e9:.1f} GB "
              f"({extra / 3.5e12 * 1e3:.1f} ms at 3.5 TB/s), independent of M")
    return 0


if __name__ == "__main__":
    sys.exit(main())
