"""Measured kernel times that ``glyd.ops.choose_layout`` reads (written by ``benchmarks/kernels.py``).

GPU name -> {"date", "m", "shapes": {"NxK": {"bf16": us, "fixed12": us, "tiered": us}}}.
Times are medians of CUDA-graph replays at M = ``m`` (the decode step).
"""

# benchmarks/kernels.py, 2026-11-30, H200 (torch 2.11, triton 3.6); see benchmarks/RESULTS.md.
TIMES: dict = {
    "NVIDIA H200": {
        "date": "2026-11-30",
        "m": 1,
        "shapes": {
            "3584x3584": {
                "bf16": 11.62,
                "fixed12": 22.76,
                "tiered": 373.66
            },
            "512x3584": {
                "bf16": 7.59,
                "fixed12": 18.84,
                "tiered": 188.27
            },
            "18944x3584": {
                "bf16": 36.24,
                "fixed12": 79.98,
                "tiered": 1676.07
            },
            "3584x18944": {
                "bf16": 37.97,
                "fixed12": 88.44,
                "tiered": 1955.77
            },
            "152064x3584": {
                "bf16": 250.75,
                "fixed12": 422.78,
                "tiered": 13476.53
            }
        }
    }
}
