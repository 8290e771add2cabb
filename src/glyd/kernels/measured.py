"""Measured kernel times that ``glyd.ops.choose_layout`` reads (written by ``benchmarks/kernels.py``).

GPU name -> {"date", "m", "shapes": {"NxK": {"bf16": us, "fixed12": us, "tiered": us}}}.
Times are medians of CUDA-graph replays at M = ``m`` (the decode step).
"""

# benchmarks/kernels.py run 13, 2026-11-30, H200 (torch 2.11, triton 3.6); see benchmarks/RESULTS.md.
TIMES: dict = {
    "NVIDIA H200": {
        "date": "2026-11-30",
        "m": 1,
        "shapes": {
            "3584x3584": {
                "bf16": 11.51,
                "fixed12": 15.19,
                "tiered": 74.51
            },
            "512x3584": {
                "bf16": 7.59,
                "fixed12": 12.7,
                "tiered": 33.86
            },
            "18944x3584": {
                "bf16": 36.35,
                "fixed12": 38.62,
                "tiered": 319.97
            },
            "3584x18944": {
                "bf16": 38.38,
                "fixed12": 48.99,
                "tiered": 385.35
            },
            "152064x3584": {
                "bf16": 260.35,
                "fixed12": 246.56,
                "tiered": 2515.25
            }
        }
    }
}
