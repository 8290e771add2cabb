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


def _launch(key, x, out, w=None):
    kernel = R.kernel_class(key)
    w = (torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16) if w is None else w
    return kernel.launch(x, glyd.pack(w, kernel.layout), None, kernel.Config(), out)


@pytest.mark.parametrize("case", ["fp32", "fp16", "strided"])
@pytest.mark.parametrize("key", WEIGHT_KERNELS)
def test_a_direct_launch_with_an_x_the_kernels_cannot_read_is_named(key, case):
    # the kernels read x as bf16 with unit stride along K (linear makes it so; dense11's launchers refuse others):
    # a column-strided x gave a product over the wrong values (0.5 off at 0.02-scale weights), and fixed12_gemv
    # read an fp16 or fp32 x of K 1024 as bf16 pairs (22.2 and 1.8 off)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    x = {"fp32": x[:, :64].float(), "fp16": x[:, :64].half(), "strided": x[:, ::2]}[case]
    out = torch.full((3, 8), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^{key} launch: x must be bf16 with unit stride along K, got "):
        _launch(key, x, out)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("case", ["rows", "cols", "fp32", "transposed"])
@pytest.mark.parametrize("key", WEIGHT_KERNELS + ["dense11_v2_gemv", "dense11_v3_gemv"])
def test_a_direct_launch_into_an_out_the_kernels_cannot_write_is_named(key, case):
    # the kernels store a contiguous bf16 [M, N]: an out of fewer rows or columns was written past its end (a
    # crash of the allocator under the interpreter), a transposed one got the product in the wrong places
    bf = torch.bfloat16
    out = {"rows": torch.zeros(2, 8, dtype=bf), "cols": torch.zeros(3, 4, dtype=bf), "fp32": torch.zeros(3, 8),
           "transposed": torch.zeros(8, 3, dtype=bf).T}[case]
    before = out.clone()
    w = (torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    if key.startswith("dense11"):
        from glyd.codec.dense11 import pack_v2, pack_v3

        kernel = R.kernel_class(key)
        p = (pack_v3 if key == "dense11_v3_gemv" else pack_v2)(w)
    x = torch.ones(3, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^{key} launch: out must be a contiguous bf16 \[3, 8\] on cpu, got "):
        if key.startswith("dense11"):
            kernel.launch(x, p, None, kernel.Config(), out)
        else:
            _launch(key, x, out, w)
    assert torch.equal(out, before)


@pytest.mark.parametrize("case", ["short", "strided", "int32", "2-D"])
@pytest.mark.parametrize("key", WEIGHT_KERNELS + ["dense11_v2_gemv", "dense11_v3_gemv", "dense11_unpack_cublas"])
def test_a_direct_launch_with_a_bias_the_kernels_cannot_read_is_named(key, case):
    # the kernels read bias[n] for n < N as floats: a column-strided bias gave fixed12_gemv a product 1.4 off under
    # the interpreter, a short one was read past its end (linear's check_bias makes any bias fit: direct launches)
    whole = torch.randn(16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    bias = {"short": whole[:4], "strided": whole[::2], "int32": whole[:8].to(torch.int32), "2-D": whole[None, :8]}[case]
    w = (torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    kernel = R.kernel_class(key)
    if key.startswith("dense11"):
        from glyd.codec.dense11 import pack_v2, pack_v3

        p = pack_v2(w) if key == "dense11_v2_gemv" else pack_v3(w)
    else:
        p = glyd.pack(w, kernel.layout)
    out = torch.full((3, 8), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^{key} launch: bias must be a contiguous floating \[8\] on cpu, got "):
        kernel.launch(torch.ones(3, 64, dtype=torch.bfloat16), p, bias, kernel.Config(), out)
    assert bool((out == 7.0).all())
