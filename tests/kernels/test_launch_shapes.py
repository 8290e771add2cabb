"""A direct ``Kernel.launch`` of a fixed12 or tiered weight kernel refuses an x whose K is not the matrix's.

``glyd.kernels.linear`` checked x's shape; the launchers (the registry's public ``launch``) did not, and ran a
product over the wrong columns (an x longer than K: its tail ignored; shorter: reads past it). dense11's
launchers had the check (``test_dense11_v2_kernels.py``); these are the other layouts' weight kernels.
"""

from __future__ import annotations

import pytest
import torch

import glyd
from glyd.kernels import registry as R

WEIGHT_KERNELS = [k for k in R.KERNELS if R.kernel_class(k).layout in ("fixed12", "tiered") and "experts" not in k]


def test_every_weight_kernel_of_the_two_layouts_is_covered():
    assert len(WEIGHT_KERNELS) == 10, WEIGHT_KERNELS  # a new family joins this test (or says why not)


@pytest.mark.parametrize("kx, m", [(32, 1), (128, 3), (0, 1), (64, 0)], ids=["x-K-short", "x-K-long", "x-K0", "M0"])
@pytest.mark.parametrize("key", WEIGHT_KERNELS)
def test_a_direct_launch_with_the_wrong_x_is_named(key, kx, m):
    kernel = R.kernel_class(key)
    w = (torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    p = glyd.pack(w, kernel.layout)
    out = torch.full((max(m, 1), 8), 7.0, dtype=torch.bfloat16)
    why = r"M = 0 is no x rows" if m == 0 else r"x must be \[M, 64\]"
    with pytest.raises(ValueError, match=rf"^{key} launch: x has shape \({m}, {kx}\).*{why}"):
        kernel.launch(torch.ones(m, kx, dtype=torch.bfloat16), p, None, None, out)
    assert bool((out == 7.0).all())  # refused before anything ran: nothing written
