"""The decode kernel compiled ahead of time for sm_90 (no GPU needed): its prefix sums never run
over a layout that replicates the summed axis.

Triton 3.6 sums replicated rows of a ``tl.cumsum`` as if they were further rows; on the H200 that
gave wrong attention outputs for head dim 16 with 4 warps (2026-11-30). ``kernel_warps`` caps the
warps so the group-count tiles are not replicated; this test reads the compiled layouts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_scans_are_not_replicated():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="0")
    here = Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, str(here / "_layout_check.py"), "16,2", "32,2", "64,3", "128,7"],
                       env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0 and "GPUTarget" not in r.stderr and "ptxas" in r.stderr:
        pytest.skip("no sm_90 compiler tools in this triton build")
    assert r.returncode == 0, r.stderr[-2000:]
    scans = re.findall(r"SCAN d=(\d+) axis=(\d) shape=\S+ covered=(\d+) size=(\d+)", r.stdout)
    assert {int(d) for d, *_ in scans} == {16, 32, 64, 128}
    for d, axis, covered, size in scans:
        assert int(covered) <= int(size), (d, axis, covered, size)
