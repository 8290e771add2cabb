"""The decode kernel compiled ahead of time for sm_90 (no GPU needed), as the launcher compiles it.

* Its bf16 tensor-core dots reduce over at least ``4 * kWidth`` values. Triton 3.6 gives a 16-bit
  mma-v2 dot operands with ``kWidth = 8`` when they come through shared memory, and with ``K = 16``
  the lowered code repeats some k slots and never reads others: the scores at head dim 16 (and the
  value product at 16-token sub-tiles) were wrong on the H200 (0.58 relative error on fresh pages,
  0.14 on the fused generate test, 2026-11-30). The launcher takes the scores in exact fp32 below
  head dim 32 and refuses sub-tiles under 32 tokens on the GPU.
* Its prefix sums never run over a layout that replicates the summed axis (``kernel_warps``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def compiled(*shapes: str) -> str:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="0")
    here = Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, str(here / "_layout_check.py"), *shapes], env=env, capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0 and "GPUTarget" not in r.stderr and "ptxas" in r.stderr:
        pytest.skip("no sm_90 compiler tools in this triton build")
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def check_dots(out: str, dims: set[int]) -> None:
    dots = re.findall(r"DOT d=(\d+) page=\d+ sub_tile=\d+ M=\d+ K=(\d+) kWidth=(\d+)", out)
    assert {int(d) for d, *_ in dots} == dims
    for d, k, kw in dots:
        assert int(k) >= 4 * int(kw), (d, k, kw)


def test_head_dim_16_page_32_dots():
    # The shape of the fused generate test on the GPU (tiny Llama, head dim 16, pages of 32 tokens).
    out = compiled("16,2,32")
    check_dots(out, {16})
    assert re.search(r"DOTS d=16 page=32 sub_tile=32 fp32=[1-9]", out)  # the scores: exact fp32


@pytest.mark.slow
def test_dots_and_scans_every_head_dim():
    out = compiled("16,2", "32,2,32", "64,3", "128,7")
    check_dots(out, {16, 32, 64, 128})
    scans = re.findall(r"SCAN d=(\d+) axis=(\d) shape=\S+ covered=(\d+) size=(\d+)", out)
    assert {int(d) for d, *_ in scans} == {16, 32, 64, 128}
    for d, axis, covered, size in scans:
        assert int(covered) <= int(size), (d, axis, covered, size)
