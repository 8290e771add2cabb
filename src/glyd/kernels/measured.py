"""Measured kernel times that ``glyd.ops.choose_layout`` reads (written by ``benchmarks/kernels.py``).

GPU name -> {"date", "m", "shapes": {"NxK": {"bf16": us, "fixed12": us, "tiered": us}}}.
Times are medians of CUDA-graph replays at M = ``m`` (the decode step).
"""

# benchmarks/kernels.py run 17, 2026-11-30, H200 (torch 2.11, triton 3.6); see
# benchmarks/history/2026-11-30-kernels-h200.md, run 17.
TIMES: dict = {
    "NVIDIA H200": {
        "date": "2026-11-30",
        "m": 1,
        "shapes": {
            "3584x3584": {
                "bf16": 11.37,
                "fixed12": 12.26,
                "tiered": 74.9
            },
            "512x3584": {
                "bf16": 7.59,
                "fixed12": 9.05,
                "tiered": 34.08
            },
            "18944x3584": {
                "bf16": 36.31,
                "fixed12": 30.45,
                "tiered": 321.84
            },
            "3584x18944": {
                "bf16": 38.5,
                "fixed12": 38.92,
                "tiered": 387.12
            },
            "152064x3584": {
                "bf16": 253.06,
                "fixed12": 205.6,
                "tiered": 2526.9
            }
        }
    }
}
