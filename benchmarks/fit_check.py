#!/usr/bin/env python3
"""``glyd fit`` against what the H200 held: the largest contexts ``benchmarks/scale.py`` measured there.

The measured rows are those of the H200 run of 2026-12-03 (``scale.py --sizes ...``: the largest
static-cache context at one sequence that still ran a decode step, with each variant's measured
weight bytes); for each, fit's largest context for the same weights on the same card (``--gpu h200``,
no max_position cap) and the memory the run left beside weights, KV cache and a decode step's repeated
keys and values (what fit's reserve stands for). Runs on the CPU in a minute (meta-device models).

    python benchmarks/fit_check.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from glyd.apps import fit  # noqa: E402
from glyd.apps.fit_gpus import parse_gpu  # noqa: E402

GiB = 2**30
#: (model, variant, weights GiB as measured, largest context as measured) on the H200, 2026-12-03.
MEASURED = [
    ("qwen2.5-0.5b", "bf16", 0.92, 8868608), ("qwen2.5-0.5b", "fixed12", 0.69, 8862144),
    ("qwen2.5-0.5b", "tiered", 0.61, 8868608), ("qwen2.5-7b", "bf16", 14.19, 1789952),
    ("qwen2.5-7b", "fixed12", 10.64, 1792000), ("qwen2.5-7b", "tiered", 9.45, 1840640),
    ("qwen2.5-32b", "bf16", 61.03, 274816), ("qwen2.5-32b", "fixed12", 45.78, 336384),
    ("qwen2.5-32b", "tiered", 40.68, 349632), ("llama-3.1-70b", "fixed12", 98.59, 101888),
    ("llama-3.1-70b", "tiered", 87.59, 138496),
]


def main() -> int:
    gpu = parse_gpu("h200").bytes
    shapes: dict[str, fit.ModelShape] = {}
    print("| model | variant | measured context | fit's | fit / measured | left beside weights, KV, repeat (GiB) |")
    print("|---|---|---|---|---|---|")
    for name, variant, w_gib, measured in MEASURED:
        shape = shapes.get(name) or shapes.setdefault(name, fit.model_shape(fit.load_config(name)))
        uncapped = dataclasses.replace(shape, max_positions=None)
        w = int(w_gib * GiB)
        e = fit.estimate(uncapped, gpu_bytes=gpu, context=512)
        predicted = fit.max_context(e, uncapped, w)
        left = gpu - w - fit.kv_cache_bytes(shape, measured) - fit.attention_temporaries(shape, measured)
        print(f"| {name} | {variant} | {measured:,} | {predicted:,} | {predicted / measured:.3f} | {left / GiB:.2f} |")
    e = fit.estimate(shapes["llama-3.1-70b"], gpu_bytes=gpu, context=4096)
    print(f"\nllama-3.1-70b bf16 on the H200: weights {e.weights_bf16 / GiB:.2f} GiB; largest context "
          f"{fit.max_context(e, shapes['llama-3.1-70b'], e.weights_bf16):,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
