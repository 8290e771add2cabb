"""The Gluon decode-attention kernel (glyd.kv._gluon) against the bf16 reference, on fresh pages.

Same tolerance as test_kv_attention (||out - ref|| / ||ref|| <= 1e-2 against SDPA in fp32 on the
unpacked, bit-exact keys and values). Gluon has no interpreter: these run on a CUDA GPU only,
except the shape checks, which raise before any launch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glyd.errors import FormatError
from glyd.kv import PageStore, decode_attention_reference, decode_attention_torch

from .test_kv_attention import TOL, make, rel_err

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_shape_errors_before_launch():
    pytest.importorskip("triton.experimental.gluon")
    from glyd.kv._gluon import decode_attention_gluon

    gen = torch.Generator().manual_seed(0)
    q, ks, vs, _, _ = make(gen, 1, 1, 2, 64, 64, [70])
    with pytest.raises(FormatError, match="head dims 128"):
        decode_attention_gluon(q, ks, vs, torch.tensor([70]))
    q, ks, vs, _, _ = make(gen, 1, 1, 17, 128, 64, [70])
    with pytest.raises(FormatError, match="at most 16 query heads"):
        decode_attention_gluon(q, ks, vs, torch.tensor([70]))
    q, ks, vs, _, _ = make(gen, 1, 1, 2, 128, 32, [70])
    with pytest.raises(FormatError, match="page 64"):
        decode_attention_gluon(q, ks, vs, torch.tensor([70]))
    q, ks, vs, _, _ = make(gen, 1, 1, 2, 128, 64, [70])
    with pytest.raises(ValueError, match="compute capability 9.0"):
        decode_attention_gluon(q, ks, vs, torch.tensor([70]), prefetch=True)


def test_default_programs_per_sm():
    # 8 programs an SM from 2,048 to 4,096 pages (sequences x KV heads x pages), 32 elsewhere (runs 118-119)
    pytest.importorskip("triton.experimental.gluon")
    from glyd.kv._gluon import default_programs_per_sm

    assert [default_programs_per_sm(n) for n in (1, 1024, 1025, 2048, 4096, 4097, 65536)] == [32, 32, 8, 8, 8, 32, 32]


def wide_exponents(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Some values scaled far off their channel (raw tier-4 exponents, up to whole groups of them) and
    some zeroed: the decode's rare paths."""
    f = torch.rand(x.shape, generator=gen)
    far = torch.where(f < 0.02, 2.0 ** 40, torch.where(f < 0.04, 2.0 ** -40, 1.0))
    x = x.float() * far
    x[..., 5, :] *= 2.0 ** 30  # a whole token row of raw exponents
    x[..., 7:9, 16:32] = 0  # whole zero groups
    return x.to(torch.bfloat16)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("b,g,wide", [(1, 7, False), (5, 4, False), (3, 1, True), (4, 8, True), (2, 12, False),
                                      (3, 16, True)])
def test_gluon_kernel_on_gpu(b, g, wide):
    from glyd.kv._gluon import decode_attention_gluon

    gen = torch.Generator().manual_seed(b * 100 + g)
    h, d, p = 2, 128, 64
    lens = torch.randint(1, 700, (b,), generator=gen).tolist()
    lens[0] = 64 * 5  # one sequence ends exactly on a page boundary
    if b > 2:
        lens[1] = 40  # one inside its first page
    q, _, _, k, v = make(gen, b, h, g, d, p, lens)
    if wide:
        k, v = wide_exponents(k, gen), wide_exponents(v, gen)
    lens_t = torch.tensor(lens, device="cuda")
    q = q.cuda()
    ks, vs = PageStore.from_bf16(k.cuda(), lens_t, page=p), PageStore.from_bf16(v.cuda(), lens_t, page=p)
    ref = decode_attention_reference(q, ks, vs, upcast=True)
    for splits in (None, 1, 3):
        out = decode_attention_gluon(q, ks, vs, lens_t, num_splits=splits)
        assert torch.isfinite(out.float()).all()
        assert rel_err(out, ref) <= TOL, splits
    starts = (lens_t // 3).clamp_max(lens_t - 1)
    ref_s = decode_attention_reference(q, ks, vs, upcast=True, starts=starts)
    assert rel_err(decode_attention_gluon(q, ks, vs, lens_t, starts=starts), ref_s) <= TOL
    assert rel_err(decode_attention_torch(q, ks, vs, starts=starts), ref_s) <= TOL


def test_compiled_for_sm90_keeps_the_decoded_tiles_in_registers():
    # Compiled ahead of time for sm_90 (no GPU needed), as the launcher compiles it: the decoded keys and
    # values go to the tensor cores as register operands (no shared-memory round trip a value, as the
    # Triton kernel's tiles take) and the loop has no barrier. Shared memory carries only the softmax
    # probabilities' layout change (a few stores a chunk).
    pytest.importorskip("triton.experimental.gluon")
    env = dict(os.environ, TRITON_INTERPRET="0")  # Gluon compiles only outside the interpreter
    r = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "_gluon_check.py")], env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0 and "ptxas" in r.stderr:
        pytest.skip("no sm_90 compiler tools in this triton build")
    assert r.returncode == 0, r.stderr[-2000:]
    counts = dict(re.findall(r"(\w+)=(\d+)", r.stdout))
    assert int(counts["barriers"]) == 0
    assert int(counts["mma"]) >= 8
    assert 0 < int(counts["shared_stores"]) <= 8, "decoded tiles must not go through shared memory"


@pytest.mark.gpu
@gpu
def test_kernels_drop_masked_positions_inside_the_sequence_on_gpu():
    # the Gluon kernel reads the mask's row only on a GPU (no interpreter); the two Triton kernels with it, at
    # the shapes they run there: masked positions anywhere (a second prompt's left padding, scattered holes)
    from glyd.kv._gluon import decode_attention_gluon
    from glyd.kv._triton import decode_attention_triton
    from glyd.kv.attention import decode_attention
    from glyd.kv.fixed import FixedPageStore

    gen = torch.Generator().manual_seed(5)
    lens = [700, 64 * 5, 333]
    q, ks, vs, k, v = make(gen, 3, 4, 7, 128, 64, lens, device="cuda")
    valid = torch.rand(3, 800, generator=gen) > 0.3
    valid[1, 10:200] = False  # a long run of padding after attended positions, over whole pages
    for i, n in enumerate(lens):
        valid[i, n - 1] = True  # the step's own token
    valid = valid.cuda()
    lens_t = torch.tensor(lens, device="cuda")
    ref = decode_attention_reference(q, ks, vs, upcast=True, valid=valid)
    assert rel_err(decode_attention_reference(q, ks, vs, upcast=True), ref) > 10 * TOL  # the holes matter
    assert rel_err(decode_attention_gluon(q, ks, vs, lens_t, valid=valid), ref) <= TOL
    assert rel_err(decode_attention_gluon(q, ks, vs, lens_t, valid=valid.to(torch.uint8)[:, :500]),
                   decode_attention_reference(q, ks, vs, upcast=True, valid=valid[:, :500])) <= TOL
    assert rel_err(decode_attention_triton(q, ks, vs, lens_t, valid=valid), ref) <= TOL
    assert rel_err(decode_attention_torch(q, ks, vs, valid=valid), ref) <= TOL
    lens_c = torch.tensor(lens)
    fk = FixedPageStore.from_bf16(k.cuda(), lens_c.cuda(), page=64)
    fv = FixedPageStore.from_bf16(v.cuda(), lens_c.cuda(), page=64)
    assert rel_err(decode_attention(q, fk, fv, backend="triton", valid=valid), ref) <= TOL
