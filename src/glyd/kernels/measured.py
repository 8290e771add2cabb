"""Measured kernel times that ``glyd.ops.choose_layout`` reads (written by ``benchmarks/kernels.py``).

GPU name -> {"date", "m", "shapes": {"NxK": {"bf16": us, "fixed12": us, "tiered": us}}}.
Times are medians of CUDA-graph replays at M = ``m`` (the decode step).
"""

TIMES: dict = {}
